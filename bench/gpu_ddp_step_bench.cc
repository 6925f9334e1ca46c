// gpu_ddp_step_bench: wall time of DDP training steps on the GPU world (NCCL, one GPU per rank, nothing
// recorded), for an MLP of --width (default 2048) with --layers (default 3) linear+relu blocks and a per-rank batch of
// --batch, fp32 or --amp bf16/fp16. Prints ms per step; docs/gpu.md has the PyTorch DDP script that times the
// same model side by side. Exit 2 without a GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/scenario.h"
#include "core/train_loop.h"
#include "harness/gpu/rank_setup_ref.h"
#include "real/device.h"
#include "real/world.h"

using namespace ddpcheck;

int main(int argc, char** argv) {
  int world = real::DeviceCount(), layers = 3;  // 12.6M parameters: within ddpcheck's 16M
  int64_t width = 2048, batch = 256, steps = 20;
  std::string amp, math = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--world") world = std::atoi(argv[i + 1]);
    if (a == "--layers") layers = std::atoi(argv[i + 1]);
    if (a == "--width") width = std::atoll(argv[i + 1]);
    if (a == "--batch") batch = std::atoll(argv[i + 1]);
    if (a == "--steps") steps = std::atoll(argv[i + 1]);
    if (a == "--amp") amp = argv[i + 1];
    if (a == "--math") math = argv[i + 1];
  }
  core::Scenario s = core::DefaultScenario();
  s.model.clear();
  for (int l = 0; l < layers; ++l) {
    core::LayerSpec lin;
    lin.type = "linear";
    lin.in_features = width;
    lin.out_features = width;
    s.model.push_back(lin);
    core::LayerSpec relu;
    relu.type = "relu";
    s.model.push_back(relu);
  }
  s.loss = "mse";
  s.world = world;
  s.batch_size = batch;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = !amp.empty();
  if (!amp.empty()) s.amp.dtype = amp;
  s.data = core::DataSpec();
  // Four batches per rank an epoch, as many epochs as the steps need (within ddpcheck's data limit of 32M values).
  s.data.samples = batch * world * 4;
  s.data.in_features = s.data.out_features = width;  // (a file's 0 is resolved by the loader, not here)
  s.epochs = (steps + 7) / 4;
  s.steps = steps + 4;
  s.faults.clear();
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 2;
  }
  if (real::DeviceCount() == 0) {  // (after the scenario's checks: a bad flag is reported on any machine)
    std::fprintf(stderr, "gpu_ddp_step_bench: no CUDA device\n");
    return 2;
  }
  real::RealOptions ro = harness::WithReferenceSetup(real::RealOptions{});
  ro.record = false;
  ro.tf32 = math == "tf32";
  // A run pays its setup (the reference's initial values, the replicas, NCCL's communicator) once, and the first
  // run of a process also CUDA's context and cuBLAS's handles, which vary by half a second on an H100 (20 steps:
  // 78 ms/step, 120 steps: 9.6 ms/step "incl. setup" there): a first run of 4 steps is discarded, then runs of
  // 4 and 4 + steps steps are timed, and their difference over `steps` is the step's marginal time.
  auto timed = [&](int64_t n, double* ms) {
    core::Scenario r = s;
    r.steps = n;
    r.epochs = (n + 3) / 4;
    core::Trace trace;
    core::Status finding;  // a rank that stopped early (a timeout, a DDP error) would time fewer steps
    const auto t0 = std::chrono::steady_clock::now();
    const core::Status rs = real::RunReal(r, ro, &trace, &finding);
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return rs.ok() ? finding : rs;
  };
  double first = 0, base = 0, full = 0;
  for (auto [n, ms] : {std::pair<int64_t, double*>{4, &first}, {4, &base}, {4 + steps, &full}}) {
    st = timed(n, ms);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::printf("# ddpcheck gpu_ddp_step_bench: %s\n", real::ProvenanceLine(real::GetProvenance()).c_str());
  std::printf("W=%d layers=%d width=%lld batch/rank=%lld amp=%s math=%s: %.3f ms/step (marginal over %lld steps; "
              "setup %.0f ms, the process's first run %.0f ms for 4 steps)\n",
              world, layers, static_cast<long long>(width), static_cast<long long>(batch),
              amp.empty() ? "off" : amp.c_str(), math.c_str(), (full - base) / static_cast<double>(steps),
              static_cast<long long>(steps), base - 4 * (full - base) / static_cast<double>(steps), first);
  return 0;
}
