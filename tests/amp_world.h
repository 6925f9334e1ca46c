// Test helpers for AMP runs: a world of rank threads driven directly through core::RunRank (so a test can
// wrap a rank's replica), and a replica wrapper that writes +inf into that rank's local gradient at one
// backward, before DDP's hook sees it (what an fp16 overflow on one rank looks like to the reducer).
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/replica.h"
#include "core/train_loop.h"
#include "sim/communicator_gloo.h"
#include "sim/communicator_local.h"
#include "sim/replica_cpu.h"
#include "sim/store.h"

namespace ddpcheck::testing {

// Forwards everything to `inner`; at backward number `at_backward` (0-based, one per micro-batch) sets the
// first element of the first gradient to become ready to +inf.
class InfInjectingReplica : public core::Replica {
 public:
  InfInjectingReplica(std::unique_ptr<core::Replica> inner, int64_t at_backward)
      : inner_(std::move(inner)), at_(at_backward) {}

  const std::vector<core::ParamInfo>& ParamInfos() const override { return inner_->ParamInfos(); }
  const std::vector<core::ParamInfo>& BufferInfos() const override { return inner_->BufferInfos(); }
  core::Span Param(int i) override { return inner_->Param(i); }
  core::Span Grad(int i) override { return inner_->Grad(i); }
  core::Span Buffer(int i) override { return inner_->Buffer(i); }
  bool GradDefined(int i) const override { return inner_->GradDefined(i); }
  void SetGradDefined(int i, bool d) override { inner_->SetGradDefined(i, d); }
  void SetTraining(bool t) override { inner_->SetTraining(t); }
  core::Status Forward(const core::Batch& b, double* loss) override { return inner_->Forward(b, loss); }
  core::Status Backward(double loss_scale, const core::GradReadyFn& on_ready) override {
    const bool inject = calls_++ == at_;
    bool done = false;
    return inner_->Backward(loss_scale, [&](int i) {
      if (inject && !done) {
        core::Tensor inf(ParamInfos()[static_cast<size_t>(i)].dtype, {1}, {std::numeric_limits<double>::infinity()});
        inner_->Memory().FromHost(inf, {inner_->Grad(i).data, 1, inner_->Grad(i).dtype});
        done = true;
      }
      if (on_ready) on_ready(i);
    });
  }
  core::Status SetSyncBnGroup(core::SyncBnGroup* g) override { return inner_->SetSyncBnGroup(g); }
  void ZeroGrad(bool s) override { inner_->ZeroGrad(s); }
  core::DeviceMemory& Memory() override { return inner_->Memory(); }
  const core::DeviceMemory& Memory() const override { return inner_->Memory(); }
  core::Status OptimizerStep(double lr) override { return inner_->OptimizerStep(lr); }
  bool UnscaleGrads(float inv) override { return inner_->UnscaleGrads(inv); }
  double GradNorm() override { return inner_->GradNorm(); }
  void ScaleGrads(double f) override { inner_->ScaleGrads(f); }
  std::vector<std::pair<std::string, core::Tensor>> OptimizerState() const override {
    return inner_->OptimizerState();
  }

 private:
  std::unique_ptr<core::Replica> inner_;
  int64_t at_;
  int64_t calls_ = 0;
};

// Runs the (materialised) scenario on rank threads over `comm` ("gloo" or "local"); rank `inject_rank`
// (-1: none) gets +inf in its local gradient at backward `inject_backward`. Returns the first rank error.
inline core::Status RunWorld(const core::Scenario& s, const std::string& comm, int inject_rank,
                             int64_t inject_backward, core::Trace* trace) {
  const int world = s.world;
  std::vector<std::unique_ptr<core::Replica>> replicas(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::unique_ptr<core::Replica> rep;
    DDPCHECK_RETURN_IF_ERROR(sim::MakeCpuReplica(s, r, &rep));
    if (r == inject_rank) rep = std::make_unique<InfInjectingReplica>(std::move(rep), inject_backward);
    replicas[static_cast<size_t>(r)] = std::move(rep);
  }
  std::vector<core::Status> results(static_cast<size_t>(world));
  auto local = sim::LocalWorld::Create(world);
  auto store = std::make_shared<sim::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      core::RankRunOptions opts;
      opts.trace = trace;
      auto& result = results[static_cast<size_t>(r)];
      if (comm == "local") {
        sim::LocalCommunicator c(local, r);
        result = core::RunRank(s, r, replicas[static_cast<size_t>(r)].get(), &c, opts);
      } else {
        std::unique_ptr<sim::GlooCommunicator> c;
        result = sim::GlooCommunicator::Create(store, "amp-test", r, world, core::kDefaultTimeout, &c);
        if (result.ok()) result = core::RunRank(s, r, replicas[static_cast<size_t>(r)].get(), c.get(), opts);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) DDPCHECK_RETURN_IF_ERROR(st);
  return core::Status::Ok();
}

}  // namespace ddpcheck::testing
