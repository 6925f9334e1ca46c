#include "real/arrival_record.h"

#include <fmt/format.h>

namespace ddpcheck::real {

ArrivalRecord::ArrivalRecord(std::shared_ptr<KvStore> store, std::string run_id, int rank, int world)
    : store_(std::move(store)), run_id_(std::move(run_id)), rank_(rank), world_(world) {}

std::string ArrivalRecord::Key(int rank, int64_t seq) const {
  return fmt::format("{}/arrive/{}/{}", run_id_, rank, seq);
}

void ArrivalRecord::Arrive(int64_t seq, const std::string& what) {
  store_->Set(Key(rank_, seq), std::vector<char>(what.begin(), what.end()));
}

std::vector<int> ArrivalRecord::Missing(int64_t seq) const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r) {
    if (!store_->TryGet(Key(r, seq), nullptr)) out.push_back(r);
  }
  return out;
}

std::string ArrivalRecord::DescribeMissing(int64_t seq, int lookback) const {
  std::string out;
  for (int r : Missing(seq)) {
    std::string last = "entered nothing";
    std::vector<char> v;
    for (int64_t s = seq - 1; s >= 1 && s >= seq - lookback; --s) {
      if (store_->TryGet(Key(r, s), &v)) {
        last = fmt::format("last entered #{} '{}'", s, std::string(v.begin(), v.end()));
        break;
      }
    }
    if (last == "entered nothing" && seq - lookback > 1) last = fmt::format("nothing in #{}..#{}", seq - lookback, seq - 1);
    out += fmt::format("{}rank {} ({})", out.empty() ? "" : ", ", r, last);
  }
  return out;
}

}  // namespace ddpcheck::real
