#pragma once
// Subcommands of the `titan` binary register themselves with TITAN_COMMAND in
// their own cli/<name>_cmd.cpp, so adding a command touches one file.
#include <functional>
#include <string>
#include <vector>

namespace titan::cli {

struct Command {
  std::string name;     // e.g. "train", "kernels list" is "kernels" with its own sub-dispatch
  std::string summary;  // one line for `titan --help`
  std::function<int(int argc, char** argv)> run;  // argv[0] is the command name
  // Runs as one job over the ranks an MPI launcher starts (train, eval, check); every other command
  // is one process, and under a launcher of several ranks would run once per rank, each racing the
  // others for the same output: it is refused there.
  bool across_ranks = false;
};

std::vector<Command>& command_registry();

// An error message as the command line prints it: without the source locations
// (`src/titan/x.cpp:12: `) every titan::Error carries for developers, nested ones included;
// TITAN_ERROR_LOCATION=1 keeps them. `command`: the message's own "titan <command>: " prefix is
// dropped (the error line already starts with it).
std::string error_for_the_user(const std::string& message, const std::string& command = "");

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, std::function<int(int, char**)> run,
                   bool across_ranks = false) {
    command_registry().push_back({std::move(name), std::move(summary), std::move(run), across_ranks});
  }
};

}  // namespace titan::cli

#define TITAN_COMMAND_CONCAT2(a, b) a##b
#define TITAN_COMMAND_CONCAT(a, b) TITAN_COMMAND_CONCAT2(a, b)
#define TITAN_COMMAND(name, summary, fn) \
  static ::titan::cli::CommandRegistrar TITAN_COMMAND_CONCAT(titan_command_, __LINE__)(name, summary, fn)
// A command that runs over the ranks an MPI launcher starts (Command::across_ranks).
#define TITAN_COMMAND_ACROSS_RANKS(name, summary, fn)                                                     \
  static ::titan::cli::CommandRegistrar TITAN_COMMAND_CONCAT(titan_command_, __LINE__)(name, summary, fn, \
                                                                                       true)
