#include "titan/core/parse.h"

namespace titan {

std::optional<int64_t> parse_int(const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size()) return std::nullopt;
  return v;
}

}  // namespace titan
