// gpu_ddp_step_bench: wall time of DDP training steps on the GPU world (NCCL, one GPU per rank, nothing
// recorded), for an MLP of --width (default 4096) with --layers linear+relu blocks and a per-rank batch of
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
  int world = real::DeviceCount(), layers = 4;
  int64_t width = 4096, batch = 256, steps = 20;
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
  if (real::DeviceCount() == 0) {
    std::fprintf(stderr, "gpu_ddp_step_bench: no CUDA device\n");
    return 2;
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
  s.data.samples = batch * world * steps;
  s.epochs = 1;
  s.steps = steps;
  s.faults.clear();
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 2;
  }
  real::RealOptions ro = harness::WithReferenceSetup(real::RealOptions{});
  ro.record = false;
  ro.tf32 = math == "tf32";
  core::Trace trace;
  const auto t0 = std::chrono::steady_clock::now();
  st = real::RunReal(s, ro, &trace);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("# ddpcheck gpu_ddp_step_bench: %s\n", real::ProvenanceLine(real::GetProvenance()).c_str());
  std::printf("W=%d layers=%d width=%lld batch/rank=%lld amp=%s math=%s steps=%lld: %.2f ms/step (incl. setup)\n",
              world, layers, static_cast<long long>(width), static_cast<long long>(batch),
              amp.empty() ? "off" : amp.c_str(), math.c_str(), static_cast<long long>(steps), ms / steps);
  return 0;
}
