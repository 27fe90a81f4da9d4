#pragma once
// Typed values from text (config keys, command-line options, --shapes): the whole string must be
// the value, else nullopt, so each caller words its own error naming the key and the rule.
#include <cstdint>
#include <optional>
#include <string>

namespace titan {

std::optional<int64_t> parse_int(const std::string& text);    // "42", "-7"; not "", "4x", "1e3"
std::optional<double> parse_number(const std::string& text);  // "3e-4", "0.5", "2"
std::optional<bool> parse_bool(const std::string& text);      // "true", "false"; not "1", "True"

}  // namespace titan
