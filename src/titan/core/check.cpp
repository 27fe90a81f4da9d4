#include "titan/core/check.h"

#include <cstring>

namespace titan::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  // Keep the path short: from "src/" on, so messages read the same on every machine.
  const char* shown = std::strstr(file, "src/titan/");
  throw Error(std::string(shown ? shown : file) + ":" + std::to_string(line) + ": " + msg);
}

}  // namespace titan::detail
