// The buffer half of CheckProtocol: with broadcast_buffers, DDP copies rank 0's buffers into every rank at the
// start of each forward through it, so the buffers a step's first forward starts from (the recorder's
// forward_buffers, taken inside DDP's forward after that copy) are bitwise rank 0's buffers as rec.step() recorded
// them at the end of the step before, unless the loop changed them in between. Checked for normalisation statistics
// only (running_mean, running_var, num_batches_tracked: torch changes them in a training forward and nowhere else),
// where the recorder says no forward of the module ran in between (forward_buffers_first) and the loop changed no
// parameter either (a checkpoint loaded: ProtocolStep::edited_before). A rank r > 0's buffers after a step are its
// own and overwritten by the next broadcast: nothing to check; every rank's forward buffers against rank 0's are
// the rank-invariant comparison's.
#include <cstring>

#include <fmt/format.h>

#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"

namespace ddpcheck::core {
namespace {

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

}  // namespace

bool IsNormStatistic(const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  return last == "running_mean" || last == "running_var" || last == "num_batches_tracked";
}

void CheckBufferBroadcast(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  if (!r.ddp_wrapped || !r.ddp.broadcast_buffers || r.ranks.empty() || r.ranks[0].rank != 0) return;
  const ProtocolRank& rank0 = r.ranks[0];
  bool any = false;
  for (size_t s = 1; s < rank0.steps.size(); ++s) {
    const ProtocolStep& st = rank0.steps[s];
    const ProtocolStep& prev = rank0.steps[s - 1];
    if (!st.forward_buffers_first || st.after_gap || !st.edited_before.empty() || prev.buffers.empty()) continue;
    for (const auto& [name, fwd] : st.forward_buffers) {
      const auto before = prev.buffers.find(name);
      if (before == prev.buffers.end() || before->second.data.size() != fwd.data.size()) {
        continue;
      }
      any = true;
      Account(out, Checkpoint::kForwardBuffers);
      for (size_t i = 0; i < fwd.data.size(); ++i) {
        if (SameBits(fwd.data[i], before->second.data[i])) continue;
        Mismatch m;
        m.key = {st.step, Checkpoint::kForwardBuffers, name, rank0.rank};
        m.kind = "reference-divergent";
        m.against = fmt::format("rank 0's {} after step {}", name, prev.step);
        m.index = static_cast<int64_t>(i);
        m.got = fwd.data[i];
        m.want = before->second.data[i];
        m.abs_err = std::abs(m.got - m.want);
        m.rel_err = m.abs_err / std::max(std::abs(m.want), 1e-300);
        m.elements = static_cast<int64_t>(fwd.data.size());
        for (size_t j = i; j < fwd.data.size(); ++j) m.bad_elements += !SameBits(fwd.data[j], before->second.data[j]);
        m.message = fmt::format(
            "step {}'s forward started from a {} that is not rank 0's after step {} (DDP broadcasts rank 0's buffers "
            "at every forward, and no forward of the module ran in between): the loop changed the normalisation "
            "statistics between the steps (set, reset or loaded by hand, or a submodule run on its own)",
            st.step, name, prev.step);
        f->push_back({m, "", m.message, 3});
        break;
      }
    }
  }
  if (any) {
    out->checked.push_back("each step's forward buffers (normalisation statistics) bitwise rank 0's after the step "
                           "before (broadcast_buffers)");
  }
}

}  // namespace ddpcheck::core
