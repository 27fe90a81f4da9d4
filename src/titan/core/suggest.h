#pragma once
// "Did you mean ...?" for unknown names (config keys, command-line options, flavors).
#include <string>
#include <vector>

namespace titan {

size_t edit_distance(const std::string& a, const std::string& b);  // Levenshtein
// The candidate closest to `word`, or "" when none is close (within max(2, |word| / 3) edits).
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace titan
