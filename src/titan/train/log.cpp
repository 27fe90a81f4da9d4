#include "titan/train/log.h"

#include <cstdarg>
#include <cstdio>

namespace titan::train {

namespace {
bool g_console = true;
}

void set_console_output(bool enabled) {
  g_console = enabled;
}
bool console_output() {
  return g_console;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string counted(int64_t n, const std::string& noun, const std::string& plural) {
  return std::to_string(n) + " " + (n == 1 ? noun : plural.empty() ? noun + "s" : plural);
}

void say(const char* fmt, ...) {
  if (!g_console) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace titan::train
