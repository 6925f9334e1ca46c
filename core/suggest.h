// "Did you mean" hints for unknown names (JSON keys, layer types, fault names, enum values).
#pragma once

#include <string>
#include <vector>

namespace ddpcheck::core {

// Levenshtein distance (insertions, deletions, substitutions; ASCII, case-sensitive).
int EditDistance(const std::string& a, const std::string& b);

// "did you mean 'optimizer'?" for the candidate closest to `word` when it is close (distance <= 2, or <= a
// third of the word's length for long words; ties go to the earlier candidate); otherwise
// "expected one of a, b, c". Empty candidates -> "".
std::string SuggestionFor(const std::string& word, const std::vector<std::string>& candidates);

// "a, b, c"
std::string JoinNames(const std::vector<std::string>& names);

}  // namespace ddpcheck::core
