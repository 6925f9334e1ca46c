// The CPU world keeps each grad in its DDP bucket slot (core/reducer.h, Replica::ShareGradStorage): two copies
// fewer per step, an implementation detail that must not change one bit. Every shipped scenario (the default
// ones and the 22 BUGS.md fault scenarios with their faults injected: a dropped bucket, a parameter unused on
// one rank, an unfinished reduction, no_sync accumulation, AMP with clipping...) and variants of them
// (gradient_as_bucket_view, find_unused_parameters, W = 1) run with the grads shared and with every grad in its
// own storage: the traces (every recorded value, bitwise) and the events are the same.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/scenario.h"
#include "core/train_loop.h"
#include "core/trace.h"
#include "core/fault_spec.h"
#include "sim/communicator_local.h"
#include "sim/communicator_local_world.h"
#include "sim/replica_cpu.h"
#include "sim/world.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

core::Trace RunWorld(const core::Scenario& s, bool share) {
  sim::SimOptions opts;
  opts.comm = "local";
  opts.share_grad_storage = share;
  opts.timeout = std::chrono::milliseconds(400);  // the hang scenarios' ranks give up soon
  core::Trace trace;
  const core::Status st = sim::RunSim(s, opts, &trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return trace;
}

TEST(SharedGradStorage, EveryScenarioRecordsTheSameBitsWithTheGradsInTheirBuckets) {
  size_t runs = 0;
  for (const std::string& path : testing::ShippedScenarioPaths()) {
    core::Scenario base;
    ASSERT_TRUE(core::LoadScenario(path, &base).ok()) << path;
    ASSERT_TRUE(core::MaterializeData(&base).ok()) << path;
    base.steps = std::min<int64_t>(base.steps < 0 ? 6 : base.steps, 6);  // past the bucket rebuild (step 1)
    std::vector<std::pair<std::string, core::Scenario>> variants{{"as shipped", base}};
    core::Scenario view = base;
    view.ddp.gradient_as_bucket_view = !base.ddp.gradient_as_bucket_view;
    variants.emplace_back("gradient_as_bucket_view flipped", view);
    core::Scenario unused = base;
    unused.ddp.find_unused_parameters = !base.ddp.find_unused_parameters;
    variants.emplace_back("find_unused_parameters flipped", unused);
    if (base.world > 1 && base.faults.empty()) {
      core::Scenario one = base;
      one.world = 1;
      variants.emplace_back("W = 1", one);
    }
    for (const auto& [name, s] : variants) {
      const std::string what = std::filesystem::path(path).filename().string() + ", " + name;
      testing::ExpectSameTraces(RunWorld(s, true), RunWorld(s, false), what);
      ++runs;
    }
  }
  EXPECT_GE(runs, 80u);
}

// Every rank's parameters after its run over the in-memory world, recording into `trace` (or nothing).
std::vector<std::vector<double>> FinalParams(const core::Scenario& s, core::Trace* trace) {
  auto world = sim::LocalWorld::Create(s.world);
  std::vector<std::unique_ptr<core::Replica>> replicas(static_cast<size_t>(s.world));
  for (int r = 0; r < s.world; ++r) EXPECT_TRUE(sim::MakeCpuReplica(s, r, &replicas[static_cast<size_t>(r)]).ok());
  testing::SpawnRanks(s.world, [&](int r) {
    sim::LocalCommunicator comm(world, r, std::chrono::milliseconds(5000));
    core::RankRunOptions opts;
    opts.trace = trace;
    const core::Status st = core::RunRank(s, r, replicas[static_cast<size_t>(r)].get(), &comm, opts);
    EXPECT_TRUE(st.ok()) << st.message();
  });
  std::vector<std::vector<double>> out;
  for (const auto& replica : replicas) {
    for (int i = 0; i < static_cast<int>(replica->ParamInfos().size()); ++i) {
      const core::Span p = replica->Param(i);
      out.push_back(replica->Memory().ToHost(p, {p.numel}).data);
    }
  }
  return out;
}

// A grad zeroed lazily (ref::Param::ZeroLazily) and left unwritten by a backward (a parameter used at step 0 and
// unused from step 1, find_unused_parameters=True) has its zeros written before its bucket reads the slot, also
// in a run that records nothing (the benchmarks), where no recorder reads the grad first: the final parameters
// are those of a recorded run, bit for bit.
TEST(SharedGradStorage, AnUnwrittenLazilyZeroedGradIsAllReducedAsZerosWithOrWithoutRecording) {
  core::Scenario s;
  ASSERT_TRUE(core::LoadScenario(std::string(testing::SourceDir()) + "/scenarios/faults/unused-param.json", &s).ok());
  core::FaultSpec fault;
  ASSERT_TRUE(core::ParseFaultSpec("unused-param:1", &fault).ok());
  s.faults = {fault};
  s.ddp.find_unused_parameters = true;
  for (core::DType precision : {core::DType::kFloat64, core::DType::kFloat32}) {
    s.precision = precision;
    ASSERT_TRUE(core::ValidateScenario(s).ok());
    ASSERT_TRUE(core::MaterializeData(&s).ok());
    core::Trace trace;
    const auto recorded = FinalParams(s, &trace);
    const auto unrecorded = FinalParams(s, nullptr);
    ASSERT_EQ(recorded.size(), unrecorded.size());
    for (size_t i = 0; i < recorded.size(); ++i) {
      EXPECT_TRUE(recorded[i] == unrecorded[i]) << "parameter " << i << " (rank-major) differs, " << core::DTypeName(precision);
    }
  }
}

}  // namespace
}  // namespace ddpcheck
