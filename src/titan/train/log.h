#pragma once
// The trainer's console log: one printf-style line to stdout, flushed at once (a run's progress is
// followed with `tail -f`).
namespace titan::train {

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace titan::train
