#include "test_util.h"

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace titan::testing {

std::filesystem::path source_dir() { return TITAN_SOURCE_DIR; }
std::filesystem::path binary_dir() { return TITAN_BINARY_DIR; }
std::filesystem::path titan_binary() { return binary_dir() / "bin" / "titan"; }
std::filesystem::path shared_dir() { return source_dir().parent_path() / "shared"; }
std::filesystem::path assets_dir() { return source_dir() / "assets"; }
std::filesystem::path fixtures_dir() { return source_dir() / "tests" / "fixtures"; }

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = binary_dir() / "test_tmp" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int run_command(const std::string& cmd, std::string* output) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0)
    if (output) output->append(buf.data(), n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace titan::testing
