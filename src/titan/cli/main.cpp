// `titan <command> [args]`: dispatches to the commands registered in cli/*_cmd.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "titan/cli/command.h"
#include "titan/core/suggest.h"
#include "titan/dist/communicator.h"

namespace titan::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

std::string error_for_the_user(const std::string& message, const std::string& command) {
  const char* keep = std::getenv("TITAN_ERROR_LOCATION");
  static const std::regex location("[A-Za-z0-9_./+-]+\\.(cpp|cu|cuh|h|hpp):[0-9]+: ");
  std::string text =
      keep && std::strcmp(keep, "1") == 0 ? message : std::regex_replace(message, location, "");
  // The line already starts "titan <command>: error: ": a message that names the command again
  // ("titan export: ", "titan export --out: ", "titan debug dump --out: ", the library's "export: ")
  // drops that repetition.
  if (!command.empty())
    for (const std::string& prefix : {"titan " + command + ": ", "titan " + command + " ", command + ": "})
      if (text.rfind(prefix, 0) == 0) {
        text.erase(0, prefix.size());
        break;
      }
  return text;
}
}  // namespace titan::cli

static void print_usage(FILE* out) {
  auto commands = titan::cli::command_registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(out, "usage: titan <command> [options]\n\ncommands:\n");
  for (auto& c : commands) std::fprintf(out, "  %-14s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(out, "\n`titan <command> --help` (or `titan help <command>`) describes each command.\n");
}

// A process started with standard input, output or error closed (`titan train >&-`, some daemon and
// cron set-ups) would hand those numbers to the first files it opens: the run's lock file, a
// checkpoint or an export would then receive the console's lines. Each closed one is opened on
// /dev/null first (open takes the lowest free number: the one just found closed).
static void keep_standard_descriptors_open() {
  for (const int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO})
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF)
      open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
}

// Whether the command would do its work (write its output) once per rank: not for its --help, nor
// for `version`, which a job may run on every host to compare builds.
static bool writes_as_one_process(const std::string& name, const std::vector<char*>& args) {
  if (name == "version") return false;
  return std::none_of(args.begin() + 2, args.end(),
                      [](const char* a) { return !std::strcmp(a, "--help") || !std::strcmp(a, "-h"); });
}

// Whether a launcher started this process itself (its parent is mpirun, an Open MPI or PRRTE daemon,
// or Slurm's step daemon), not a script a launcher started that then runs titan: the launcher's
// environment reaches such a script's children too (rank 0 of `mpirun -np 4 job.sh` may export).
static bool started_by_launcher_itself() {
  std::ifstream comm("/proc/" + std::to_string(getppid()) + "/comm");
  std::string parent;
  std::getline(comm, parent);
  for (const char* launcher : {"mpirun", "mpiexec", "orterun", "prterun", "orted", "prted", "slurmstepd"})
    if (parent.rfind(launcher, 0) == 0) return true;
  return false;
}

int main(int argc, char** argv) {
  keep_standard_descriptors_open();
  std::vector<char*> args(argv, argv + argc);
  // `titan help <command>` is `titan <command> --help`; `titan help` alone, the usage.
  static char help_flag[] = "--help";
  if (argc == 3 && std::strcmp(argv[1], "help") == 0) args = {argv[0], argv[2], help_flag};
  if (args.size() < 2 || !std::strcmp(args[1], "--help") || !std::strcmp(args[1], "-h") ||
      !std::strcmp(args[1], "help")) {
    print_usage(args.size() < 2 ? stderr : stdout);
    return args.size() < 2 ? 2 : 0;
  }
  // `titan --version` is `titan version`, the spelling most tools accept.
  const std::string name = std::strcmp(args[1], "--version") == 0 ? "version" : args[1];
  std::vector<std::string> names;
  for (auto& c : titan::cli::command_registry()) {
    names.push_back(c.name);
    if (c.name != name) continue;
    if (const std::optional<int> ranks = titan::dist::launcher_world_size();
        !c.across_ranks && ranks && *ranks > 1 && writes_as_one_process(name, args) &&
        started_by_launcher_itself()) {
      // Said once (by the launcher's rank 0); every rank stops.
      std::string over_ranks;
      for (auto& other : titan::cli::command_registry())
        if (other.across_ranks) over_ranks += (over_ranks.empty() ? "titan " : ", ") + other.name;
      if (titan::dist::launcher_rank().value_or(0) == 0)
        std::fprintf(
            stderr,
            "titan %s: error: it runs as one process, and the MPI launcher started %d: run it without "
            "mpirun (the commands that run over ranks: %s)\n",
            name.c_str(), *ranks, over_ranks.c_str());
      return 1;
    }
    try {
      return c.run(int(args.size()) - 1, args.data() + 1);
    } catch (const std::exception& e) {
      // A subcommand's error names it ("titan debug dump --out: ..."): the line names the two words
      // together ("titan debug dump: error: --out: ..."), not "titan debug: error: dump --out: ...".
      std::string command = name;
      if (args.size() > 2 && args[2][0] != '-') {
        const std::string both = name + " " + args[2], message = titan::cli::error_for_the_user(e.what());
        for (const std::string& named : {"titan " + both + ": ", "titan " + both + " ", both + ": "})
          if (message.rfind(named, 0) == 0) command = both;
      }
      std::fprintf(stderr, "titan %s: error: %s\n", command.c_str(),
                   titan::cli::error_for_the_user(e.what(), command).c_str());
      return 1;
    }
  }
  // Names other tools give what titan does under another command.
  static const std::map<std::string, std::string> elsewhere = {
      {"chat", "titan generate --interactive"}, {"convert", "titan export"}, {"inference", "titan generate"}};
  const auto other = elsewhere.find(name);
  std::fprintf(stderr, "titan: unknown command '%s'%s\n\n", name.c_str(),
               other != elsewhere.end() ? ("; did you mean '" + other->second + "'?").c_str()
                                        : titan::suggestion(name, names).c_str());
  print_usage(stderr);
  return 2;
}
