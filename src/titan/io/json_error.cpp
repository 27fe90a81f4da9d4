#include "titan/io/json_error.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "titan/core/check.h"
#include "titan/io/path_guard.h"

namespace titan::io {

namespace {

// 1-based line and column of byte `at` of `text` (which starts at first_line, first_column).
JsonErrorAt position(std::string_view text, size_t at, uint64_t first_line, uint64_t first_column,
                     std::string what) {
  uint64_t line = first_line, column = first_column;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column, std::move(what)};
}

// Bytes outside printable ASCII in nlohmann's message ("last read: '<two raw bytes>'") written as
// \xNN: raw, they make the whole log read as binary to grep and less.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return out;
}

// UTF-16 text (a byte-order mark FF FE or FE FF, or ASCII characters each beside a zero byte near the
// start) parses as garbage: the error says what the file is instead of pointing at a byte of it. Other
// binary data (a safetensors header's length) has zeros too, but not in that rhythm. (A reader that
// repairs invalid UTF-8 may have replaced the byte-order mark already: the rhythm still shows.)
bool looks_utf16(std::string_view text) {
  const auto byte = [&](size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0x100u; };
  if ((byte(0) == 0xFF && byte(1) == 0xFE) || (byte(0) == 0xFE && byte(1) == 0xFF)) return true;
  const auto ascii = [&](size_t i) { return byte(i) >= 0x20 && byte(i) < 0x7f; };
  for (size_t i = 0; i < 32 && i + 6 <= text.size(); ++i) {
    bool little = true, big = true;  // three characters, each with its zero byte after / before it
    for (size_t k = 0; k < 6; k += 2) {
      little = little && ascii(i + k) && byte(i + k + 1) == 0;
      big = big && byte(i + k) == 0 && ascii(i + k + 1);
    }
    if (little || big) return true;
  }
  return false;
}

}  // namespace

JsonErrorAt locate_json_error(std::string_view text, const nlohmann::json::parse_error& e,
                              uint64_t first_line, uint64_t first_column) {
  // e.byte is 1-based: the byte at which the parser gave up.
  const size_t stop = e.byte > 0 ? size_t(e.byte - 1) : 0;
  if (stop < text.size() && (text[stop] == ']' || text[stop] == '}')) {
    size_t before = stop;
    while (before > 0 && (text[before - 1] == ' ' || text[before - 1] == '\t' || text[before - 1] == '\n' ||
                          text[before - 1] == '\r'))
      --before;
    if (before > 0 && text[before - 1] == ',')
      return position(text, before - 1, first_line, first_column,
                      "trailing comma before '" + std::string(1, text[stop]) +
                          "' (JSON allows no comma after the last element)");
  }
  std::string what = e.what();
  // Drop nlohmann's own "[json.exception.parse_error.101] parse error at line 1, column 7: " prefix:
  // its position is relative to the parsed text, ours to the file.
  if (auto colon = what.find(": "); what.rfind("[json.exception", 0) == 0 && colon != std::string::npos)
    what = what.substr(colon + 2);
  what = printable(what);
  if (looks_utf16(text))
    what += " (the text looks UTF-16; titan reads UTF-8: convert it, e.g. iconv -f UTF-16 -t UTF-8)";
  return position(text, stop, first_line, first_column, what);
}

namespace {

template <class Json>
Json parse_as(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const JsonErrorAt at = locate_json_error(text, e);
    TITAN_FAIL(source, ": invalid JSON at line ", at.line, ", column ", at.column, ": ", at.what);
  } catch (const nlohmann::json::exception& e) {  // a number past double's range (1e999), ...
    std::string what = e.what();
    if (auto colon = what.find("] "); what.rfind("[json.exception", 0) == 0 && colon != std::string::npos)
      what = what.substr(colon + 2);
    TITAN_FAIL(source, ": invalid JSON: ", printable(what));
  }
}

template <class Json>
Json read_as(const std::filesystem::path& path, std::string_view who) {
  return parse_as<Json>(read_regular_file(path, std::string(who)),
                        std::string(who) + ": '" + path.string() + "'");
}

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  return parse_as<nlohmann::json>(text, source);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source) {
  return parse_as<nlohmann::ordered_json>(text, source);
}

nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view who) {
  return read_as<nlohmann::json>(path, who);
}

nlohmann::ordered_json read_ordered_json_file(const std::filesystem::path& path, std::string_view who) {
  return read_as<nlohmann::ordered_json>(path, who);
}

}  // namespace titan::io
