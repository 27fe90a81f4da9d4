#pragma once
// UTF-8 validation and repair. Text enters the data pipeline from arbitrary
// files; everything downstream (NFC, the PCRE2 pre-tokenizer) needs valid UTF-8.
#include <cstddef>
#include <string>
#include <string_view>

namespace titan::data {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Copies `in` to `out`, replacing each maximal ill-formed subsequence by U+FFFD, the
// policy of the Unicode standard (sec. 3.9), WHATWG and Python's errors="replace".
// Returns the number of replacements.
size_t sanitize_utf8(std::string_view in, std::string& out);

// In place; returns the number of replacements (0 leaves `s` untouched).
size_t sanitize_utf8(std::string& s);

}  // namespace titan::data
