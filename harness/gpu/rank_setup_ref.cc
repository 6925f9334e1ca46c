#include "harness/gpu/rank_setup_ref.h"

#include <memory>
#include <random>

#include "core/faults.h"
#include "reference/model.h"
#include "reference/model_spec.h"
#include "reference/rank_model.h"

namespace ddpcheck::harness {

namespace {
template <typename T>
core::Status Fill(const core::Scenario& rs, int rank, real::RankSetup* out) {
  ref::Model<T> m;
  DDPCHECK_RETURN_IF_ERROR(ref::BuildRankModel(rs, rank, &m));
  for (int i = 0; i < m.num_params(); ++i) {
    const core::ParamInfo& info = m.param_info(i);
    const T* p = m.param_data(i);
    out->initial[info.name] = core::Tensor(info.dtype, info.shape, std::vector<double>(p, p + info.numel()));
  }
  for (int i = 0; i < m.num_buffers(); ++i) {
    const core::ParamInfo& info = m.buffer_info(i);
    const T* p = m.buffer_data(i);
    out->initial[info.name] = core::Tensor(info.dtype, info.shape, std::vector<double>(p, p + info.numel()));
  }
  // The rank's own bypasses (unused on this rank); a layer used only in one micro-step of a no_sync window
  // (only_micro_step) is bypassed per forward by the replica, which reads the batch's micro_step.
  out->bypassed.assign(static_cast<size_t>(m.num_layers()), false);
  for (int l = 0; l < m.num_layers(); ++l) {
    out->bypassed[static_cast<size_t>(l)] = ref::LayerBypassedOnRank(rs.model[static_cast<size_t>(l)], rank);
  }
  return core::Status::Ok();
}
}  // namespace

core::Status ReferenceRankSetup(const core::Scenario& s, int rank, real::RankSetup* out) {
  core::Scenario rs;
  DDPCHECK_RETURN_IF_ERROR(core::ScenarioForRank(s, rank, &rs));
  real::RankSetup setup;
  setup.layers = rs.model;
  setup.loss = rs.loss;
  if (rs.precision == core::DType::kFloat32) {
    DDPCHECK_RETURN_IF_ERROR(Fill<float>(rs, rank, &setup));
  } else {
    DDPCHECK_RETURN_IF_ERROR(Fill<double>(rs, rank, &setup));
  }
  const int dropout_rank = core::SameDropoutSeed(rs) ? 0 : rank;
  auto rng = std::make_shared<std::mt19937_64>(ref::DropoutSeed(dropout_rank));
  setup.dropout_uniform = [rng] { return ref::PortableUniform(*rng); };
  *out = std::move(setup);
  return core::Status::Ok();
}

real::RealOptions WithReferenceSetup(real::RealOptions opts) {
  opts.setup = ReferenceRankSetup;
  return opts;
}

}  // namespace ddpcheck::harness
