// titan report RUN_DIR|RUN_DIR/metrics.jsonl [...] [--out report.html]
#include <cstdio>
#include <filesystem>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/io/path_guard.h"
#include "titan/train/report.h"

namespace titan::cli {
namespace {

int report_main(int argc, char** argv) {
  ArgParser p("report RUN_DIR [RUN_DIR ...]",
              "One self-contained HTML page charting the runs' metrics (overlaid), with their configs.");
  p.option("out", "the page to write", "report.html").takes_positional();
  if (!p.parse(argc, argv)) return 0;
  TITAN_CHECK(!p.positional().empty(),
              "titan report: give one or more run folders (a run's job.dump_folder, or its metrics.jsonl)");
  // A run's folder, or its metrics.jsonl.
  std::vector<std::filesystem::path> dirs;
  for (const std::string& given : p.positional()) dirs.push_back(train::run_folder(given));
  const std::filesystem::path out = p.get("out");
  // The page may go into a run folder, but never over what the report reads.
  std::vector<std::filesystem::path> inputs;
  for (const auto& d : dirs)
    for (const char* f : {"metrics.jsonl", "run_info.json", "check.json"}) inputs.push_back(d / f);
  io::check_output_file(out, inputs, "titan report --out");
  train::write_report(dirs, out);
  std::printf("report: wrote %s (%zu run%s)\n", out.c_str(), dirs.size(), dirs.size() == 1 ? "" : "s");
  return 0;
}

TITAN_COMMAND("report", "an HTML page charting one or more runs (titan report RUN_DIR ...)", report_main);

}  // namespace
}  // namespace titan::cli
