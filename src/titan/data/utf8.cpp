#include "titan/data/utf8.h"

#include <cstdint>

namespace titan::data {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 and the length of its maximal
// ill-formed prefix in *bad (>= 1) when it is not valid.
inline size_t sequence_length(const unsigned char* s, size_t n, size_t i, size_t* bad) {
  unsigned char b = s[i];
  if (b < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // range allowed for the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;  // no overlongs
    if (b == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= n) {
      *bad = k;
      return 0;
    }
    unsigned char c = s[i + k];
    bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      *bad = k;
      return 0;
    }
  }
  return len;
}

size_t ascii_prefix(const unsigned char* s, size_t n) {
  size_t i = 0;
  // Eight bytes at a time: the common case is long ASCII runs.
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s + i, 8);
    if (w & 0x8080808080808080ull) break;
  }
  while (i < n && s[i] < 0x80) ++i;
  return i;
}

}  // namespace

bool is_valid_utf8(std::string_view sv) {
  auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t n = sv.size();
  size_t i = ascii_prefix(s, n);
  while (i < n) {
    size_t bad = 0;
    size_t len = sequence_length(s, n, i, &bad);
    if (!len) return false;
    i += len;
    if (len == 1) i += ascii_prefix(s + i, n - i);
  }
  return true;
}

size_t sanitize_utf8(std::string_view sv, std::string& out) {
  auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t n = sv.size();
  out.clear();
  out.reserve(n);
  size_t replaced = 0, i = 0;
  while (i < n) {
    size_t bad = 0;
    size_t len = sequence_length(s, n, i, &bad);
    if (len) {
      out.append(sv.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++replaced;
      i += bad;
    }
  }
  return replaced;
}

size_t sanitize_utf8(std::string& s) {
  if (is_valid_utf8(s)) return 0;
  std::string out;
  size_t replaced = sanitize_utf8(s, out);
  s.swap(out);
  return replaced;
}

namespace {

// The code unit of the four hex digits at s[at], or -1 when they are not four hex digits.
long hex4(const std::string& s, size_t at) {
  if (at + 4 > s.size()) return -1;
  long v = 0;
  for (size_t k = at; k < at + 4; ++k) {
    const char c = s[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

size_t repair_surrogate_escapes(std::string& json) {
  size_t repaired = 0;
  // Each backslash found starts an escape: the scan steps past the escaped character, so a backslash
  // escaped by another is never taken for the start of one.
  for (size_t i = json.find('\\'); i != std::string::npos && i + 1 < json.size(); i = json.find('\\', i)) {
    if (json[i + 1] != 'u') {
      i += 2;
      continue;
    }
    const long unit = hex4(json, i + 2);
    const bool high = unit >= 0xD800 && unit <= 0xDBFF, low = unit >= 0xDC00 && unit <= 0xDFFF;
    if (high && json.compare(i + 6, 2, "\\u") == 0) {
      const long next = hex4(json, i + 8);
      if (next >= 0xDC00 && next <= 0xDFFF) {  // a pair: one character
        i += 12;
        continue;
      }
    }
    if (high || low) {
      json.replace(i + 2, 4, "fffd");
      ++repaired;
    }
    i += 2;  // the hex digits hold no backslash
  }
  return repaired;
}

}  // namespace titan::data
