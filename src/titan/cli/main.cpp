// `titan <command> [args]`: dispatches to the commands registered in cli/*_cmd.cpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <regex>
#include <string>

#include "titan/cli/command.h"
#include "titan/core/check.h"

namespace titan::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

std::string error_for_the_user(const std::string& message) {
  const char* keep = std::getenv("TITAN_ERROR_LOCATION");
  if (keep && std::strcmp(keep, "1") == 0) return message;
  static const std::regex location("[A-Za-z0-9_./+-]+\\.(cpp|cu|cuh|h|hpp):[0-9]+: ");
  return std::regex_replace(message, location, "");
}
}  // namespace titan::cli

static void print_usage() {
  auto commands = titan::cli::command_registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::printf("usage: titan <command> [options]\n\ncommands:\n");
  for (auto& c : commands) std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n`titan <command> --help` describes each command.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  // `titan --version` is `titan version`, the spelling most tools accept.
  const char* name = std::strcmp(argv[1], "--version") == 0 ? "version" : argv[1];
  for (auto& c : titan::cli::command_registry()) {
    if (c.name != name) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "titan %s: error: %s\n", argv[1],
                   titan::cli::error_for_the_user(e.what()).c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "titan: unknown command '%s'\n", argv[1]);
  print_usage();
  return 2;
}
