#include "titan/core/suggest.h"

#include <algorithm>
#include <cstdint>

namespace titan {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and swaps of two neighbours, the
  // commonest typo ("enabel"), each one edit.
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& c : candidates)
    if (size_t d = edit_distance(word, c); d < best_d) {
      best_d = d;
      best = c;
    }
  // A word of three letters or fewer is two edits from most others ("foo" from "job"): one at most.
  const size_t allowed = word.size() <= 3 ? 1 : std::max<size_t>(2, word.size() / 3);
  return best_d <= allowed ? best : "";
}

std::string suggestion(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string best = nearest(word, candidates);
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

std::string join(const std::vector<std::string>& names, const std::string& separator) {
  std::string s;
  for (const std::string& name : names) s += (s.empty() ? "" : separator) + name;
  return s;
}

std::string quoted_names(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  std::string list;
  for (size_t n = 0; n < names.size() && n < 20; ++n) list += (n ? ", '" : "'") + names[n] + "'";
  if (names.size() > 20) list += ", ... (" + std::to_string(names.size()) + " in all)";
  return list;
}

}  // namespace titan
