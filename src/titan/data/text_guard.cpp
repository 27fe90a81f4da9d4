#include "titan/data/text_guard.h"

#include "titan/core/check.h"

namespace titan::data {

uint64_t garbage_characters(std::string_view text, uint64_t* characters) {
  uint64_t bad = 0, chars = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0, n = text.size(); i < n; ++i) {
    const unsigned char b = s[i];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: part of the character before
    ++chars;
    if (b < 0x20 && b != '\t' && b != '\n' && b != '\r' && b != '\f')
      ++bad;
    else if (b == 0xEF && i + 2 < n && s[i + 1] == 0xBF && s[i + 2] == 0xBD)
      ++bad;  // U+FFFD
  }
  if (characters) *characters = chars;
  return bad;
}

std::string not_text_reason(std::string_view text) {
  uint64_t chars = 0;
  const uint64_t bad = garbage_characters(text, &chars);
  if (bad < 4 || bad * 10 <= chars) return "";
  return std::to_string(bad) + " of " + std::to_string(chars) +
         " characters U+FFFD (invalid UTF-8) or control characters; more than 10% is not text (binary "
         "data or a wrong encoding?), so it is rejected";
}

void check_document_is_text(std::string_view text, const std::filesystem::path& file, uint64_t line) {
  const std::string why = not_text_reason(text);
  TITAN_CHECK(why.empty(), "dataset: ", file.string(), ":", line, ": the document starting here is ", why);
}

}  // namespace titan::data
