#include "titan/train/log.h"

#include <cstdarg>
#include <cstdio>

namespace titan::train {

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace titan::train
