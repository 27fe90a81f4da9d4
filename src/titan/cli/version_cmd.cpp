// titan version (also `titan --version`): the titan commit, compiler, libraries and machine.
#include <cstdio>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/train/versions.h"

namespace titan::cli {
namespace {

int version_main(int argc, char** argv) {
  ArgParser p("version", "The titan commit, compiler, oneDNN, OpenBLAS, MPI (CUDA, GPU) and CPU of this build.");
  p.flag("json", "print one JSON object instead of lines");
  p.flag("cuda", "load the CUDA backend first, so the CUDA runtime, driver and GPUs are listed");
  if (!p.parse(argc, argv)) return 0;
  if (p.has("cuda")) {
    const std::string why = load_device_backend(Device::CUDA);
    TITAN_CHECK(why.empty(), "titan version --cuda: ", why);
  }
  auto versions = train::collect_versions();
  if (p.has("json"))
    std::printf("%s\n", train::versions_json(versions).dump(2).c_str());
  else
    std::printf("%s\n", train::versions_text(versions, "").c_str());
  return 0;
}

TITAN_COMMAND("version", "the titan commit, compiler, libraries and CPU of this build (also --version)",
              version_main);

}  // namespace
}  // namespace titan::cli
