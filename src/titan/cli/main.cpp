// `titan <command> [args]`: dispatches to the commands registered in cli/*_cmd.cpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "titan/cli/command.h"
#include "titan/core/check.h"

namespace titan::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
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
      std::fprintf(stderr, "titan %s: error: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "titan: unknown command '%s'\n", argv[1]);
  print_usage();
  return 2;
}
