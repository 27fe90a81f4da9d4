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

// JSON text with each \uD800-\uDFFF escape that is not half of a pair (a high surrogate's escape
// followed by a low one's) rewritten in place as \ufffd, the same length, so that positions in the
// text stay put. A lone surrogate is no character: JSON parsers refuse its escape, which Python's
// json.dumps writes (ensure_ascii, its default) for a string holding one. Only escapes are
// rewritten: after an escaped backslash ("\\ud83d") the letters are text. Returns the rewrites.
size_t repair_surrogate_escapes(std::string& json);

}  // namespace titan::data
