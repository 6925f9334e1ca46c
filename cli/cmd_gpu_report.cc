// `ddpcheck gpu-report [SCENARIO...] [--out DIR]`: the GPU matrix (harness/gpu.h): fp32, tf32,
// fp16-amp, bf16-amp x scenarios x W (up to the GPU count for NCCL, up to 8 for hybrid), errors against the fp64
// reference and the CPU world, determinism, rank consistency, provenance. Writes DIR/gpu_report.{json,md};
// the exit code is the verdict. Without a GPU it says so and exits 2.
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "core/communicator.h"
#include "core/file.h"
#include "harness/gpu.h"

namespace ddpcheck::cli {
namespace {

struct GpuReportArgs {
  std::vector<std::string> scenarios;
  std::string out = "reports/gpu/latest";
  std::vector<std::string> maths = {"fp32", "tf32", "fp16-amp", "bf16-amp"};
  std::vector<std::string> backends = {"real", "hybrid"};
  int max_hybrid_world = 8;
  int64_t timeout_ms = core::kDefaultTimeout.count();
};

int Run(const GpuReportArgs& a) {
  harness::GpuMatrixOptions opts;
  if (a.scenarios.empty()) opts.scenarios.push_back(core::DefaultScenario());
  for (const std::string& path : a.scenarios) {
    core::Scenario s;
    const core::Status st = core::LoadScenario(path, &s);
    if (!st.ok()) return Fail("gpu-report", st);
    opts.scenarios.push_back(std::move(s));
  }
  opts.maths = a.maths;
  opts.backends = a.backends;
  opts.max_hybrid_world = a.max_hybrid_world;
  opts.timeout = std::chrono::milliseconds(a.timeout_ms);
  nlohmann::json json;
  std::string md;
  core::Status st = harness::RunGpuMatrix(opts, &json, &md);
  if (!st.ok()) return Fail("gpu-report", st.Prefixed("no report written (committed GPU reports live in reports/gpu/)"));
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) return Fail("gpu-report", core::Status::Io("--out " + a.out + ": " + ec.message()));
  st = core::WriteStringToFile(a.out + "/gpu_report.json", json.dump(2) + "\n");
  if (st.ok()) st = core::WriteStringToFile(a.out + "/gpu_report.md", md);
  if (!st.ok()) return Fail("gpu-report", st);
  std::cout << md << "\nwritten: " << a.out << "/gpu_report.{json,md}\n";
  return json.value("verdict", "FAILED") == "OK" ? 0 : 1;
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "gpu-report",
      "Precision x scenario x W matrix of the GPU world against the fp64 reference and the CPU world.\n"
      "  example: ddpcheck gpu-report --out reports/gpu/h100-x8\n"
      "  example: ddpcheck gpu-report scenarios/tutorial_toymodel.json --math fp32 --math bf16-amp --backend real");
  auto args = std::make_shared<GpuReportArgs>();
  sub->add_option("scenarios", args->scenarios, "Scenario files (default: the default scenario)");
  sub->add_option("--out", args->out, "Folder for gpu_report.json and gpu_report.md");
  sub->add_option("--math", args->maths, "fp32 | tf32 | fp16-amp | bf16-amp (repeatable)")
      ->check(CLI::IsMember({"fp32", "tf32", "fp16-amp", "bf16-amp"}));
  sub->add_option("--backend", args->backends, "real | hybrid (repeatable)")->check(CLI::IsMember({"real", "hybrid"}));
  sub->add_option("--max-world", args->max_hybrid_world, "Largest W of the hybrid rows")->check(CLI::Range(2, 64));
  sub->add_option("--timeout-ms", args->timeout_ms, "Timeout of every collective, in ms")->check(CLI::Range(int64_t{1}, core::kMaxTimeoutMs));
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("gpu-report", Setup);

}  // namespace
}  // namespace ddpcheck::cli
