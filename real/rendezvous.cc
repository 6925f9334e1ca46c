#include "real/rendezvous.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

namespace ddpcheck::real {

std::string RankListText(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + (j - i >= 2 ? fmt::format("{}-{}", ranks[i], ranks[j])
                                                   : std::to_string(ranks[i]));
    i = j - i >= 2 ? j + 1 : i + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

core::Status JoinAndExchangeId(KvStore* store, ArrivalRecord* arrivals, const std::string& run_id, int rank,
                               int world, std::chrono::milliseconds timeout,
                               const std::function<core::Status(std::vector<char>*)>& make_id, size_t want_bytes,
                               std::vector<char>* id) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string where = fmt::format("nccl init of run '{}' on rank {}", run_id, rank);
  auto lost = [&](const std::vector<int>& missing) {
    return core::Status::Timeout(fmt::format("{} timed out after {} ms: {} never joined ({} of {} joined)", where,
                                             timeout.count(), RankListText(missing),
                                             world - static_cast<int>(missing.size()), world));
  };
  arrivals->Arrive(0, "nccl init");
  auto pause = std::chrono::milliseconds(1);
  for (std::vector<int> missing = arrivals->Missing(0); !missing.empty(); missing = arrivals->Missing(0)) {
    if (std::chrono::steady_clock::now() >= deadline) return lost(missing);
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(20)) pause *= 2;
  }
  const std::string key = run_id + "/nccl/unique_id";
  if (rank == 0) {
    DDPCHECK_RETURN_IF_ERROR(make_id(id));
    store->Set(key, *id);
  } else {
    const auto left = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 deadline - std::chrono::steady_clock::now()));
    if (!store->Wait(key, left, id)) {
      return core::Status::Timeout(fmt::format("{} timed out after {} ms: every rank joined, but rank 0 never "
                                               "published the NCCL unique id (key {}); rank 0 lost after joining?",
                                               where, timeout.count(), key));
    }
  }
  if (id->size() != want_bytes) {
    return core::Status::Internal(fmt::format("{}: {} has {} bytes, want {}", where, key, id->size(), want_bytes));
  }
  return core::Status::Ok();
}

}  // namespace ddpcheck::real
