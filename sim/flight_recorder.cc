#include "sim/flight_recorder.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

namespace ddpcheck::sim {

std::string OpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kJoin: return "join";
    case CollectiveOp::kAllReduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllGather: return "allgather";
    case CollectiveOp::kBarrier: return "barrier";
  }
  return "op" + std::to_string(static_cast<int64_t>(op));
}

std::string DescribeRecord(const CollectiveRecord& record) {
  if (record.seq < 0) return "a collective before #" + std::to_string(-record.seq);
  if (record.op == CollectiveOp::kJoin) return "#" + std::to_string(record.seq) + " rendezvous";
  return "#" + std::to_string(record.seq) + " " + OpName(record.op) + " '" + record.what + "'";
}

// Text: "seq|op|numel|dtype|root|what"; `what` is last so it may contain '|'.
std::vector<char> EncodeRecord(const CollectiveRecord& r) {
  std::string s = std::to_string(r.seq) + "|" + std::to_string(static_cast<int64_t>(r.op)) + "|" +
                  std::to_string(r.numel) + "|" + std::to_string(static_cast<int>(r.dtype)) + "|" +
                  std::to_string(r.root) + "|" + r.what;
  return std::vector<char>(s.begin(), s.end());
}

bool DecodeRecord(const std::vector<char>& bytes, CollectiveRecord* out) {
  std::string s(bytes.begin(), bytes.end());
  int64_t fields[5];
  size_t pos = 0;
  for (int64_t& f : fields) {
    size_t bar = s.find('|', pos);
    if (bar == std::string::npos || bar == pos) return false;
    char* end = nullptr;
    f = std::strtoll(s.c_str() + pos, &end, 10);
    if (end != s.c_str() + bar) return false;
    pos = bar + 1;
  }
  if (fields[1] < 0 || fields[1] > static_cast<int64_t>(CollectiveOp::kBarrier)) return false;
  if (fields[3] < 0 || fields[3] > static_cast<int64_t>(core::DType::kInt64)) return false;
  out->seq = fields[0];
  out->op = static_cast<CollectiveOp>(fields[1]);
  out->numel = fields[2];
  out->dtype = static_cast<core::DType>(fields[3]);
  out->root = static_cast<int>(fields[4]);
  out->what = s.substr(pos);
  return true;
}

std::string RankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    if (j - i >= 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
      i = j + 1;
    } else {
      out += std::to_string(ranks[i]);
      ++i;
    }
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

void MemoryFlightRecorder::Record(int rank, const CollectiveRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  records_.at(static_cast<size_t>(rank)) = record;
}

std::vector<std::optional<CollectiveRecord>> MemoryFlightRecorder::ReadAll(int64_t /*near_seq*/) {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

namespace {
// Groups ranks by a description, keeping groups in order of their lowest rank.
class Groups {
 public:
  void Add(const std::string& key, int rank) {
    auto [it, inserted] = index_.emplace(key, groups_.size());
    if (inserted) groups_.push_back({key, {}});
    groups_[it->second].second.push_back(rank);
  }
  const std::vector<std::pair<std::string, std::vector<int>>>& groups() const { return groups_; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<std::pair<std::string, std::vector<int>>> groups_;
};
}  // namespace

StallReport DescribeStall(const CollectiveRecord& mine, int rank, std::chrono::milliseconds timeout,
                          const std::vector<std::optional<CollectiveRecord>>& records, const std::string& cause) {
  StallReport report;
  const std::string head = "collective " + DescribeRecord(mine);
  const std::string where = " on rank " + std::to_string(rank);
  if (records.empty()) {
    report.message = head + " failed" + where + " (flight recorder off: cannot name the missing ranks)" +
                     (cause.empty() ? "" : ": " + cause);
    return report;
  }
  Groups missing, entered, ahead;
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    if (r == rank) continue;
    const auto& rec = records[static_cast<size_t>(r)];
    if (!rec) {
      missing.Add("never arrived (never joined)", r);
      report.missing.push_back(r);
    } else if (rec->seq < mine.seq) {
      missing.Add("never arrived (last entered: " + DescribeRecord(*rec) + ")", r);
      report.missing.push_back(r);
    } else if (rec->seq == mine.seq) {
      entered.Add("entered " + DescribeRecord(*rec), r);
    } else {
      ahead.Add("is ahead at " + DescribeRecord(*rec), r);
    }
  }
  std::string clauses;
  for (const Groups* g : {&missing, &ahead, &entered}) {
    for (const auto& [text, ranks] : g->groups()) {
      clauses += (clauses.empty() ? "" : "; ") + RankList(ranks) + " " + text;
    }
  }
  if (!report.missing.empty()) {
    report.message = head + " timed out after " + std::to_string(timeout.count()) + " ms" + where + ": " + clauses;
    if (!cause.empty()) report.message += " (" + cause + ")";
  } else {
    report.message = head + " failed" + where + " although every rank entered it" +
                     (cause.empty() ? "" : ": " + cause) + (clauses.empty() ? "" : " [" + clauses + "]");
  }
  return report;
}

}  // namespace ddpcheck::sim
