#include "sim/communicator_fingerprint.h"

#include <map>

namespace ddpcheck::sim {

namespace {
int64_t Fnv1a(const int64_t* words, int n) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < n; ++i) {
    auto w = static_cast<uint64_t>(words[i]);
    for (int b = 0; b < 8; ++b) {
      h ^= (w >> (8 * b)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
  return static_cast<int64_t>(h);
}
}  // namespace

Fingerprint FingerprintOf(const CollectiveRecord& r) {
  Fingerprint fp{static_cast<int64_t>(r.op), r.seq, r.numel, static_cast<int64_t>(r.dtype), r.root, 0};
  fp[5] = Fnv1a(fp.data(), 5);
  return fp;
}

std::string DescribeFingerprint(const Fingerprint& fp) {
  CollectiveRecord r;
  r.op = static_cast<CollectiveOp>(fp[0]);
  const std::string seq = " (#" + std::to_string(fp[1]) + ")";
  if (fp[5] != Fnv1a(fp.data(), 5)) return "a corrupted fingerprint" + seq;
  if (r.op == CollectiveOp::kBarrier || r.op == CollectiveOp::kJoin) return OpName(r.op) + seq;
  std::string text = OpName(r.op) + " of " + std::to_string(fp[2]) + " " +
                     core::DTypeName(static_cast<core::DType>(fp[3]));
  if (r.op == CollectiveOp::kBroadcast) text += " from rank " + std::to_string(fp[4]);
  return text + seq;
}

std::string CheckFingerprints(const CollectiveRecord& mine, int rank, const std::vector<Fingerprint>& all) {
  // Groups of identical fingerprints, in order of their lowest rank.
  std::map<Fingerprint, size_t> index;
  std::vector<std::pair<Fingerprint, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    auto [it, inserted] = index.emplace(all[static_cast<size_t>(r)], groups.size());
    if (inserted) groups.push_back({all[static_cast<size_t>(r)], {}});
    groups[it->second].second.push_back(r);
  }
  if (groups.size() <= 1) return "";
  size_t majority = 0;
  for (size_t g = 1; g < groups.size(); ++g) {
    if (groups[g].second.size() > groups[majority].second.size()) majority = g;
  }
  std::string others;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == majority) continue;
    others += (others.empty() ? "" : "; ") + RankList(groups[g].second) + " entered " +
              DescribeFingerprint(groups[g].first);
  }
  return "collective " + DescribeRecord(mine) + " does not match on every rank (seen by rank " +
         std::to_string(rank) + "): " + others + " while " + RankList(groups[majority].second) + " entered " +
         DescribeFingerprint(groups[majority].first);
}

}  // namespace ddpcheck::sim
