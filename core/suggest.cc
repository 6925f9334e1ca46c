#include "core/suggest.h"

#include <algorithm>

namespace ddpcheck::core {

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s;
}

std::string SuggestionFor(const std::string& word, const std::vector<std::string>& candidates) {
  if (candidates.empty()) return "";
  int best = -1;
  size_t best_i = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    int d = EditDistance(word, candidates[i]);
    if (best < 0 || d < best) { best = d; best_i = i; }
  }
  int limit = std::max<int>(2, static_cast<int>(word.size()) / 3);
  if (best <= limit && best < static_cast<int>(std::max(word.size(), candidates[best_i].size()))) {
    return "did you mean '" + candidates[best_i] + "'?";
  }
  return "expected one of " + JoinNames(candidates);
}

}  // namespace ddpcheck::core
