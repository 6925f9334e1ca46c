#include "harness/tolerance.h"

#include "harness/gpu.h"

namespace ddpcheck::harness {

core::TolerancePolicy PolicyFor(SourceKind got, const core::Scenario& s, bool tf32) {
  switch (got) {
    case SourceKind::kGpu:
    case SourceKind::kHybrid:
      return GpuPolicy(s, tf32);
    case SourceKind::kTorchDump: {
      // torch's kernels (BLAS blocking, FMA) differ from the reference's, not only the all-reduce order.
      core::TolerancePolicy p = core::PolicyFor(s);
      p.exact = false;
      p.safety = 1024.0;
      return p;
    }
    default:
      return core::PolicyFor(s);
  }
}

core::TolerancePolicy PolicyFromMeta(const core::Trace& got, const core::Trace& want) {
  core::TolerancePolicy policy;
  policy.exact = got.meta.value("exact", false) && want.meta.value("exact", false);
  core::DType precision = core::DType::kFloat64;
  core::ParseDType(want.meta.value("precision", std::string("float64")), &precision);
  policy.precision = precision;
  policy.world = want.meta.value("world", 1);
  policy.reduction_length = want.meta.value("reduction_length", int64_t{1});
  return policy;
}

void StampPolicy(const core::TolerancePolicy& policy, core::Trace* trace) {
  trace->meta["exact"] = policy.exact;
  trace->meta["reduction_length"] = policy.reduction_length;
}

}  // namespace ddpcheck::harness
