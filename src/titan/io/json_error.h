#pragma once
// JSON parse errors that point at the real fault. nlohmann reports where parsing stopped ("unexpected
// ']'"), which for the most common hand-editing mistake, a trailing comma, is one token after it.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace titan::io {

// Where a parse error of `text` lies, 1-based, in the coordinates of its file (`text` starts at
// `first_line`, `first_column`), and what went wrong. A trailing comma is named as such, at the comma.
struct JsonErrorAt {
  uint64_t line = 1, column = 1;
  std::string what;
};
JsonErrorAt locate_json_error(std::string_view text, const nlohmann::json::parse_error& e,
                              uint64_t first_line = 1, uint64_t first_column = 1);

// Parses `text`; a syntax error is a titan::Error "<source>: line L, column C: ...".
nlohmann::json parse_json_text(std::string_view text, const std::string& source);
// The same with objects' keys in the text's order.
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source);

// The JSON document in the regular file `path`; an error starts with `who`: "<who>: '<path>' is a
// directory ...", "<who>: cannot open '<path>'", "<who>: '<path>': invalid JSON at line L, column C: ...".
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view who);
// The same with objects' keys in the file's order (where the order is data: tool-call arguments).
nlohmann::ordered_json read_ordered_json_file(const std::filesystem::path& path, std::string_view who);

}  // namespace titan::io
