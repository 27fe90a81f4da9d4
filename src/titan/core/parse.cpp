#include "titan/core/parse.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace titan {

namespace {

// `read` (std::stoll or std::stod) applied to the whole of `text`: nullopt when it throws (no
// number, out of range) or stops before the end ("4x"), and for what the std functions accept
// that nobody means as a number here: leading white space (" 1") and hexadecimal ("0x10", "0x1p3").
template <typename T, typename Read>
std::optional<T> parse_whole(const std::string& text, Read read) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front())) ||
      text.find_first_of("xX") != std::string::npos)
    return std::nullopt;
  size_t used = 0;
  try {
    const T v = read(text, &used);
    if (!text.empty() && used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> parse_int(const std::string& text) {
  return parse_whole<int64_t>(text, [](const std::string& s, size_t* used) { return std::stoll(s, used); });
}

std::optional<double> parse_number(const std::string& text) {
  // strtod, not std::stod: stod throws on underflow too, refusing a subnormal ("1e-310") or a value
  // that rounds to zero ("1e-400"), which are numbers; a value past the double range is not.
  return parse_whole<double>(text, [](const std::string& s, size_t* used) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (errno == ERANGE && std::isinf(v)) throw std::out_of_range("parse_number: " + s);
    *used = size_t(end - s.c_str());
    return v;
  });
}

std::optional<bool> parse_bool(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return std::nullopt;
}

}  // namespace titan
