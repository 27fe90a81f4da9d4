#pragma once
// The globs of module names that [kernels] substitutions select (kernels/substitution.h) and that
// the job config checks as it reads them (train/job_config.cpp). (Dataset file globs are the C
// library's glob(3), data/dataset.cpp: they name files.)
#include <string>

namespace titan {

// fnmatch-style glob where '*' also matches '.', so "layers.*.moe" matches "layers.12.moe".
// '?' is one character, "[0-3]" / "[13]" one of a set, "[!0]" one character not in the set.
bool glob_match(const std::string& pattern, const std::string& name);
// "" when `pattern` is a glob glob_match reads as meant, else why not (an unterminated '[', an
// empty "[]" or "[!]", a reversed range "[3-0]": each would match nothing, silently).
std::string glob_problem(const std::string& pattern);

}  // namespace titan
