#include "titan/train/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace titan::train {

namespace {
bool g_console = true;
std::atomic<int> g_console_fd{STDOUT_FILENO};  // STDERR_FILENO once standard output broke
// Whether the last text written left visible characters after its last newline (a progress line).
std::atomic<bool> g_unfinished_line{false};

// All of `text` to `fd`; false on an error, errno saying which. Async-signal-safe.
bool write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(size_t(n));
  }
  return true;
}
}  // namespace

void console_write_from_signal_handler(std::string_view text) {
  const int saved_errno = errno;  // of whatever the caller (or the interrupted thread) was doing
  // Set before the text is out: a signal that comes while it is written erases a line too many
  // (harmless) rather than writing after an unfinished one.
  if (!text.empty()) g_unfinished_line.store(text.back() != '\n' && !text.ends_with(kConsoleEraseLine));
  int fd = g_console_fd.load();
  if (!write_all(fd, text) && fd == STDOUT_FILENO && errno == EPIPE) {
    // The first writer to find the pipe gone says so; the text that found it follows there.
    if (g_console_fd.compare_exchange_strong(fd, STDERR_FILENO))
      write_all(STDERR_FILENO,
                "titan: standard output is a pipe whose reader has exited (broken pipe): the run goes on, "
                "and its console lines continue here, on standard error\n");
    write_all(STDERR_FILENO, text);
  }
  // Any other failure (a hung-up terminal, a full disk under a redirect) leaves nothing to do: the
  // run's record is metrics.jsonl.
  errno = saved_errno;
}

void console_clear_unfinished_line_from_signal_handler() {
  if (g_unfinished_line.load()) console_write_from_signal_handler(kConsoleEraseLine);
}

void console_write(std::string_view text) {
  std::fflush(stdout);
  console_write_from_signal_handler(text);
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

std::string listed_steps(const std::vector<int64_t>& steps) {
  std::string list;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps.size() > 12 && k == 6) {
      list += ", ... (" + std::to_string(steps.size() - 12) + " more)";
      k = steps.size() - 6;
    }
    list += (list.empty() ? "" : ", ") + std::to_string(steps[k]);
  }
  return list;
}

namespace {
std::string vformatted(const char* fmt, va_list ap) {
  va_list measure;
  va_copy(measure, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, measure);
  va_end(measure);
  std::string out(size_t(std::max(n, 0)), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, ap);
  return out;
}
}  // namespace

std::string formatted(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string out = vformatted(fmt, ap);
  va_end(ap);
  return out;
}

void say(const char* fmt, ...) {
  if (!g_console) return;
  va_list ap;
  va_start(ap, fmt);
  std::string line = vformatted(fmt, ap);
  va_end(ap);
  console_write(line + '\n');
}

}  // namespace titan::train
