// Torch dump index: bytes as DIR/rank0/index.json -> ReadTorchDump (types, sizes, rows_seen, the scenario it
// rebuilds). The seed corpus' .npy names (init.w.npy, x.npy, ...) resolve to small valid files made here.
#include <filesystem>

#include "core/dump.h"
#include "core/npy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  static const std::string dir = [] {
    const std::string d = fuzz::ScratchDir() + "/dump";
    std::filesystem::create_directories(d + "/rank0");
    const auto f64 = [](std::vector<int64_t> shape) {
      return core::Tensor(core::DType::kFloat64, shape, std::vector<double>(core::NumelOf(shape), 0.5));
    };
    core::WriteNpy(d + "/rank0/w.npy", f64({1, 2}));
    core::WriteNpy(d + "/rank0/b.npy", f64({1}));
    core::WriteNpy(d + "/rank0/x.npy", f64({2, 2}));
    core::WriteNpy(d + "/rank0/y.npy", f64({2, 1}));
    core::WriteNpy(d + "/rank0/i.npy", core::Tensor(core::DType::kInt64, {2}, {0, 1}));
    return d;
  }();
  fuzz::WriteBytes(dir + "/rank0/index.json", data, size);
  core::TorchDump dump;
  fuzz::ExpectInputError(core::ReadTorchDump(dir, &dump));
  return 0;
}
