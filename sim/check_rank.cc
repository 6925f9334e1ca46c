#include "sim/check_rank.h"

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>

#include "core/diagnose.h"
#include "core/train_loop.h"
#include "sim/communicator_gloo_errors.h"
#include "sim/flight_recorder.h"
#include "sim/peer_watch.h"
#include "sim/store.h"
#include "sim/trace_shard.h"

namespace ddpcheck::sim {

namespace {

std::string ShardKey(const std::string& run_id, int rank) { return run_id + "/shard/" + std::to_string(rank); }

// Waits for every rank's shard and merges them into *got. Timeout names the ranks whose shards are missing.
core::Status GatherShards(const std::shared_ptr<gloo::rendezvous::Store>& store_ptr, const std::string& run_id,
                          int world, std::chrono::milliseconds timeout, core::Trace* got) {
  gloo::rendezvous::Store& store = *store_ptr;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(ShardKey(run_id, r));
  try {
    // In slices: a rank lost (PeerWatch) before its shard arrived is named at once, not after the timeout.
    PeerWatch peers(store_ptr, run_id, 0, world);
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string lost;
    while (lost.empty()) {
      try {
        store.wait(keys, std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(100)));
        break;
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() >= until) throw;
      }
      for (const LostRank& l : peers.Lost()) {  // ranks that published and exited are not lost
        if (!StoreHas(store, keys[static_cast<size_t>(l.rank)])) lost += DescribeLost({l});
      }
    }
    if (!lost.empty()) {
      return core::Status::Timeout("run '" + run_id + "': trace shards never arrived at rank 0" + lost);
    }
  } catch (const std::exception&) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (!StoreHas(store, keys[static_cast<size_t>(r)])) missing.push_back(r);
    }
    if (!missing.empty()) {
      return core::Status::Timeout("run '" + run_id + "': the trace shards of " + RankList(missing) +
                                   " did not arrive within " + std::to_string(timeout.count()) +
                                   " ms after rank 0 finished: those ranks died or never came");
    }
  }
  for (int r = 0; r < world; ++r) {
    std::vector<char> blob;
    try {
      blob = store.get(keys[static_cast<size_t>(r)]);
    } catch (const std::exception& e) {
      return core::Status::Io("run '" + run_id + "': cannot read the trace shard of rank " + std::to_string(r) + ": " +
                              GlooErrorText(e.what()));
    }
    core::Trace shard;
    DDPCHECK_RETURN_IF_ERROR(UnpackTrace(blob, &shard));
    if (r == 0) got->meta = shard.meta;
    MergeShard(shard, got);
  }
  return core::Status::Ok();
}

}  // namespace

core::Status RunCheckRank(core::Scenario s, const CheckOptions& opts, int rank,
                          std::shared_ptr<gloo::rendezvous::Store> store, core::RunReport* report, bool* reporter) {
  *reporter = false;
  if (opts.backend != "sim") return core::Status::Invalid("ranks as processes run the sim backend only");
  DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&s));
  core::Trace mine;
  core::Status finding;
  DDPCHECK_RETURN_IF_ERROR(RunSimRank(s, opts.sim, rank, store, &mine, &finding));
  // A rank with a finding still publishes: its events are part of the world's trace.
  std::vector<char> blob;
  DDPCHECK_RETURN_IF_ERROR(PackTrace(mine, &blob));
  try {
    store->set(ShardKey(opts.sim.run_id, rank), blob);
  } catch (const std::exception& e) {
    return core::Status::Io("rank " + std::to_string(rank) +
                            ": cannot publish its trace shard: " + GlooErrorText(e.what()));
  }
  if (rank != 0) return finding;

  core::Trace got;
  core::Status st = GatherShards(store, opts.sim.run_id, s.world, opts.sim.timeout, &got);
  if (!st.ok()) {
    if (!finding.ok()) st = core::Status(st.code(), finding.message() + "; then " + st.message());
    return st;
  }
  // The reference and the report's frame, as RunCheck builds them; then the comparison it makes for sim.
  CheckOptions ref_opts = opts;
  ref_opts.backend = "reference";
  ref_opts.dump_trace.clear();
  core::Trace ref;
  DDPCHECK_RETURN_IF_ERROR(RunCheck(s, ref_opts, report, nullptr, &ref));
  const core::TolerancePolicy policy = core::PolicyFor(s);
  got.meta["exact"] = policy.exact;
  got.meta["reduction_length"] = policy.reduction_length;
  if (!opts.dump_trace.empty()) DDPCHECK_RETURN_IF_ERROR(got.Write(opts.dump_trace));
  report->provenance["backend"] = "sim/" + opts.sim.comm;
  report->provenance["ranks"] = "processes";
  report->backend = "sim (" + opts.sim.comm + ", " + std::to_string(s.world) + " processes)";
  report->against = "reference";
  report->result = CompareRun(got, ref, policy);
  report->events = got.events();
  report->lr_by_step.clear();
  report->scale_by_step.clear();
  report->loss_by_step.clear();
  core::FillSeries(got, report);
  report->diagnosis = core::Diagnose(s, got, ref, report->result);
  if (!report->diagnosis.has_value() && !s.faults.empty() && report->result.pass) report->result.pass = false;
  *reporter = true;
  return core::Status::Ok();
}

}  // namespace ddpcheck::sim
