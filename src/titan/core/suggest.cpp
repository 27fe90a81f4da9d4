#include "titan/core/suggest.h"

#include <algorithm>
#include <cstdint>

namespace titan {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
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
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
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
