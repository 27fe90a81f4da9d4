#pragma once
// What counts as text. Random bytes, a binary file or text in a wrong encoding (Latin-1, UTF-16)
// must not be trained on silently: after UTF-8 repair they are mostly U+FFFD and control
// characters. The rule, checked on every document as soon as it is read: a document of which more
// than 10% of the characters, and at least 4, are U+FFFD or C0 control characters other than tab,
// line feed, carriage return and form feed is rejected, naming file:line. Random bytes are about
// half replacement characters, UTF-16 text half NULs; real text with damaged bytes stays far below
// (the bundled English corpus: 51 of 100,000 documents hold any, the worst 4 of 81 characters).
// Text in a single-byte encoding (Latin-1) with a few accents per line passes: it is repaired.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace titan::data {

// Characters that mark `text` (valid UTF-8) as not text: U+FFFD and disallowed control characters.
uint64_t garbage_characters(std::string_view text, uint64_t* characters);

// Why `text` breaks the rule above ("10 of 93 characters U+FFFD ... so it is rejected"); "" when it
// keeps it.
std::string not_text_reason(std::string_view text);

// Throws titan::Error "dataset: FILE:LINE: the document starting here is ..." when `text` breaks
// the rule above.
void check_document_is_text(std::string_view text, const std::filesystem::path& file, uint64_t line);

}  // namespace titan::data
