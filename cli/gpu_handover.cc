#include "cli/gpu_handover.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "harness/gpu.h"

namespace ddpcheck::cli {

namespace {

bool WantsGpu(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string cmd = argv[1];
  if (cmd == "gpu-run" || cmd == "gpu-report") return true;
  if (cmd != "run") return false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string next = i + 1 < argc ? argv[i + 1] : "";
    if ((a == "--backend" && (next == "real" || next == "hybrid")) || a == "--backend=real" || a == "--backend=hybrid") {
      return true;
    }
  }
  return false;
}

}  // namespace

void HandOverGpuCommands(int argc, char** argv) {
  if (harness::GpuWorldBuilt() || !WantsGpu(argc, argv)) return;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return;
  const std::filesystem::path gpu = self.parent_path() / "ddpcheck-gpu";
  if (!std::filesystem::exists(gpu, ec)) return;
  const std::string path = gpu.string();
  argv[0] = const_cast<char*>(path.c_str());
  execv(path.c_str(), argv);  // returns only on failure: then this binary says it has no GPU world
}

}  // namespace ddpcheck::cli
