#pragma once
// The trainer's console log: one printf-style line to stdout, written at once (a run's progress is
// followed with `tail -f`), on the logging rank only.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan::train {

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// printf into a string (a line said later, once what it reports has happened).
std::string formatted(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Writes `text` to the console: standard output, until it turns out to be a pipe whose reader is
// gone (`titan train ... | tee log` after a Ctrl-C, which tee takes too; `| head`). From then on
// the console is standard error, said there once, so the run goes on and its last lines (the
// save a Ctrl-C asked for) reach the user; a training run never dies of its console. Callers ignore
// SIGPIPE while they may write (the trainer's StopSignals does).
void console_write(std::string_view text);
// Carriage return + erase to the end of the line: what a progress line starts and ends with.
inline constexpr std::string_view kConsoleEraseLine = "\r\033[K";
// The same from a signal handler: write(2) only (console_write flushes stdio's buffer of stdout
// first, so that the lines of a caller that printed through stdio keep their order).
void console_write_from_signal_handler(std::string_view text);

// From a signal handler: erases the console's unfinished line (a progress line drawn without a
// newline, on a terminal) so that the handler's line starts at the margin; writes nothing when the
// last line written was finished or erased (a log file gets no escape codes).
void console_clear_unfinished_line_from_signal_handler();

// In a job of many ranks only the logging rank prints: the others call set_console_output(false).
void set_console_output(bool enabled);
bool console_output();

// Only the logging rank prints while it lives (a run, an evaluation); the setting before comes back.
class ConsoleOfRank {
 public:
  explicit ConsoleOfRank(bool logging_rank) : before_(console_output()) {
    set_console_output(logging_rank && before_);
  }
  ~ConsoleOfRank() { set_console_output(before_); }
  ConsoleOfRank(const ConsoleOfRank&) = delete;
  ConsoleOfRank& operator=(const ConsoleOfRank&) = delete;

 private:
  bool before_;
};

// Seconds from `start` to now, for the durations the log reports.
double seconds_since(std::chrono::steady_clock::time_point start);

// "1 step", "3 steps", "2 batches": a count with its noun in the number the count asks for
// (`plural` when it is not the noun + "s").
std::string counted(int64_t n, const std::string& noun, const std::string& plural = "");

// Steps for a message, comma-separated: a long list (a run's every committed checkpoint, every step
// of a diverged metric) reads as its first and last six with the count between ("1, 2, 3, 4, 5, 6,
// ... (88 more), 95, ...").
std::string listed_steps(const std::vector<int64_t>& steps);

}  // namespace titan::train
