#include "core/diagnose.h"

#include <fmt/format.h>

#include "core/faults.h"

namespace ddpcheck::core {

std::optional<Diagnosis> Diagnose(const Scenario& s, const Trace& got, const Trace& reference,
                                  const CompareResult& result) {
  if (result.pass || !result.first) return std::nullopt;
  const Mismatch& m = *result.first;
  Diagnosis d;
  d.kind = m.kind;
  // Evidence-driven patterns first; they do not look at which fault was injected.
  if (m.key.checkpoint == Checkpoint::kReduced && m.ratio != 0.0 && std::abs(m.ratio - s.world) < 1e-6 * s.world &&
      s.world > 1) {
    d.pattern = "loss-times-world";
    d.explanation = fmt::format("reduced gradients are {:.3f}x the reference at every element: loss multiplied by "
                                "world size (or averaged twice)?", m.ratio);
    return d;
  }
  if (m.kind == "hang") {
    d.pattern = "unknown";
    d.explanation = m.message;
    return d;
  }
  d.pattern = "unknown";
  d.explanation = DescribeMismatch(m);
  (void)got;
  (void)reference;
  return d;
}

}  // namespace ddpcheck::core
