#include "harness/check.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "core/train_loop.h"
#include "harness/compose.h"
#include "harness/sources.h"
#include "sim/communicator_gloo_errors.h"
#include "sim/flight_recorder.h"
#include "sim/peer_watch.h"
#include "sim/store.h"
#include "sim/store_open.h"
#include "sim/trace_shard.h"
#include "sim/world.h"

namespace ddpcheck::harness {

namespace {

std::string ShardKey(const std::string& run_id, int rank) { return run_id + "/shard/" + std::to_string(rank); }

// Waits for every rank's shard and merges them into *got. Timeout names the ranks whose shards are missing.
core::Status GatherShards(const std::shared_ptr<gloo::rendezvous::Store>& store_ptr, const std::string& run_id,
                          int world, std::chrono::milliseconds timeout, core::Trace* got) {
  gloo::rendezvous::Store& store = *store_ptr;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(ShardKey(run_id, r));
  try {
    // Polled: a rank lost (PeerWatch) before its shard arrived is named at once, not after the timeout
    // (gloo's FileStore waits out its own timeout whatever a wait() asks, so no wait() here).
    sim::PeerWatch peers(store_ptr, run_id, 0, world);
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string lost;
    std::vector<bool> have(keys.size(), false);  // a shard seen once is not read again while polling
    while (lost.empty()) {
      bool all = true;
      for (size_t r = 0; r < keys.size(); ++r) {
        have[r] = have[r] || sim::StoreHas(store, keys[r]);
        all = all && have[r];
      }
      if (all) break;
      for (const sim::LostRank& l : peers.Lost()) {  // ranks that published and exited are not lost
        if (!have[static_cast<size_t>(l.rank)]) lost += sim::DescribeLost({l});
      }
      if (!lost.empty()) break;
      if (std::chrono::steady_clock::now() >= until) throw gloo::IoException("timed out waiting for trace shards");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!lost.empty()) {
      return core::Status::Timeout("run '" + run_id + "': trace shards never arrived at rank 0" + lost);
    }
  } catch (const std::exception&) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (!sim::StoreHas(store, keys[static_cast<size_t>(r)])) missing.push_back(r);
    }
    if (!missing.empty()) {
      return core::Status::Timeout("run '" + run_id + "': the trace shards of " + sim::RankList(missing) +
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
                              sim::GlooErrorText(e.what()));
    }
    core::Trace shard;
    DDPCHECK_RETURN_IF_ERROR(sim::UnpackTrace(blob, &shard));
    if (r == 0) got->meta = shard.meta;
    sim::MergeShard(shard, got);
  }
  return core::Status::Ok();
}

}  // namespace

core::Status CheckAsRank(core::Scenario s, const CheckOptions& opts, int rank, const std::string& store_url,
                         core::RunReport* report, bool* reporter) {
  *reporter = false;
  if (opts.got.kind != SourceKind::kSim) return core::Status::Invalid("ranks as processes run the sim world only");
  DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&s));
  sim::SimOptions so;
  so.comm = opts.comm;
  so.timeout = opts.timeout.count() > 0 ? opts.timeout : std::chrono::milliseconds(s.ddp.timeout_ms);
  so.run_id = opts.run_id;
  so.gloo_host = opts.gloo_host;
  so.progress = opts.progress;
  so.record_bucket_contents = !opts.dump_trace.empty();  // only a written trace shows them
  std::shared_ptr<gloo::rendezvous::Store> store;
  DDPCHECK_RETURN_IF_ERROR(sim::OpenStore(store_url, so.timeout, &store));
  core::Trace mine;
  core::Status finding;
  DDPCHECK_RETURN_IF_ERROR(sim::RunSimRank(s, so, rank, store, &mine, &finding));
  // A rank with a finding still publishes: its events are part of the world's trace.
  std::vector<char> blob;
  DDPCHECK_RETURN_IF_ERROR(sim::PackTrace(mine, &blob));
  try {
    store->set(ShardKey(so.run_id, rank), blob);
  } catch (const std::exception& e) {
    return core::Status::Io("rank " + std::to_string(rank) +
                            ": cannot publish its trace shard: " + sim::GlooErrorText(e.what()));
  }
  if (rank != 0) return finding;

  Produced got;
  core::Status st = GatherShards(store, so.run_id, s.world, so.timeout, &got.trace);
  if (!st.ok()) {
    if (!finding.ok()) st = core::Status(st.code(), finding.message() + "; then " + st.message());
    return st;
  }
  got.name = "sim (" + opts.comm + ", " + std::to_string(s.world) + " processes)";
  got.provenance = {{"backend", "sim/" + opts.comm}, {"ranks", "processes"}};
  StampScenario(s, &got.trace);
  *reporter = true;
  return Finish(s, std::move(got), opts, report, nullptr, nullptr);
}

}  // namespace ddpcheck::harness
