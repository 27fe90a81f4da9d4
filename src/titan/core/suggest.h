#pragma once
// Errors about names: "did you mean ...?" for unknown ones (config keys, command-line options,
// flavors) and the list of the known ones.
#include <string>
#include <vector>

namespace titan {

size_t edit_distance(const std::string& a, const std::string& b);  // Levenshtein
// The candidate closest to `word`, or "" when none is close (within max(2, |word| / 3) edits).
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);
// "; did you mean 'best'?" with the nearest candidate, or "" when none is close.
std::string suggestion(const std::string& word, const std::vector<std::string>& candidates);
// "a, b, c" (with `separator` between the names).
std::string join(const std::vector<std::string>& names, const std::string& separator = ", ");
// Names for an error that lists them (a file's columns, a record's fields): "'a', 'b', ..." (the
// first 20, then how many in all), or "none".
std::string quoted_names(const std::vector<std::string>& names);

}  // namespace titan
