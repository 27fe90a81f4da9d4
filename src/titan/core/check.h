#pragma once
// Error reporting. Every failed check throws titan::Error whose message starts
// with file:line and names the values that broke the rule, e.g.
//   TITAN_CHECK(a.dim() == 2, "matmul: a must be 2-D, got shape ", a.shape_str());
#include <sstream>
#include <stdexcept>
#include <string>

namespace titan {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// "src/titan/core/x.cpp:12: msg": the message every check throws (the path from src/ on, so that
// messages read the same on every machine); for errors of a type of their own.
std::string located(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace titan

#define TITAN_CHECK(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::titan::detail::throw_error(__FILE__, __LINE__, ::titan::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TITAN_FAIL(...) ::titan::detail::throw_error(__FILE__, __LINE__, ::titan::detail::concat(__VA_ARGS__))
