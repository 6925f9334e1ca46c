// CheckProtocol's ProtocolResult::reference_missing: set where no step of any rank had the recorder's float64
// single-process reference, saying why (it raised at every step: the user's module or loss did not run in float64;
// or it could not be formed), so that a PASS says in its one line that the gradients were held to nothing but each
// other (harness/compose.cc); empty where some step had a reference.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/dump_protocol.h"

namespace ddpcheck::core {
namespace {

Tensor F64(std::vector<double> v) { return Tensor(DType::kFloat64, {static_cast<int64_t>(v.size())}, std::move(v)); }

// Two ranks, two steps, agreeing gradients; note(rank, step) is that step's ref_note ("" gives it a reference).
ProtocolRecords World(const std::function<std::string(int, int)>& note) {
  ProtocolStep agreed;
  agreed.buckets_recorded = true;
  agreed.buckets = {{0, {0}, F64({1, 2, 3}), F64({1, 2, 3})}};
  agreed.grads["w"] = F64({1, 2, 3});
  ProtocolRecords r;
  r.world = 2;
  r.dtype = DType::kFloat64;
  r.params = {{"w", 3, DType::kFloat64, true}};
  r.ranks.resize(2);
  for (int k = 0; k < 2; ++k) {
    r.ranks[k].rank = k;
    r.ranks[k].steps.assign(2, agreed);
    for (int s = 0; s < 2; ++s) {
      ProtocolStep& st = r.ranks[k].steps[s];
      st.step = s;
      st.ref_note = note(k, s);
      if (st.ref_note.empty()) {
        st.ref_grads["w"] = F64({1, 2, 3});
        st.ref_rows = 4;
      }
    }
  }
  return r;
}

const std::string kFailed = std::string(kReferenceFailedNote) + ": RuntimeError: Found dtype Double but expected Float";

TEST(ReferenceFailed, AReferenceThatRaisedAtEveryStepIsSaidWithItsError) {
  const ProtocolResult res = CheckProtocol(World([](int, int) { return kFailed; }));
  EXPECT_TRUE(res.result.mismatches.empty());
  EXPECT_EQ(res.reference_missing,
            "the single-process reference failed at every step: RuntimeError: Found dtype Double but expected Float");
}

TEST(ReferenceFailed, OneStepWithAReferenceIsEnoughAndAnotherReasonIsSaid) {
  EXPECT_EQ(CheckProtocol(World([](int k, int s) { return k == 1 && s == 1 ? "" : kFailed; })).reference_missing, "");
  EXPECT_EQ(CheckProtocol(World([](int, int) {
              return std::string("1 forwards but 0 targets: pass the loss module you call as loss_fn=, or yb");
            })).reference_missing,
            "no single-process reference at any step: 1 forwards but 0 targets: pass the loss module you call as "
            "loss_fn=, or yb");
  EXPECT_EQ(CheckProtocol(World([](int, int) { return std::string("no single-process reference: LBFGS"); }))
                .reference_missing,
            "no single-process reference at any step: LBFGS");
  EXPECT_EQ(CheckProtocol(World([](int, int) { return std::string(); })).reference_missing, "");
}

// reference='auto' leaves a step to ddpcheck's replay; where the replay did not run, the note says so instead of
// repeating the recorder's expectation that it would (QA round 14: 'replay: skipped' beside 'the run is replayed').
TEST(ReferenceFailed, AStepLeftToAReplayThatDidNotRunSaysSo) {
  const std::string auto_note = std::string(kAutoReferenceNote) + ": ddpcheck's own float64 replay is its reference";
  ProtocolRecords r = World([&](int, int) { return auto_note; });
  r.replayed = false;
  const ProtocolResult res = CheckProtocol(r);
  std::string skipped;
  for (const auto& s : res.skipped) skipped += s + "\n";
  EXPECT_NE(skipped.find("left it to ddpcheck's replay, which did not run"), std::string::npos) << skipped;
  EXPECT_EQ(skipped.find("the run is replayed"), std::string::npos) << skipped;
  EXPECT_EQ(res.reference_missing, "no single-process reference at any step: reference='auto' left it to "
                                   "ddpcheck's replay, which did not run (see 'replay:')");
}

}  // namespace
}  // namespace ddpcheck::core
