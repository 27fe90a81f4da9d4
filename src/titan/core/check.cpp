#include "titan/core/check.h"

#include <cstring>

namespace titan::detail {

std::string located(const char* file, int line, const std::string& msg) {
  const char* shown = std::strstr(file, "src/titan/");
  return std::string(shown ? shown : file) + ":" + std::to_string(line) + ": " + msg;
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(located(file, line, msg));
}

}  // namespace titan::detail
