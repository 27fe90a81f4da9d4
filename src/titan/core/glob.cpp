#include "titan/core/glob.h"

#include "titan/core/check.h"

namespace titan {

std::string glob_problem(const std::string& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '[') continue;
    const size_t close = p.find(']', i);
    if (close == std::string::npos)
      return "the '[' at character " + std::to_string(i + 1) + " is never closed by ']'";
    const size_t first = i + 1 < close && p[i + 1] == '!' ? i + 2 : i + 1;  // "[!...]": not in the set
    if (close == first) {
      // Appended, not "'" + substr: g++ 12 warns -Wrestrict on that chain (a false alarm).
      std::string set = "'";
      set.append(p, i, close - i + 1).append("' is an empty set: it matches nothing");
      return set;
    }
    for (size_t k = first; k < close; ++k)
      if (k + 2 < close && p[k + 1] == '-') {
        if (p[k] > p[k + 2])
          return std::string("the range '") + p[k] + "-" + p[k + 2] +
                 "' is reversed: it matches nothing (write '" + p[k + 2] + "-" + p[k] + "')";
        k += 2;
      }
    i = close;
  }
  return "";
}

// fnmatch-style matching with backtracking to the last '*'.
bool glob_match(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star_p = std::string::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '[') {
      size_t close = p.find(']', pi);
      TITAN_CHECK(close != std::string::npos, "glob '", p, "': unterminated '['");
      const bool negated = pi + 1 < close && p[pi + 1] == '!';
      bool match = false;
      for (size_t k = pi + (negated ? 2 : 1); k < close; ++k) {
        if (k + 2 < close && p[k + 1] == '-') {
          match |= s[si] >= p[k] && s[si] <= p[k + 2];
          k += 2;
        } else {
          match |= s[si] == p[k];
        }
      }
      if (match != negated) {
        pi = close + 1;
        ++si;
        continue;
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
      continue;
    } else if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (star_p == std::string::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace titan
