// harness/gpu.h over real/: the GPU world, each rank's reference setup (initial values, dropout stream) and,
// for hybrid runs, the CPU world's Gloo collectives.
#include <filesystem>
#include <memory>

#include <gloo/rendezvous/file_store.h>

#include "harness/gpu.h"
#include "harness/gpu/hybrid_gloo.h"
#include "harness/gpu/rank_setup_ref.h"
#include "real/device.h"
#include "real/world.h"

namespace ddpcheck::harness {

namespace {

real::RealOptions OptionsFor(const GpuWorldOptions& o, int world) {
  real::RealOptions ro;
  ro.tf32 = o.tf32;
  if (o.timeout.count() > 0) ro.timeout = o.timeout;
  ro.run_id = o.run_id;
  ro = WithReferenceSetup(ro);
  if (o.hybrid) ro = WithGlooHybrid(ro, world);
  return ro;
}

}  // namespace

bool GpuWorldBuilt() { return true; }

std::string GpuProvenanceLine() { return real::ProvenanceLine(real::GetProvenance()); }

core::TolerancePolicy GpuPolicy(const core::Scenario& s, bool tf32) {
  core::TolerancePolicy p = core::PolicyFor(s);
  real::MathMode math;
  if (!real::MathModeFor(s, tf32, &math).ok()) return p;
  p.precision = real::MathModeRoundoffType(math);
  if (math != real::MathMode::kFp32 && math != real::MathMode::kFp64) p.exact = false;
  return p;
}

core::Status RunGpuWorld(const core::Scenario& s, const GpuWorldOptions& opts, core::Trace* out, std::string* name,
                         nlohmann::json* provenance) {
  const std::string backend = opts.hybrid ? "hybrid" : "real";
  DDPCHECK_RETURN_IF_ERROR(real::CheckModelRunsOnGpu(s));
  if (real::DeviceCount() == 0) {
    return core::Status::Invalid("--backend " + backend + ": no CUDA device on this machine (" +
                                 GpuProvenanceLine() + "). The GPU world needs a GPU; the CPU world runs with "
                                 "--backend sim");
  }
  real::MathMode math;
  DDPCHECK_RETURN_IF_ERROR(real::MathModeFor(s, opts.tf32, &math));
  core::Status finding;  // also recorded as the trace's events
  DDPCHECK_RETURN_IF_ERROR(real::RunReal(s, OptionsFor(opts, s.world), out, &finding));
  *name = opts.hybrid ? "hybrid (cuda + gloo, " + real::MathModeName(math) + ")"
                      : "real (nccl, " + real::MathModeName(math) + ")";
  (*provenance)["backend"] = out->meta.value("backend", backend);
  (*provenance)["math"] = real::MathModeName(math);
  (*provenance)["gpu"] = real::ProvenanceJson(real::GetProvenance());
  return core::Status::Ok();
}

core::Status RunGpuRank(const core::Scenario& s, const GpuWorldOptions& opts, int rank, const std::string& store_dir,
                        core::Trace* out) {
  DDPCHECK_RETURN_IF_ERROR(real::RequireDevice());
  if (store_dir.empty()) return core::Status::Invalid("--rank needs --store-dir (a shared folder)");
  std::error_code ec;
  std::filesystem::create_directories(store_dir, ec);
  if (ec) return core::Status::Io("--store-dir " + store_dir + ": " + ec.message());
  auto store = std::make_shared<GlooKvStore>(std::make_shared<gloo::rendezvous::FileStore>(store_dir));
  return real::RunRealRank(s, OptionsFor(opts, s.world), rank, store, out);
}

}  // namespace ddpcheck::harness
