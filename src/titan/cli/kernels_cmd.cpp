// titan kernels list : every op with its registered devices, dtypes and variants.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/kernels/registry.h"

namespace titan::cli {
namespace {

int kernels_list() {
  // op -> variant -> (device/dtype list, description)
  std::map<std::string, std::map<std::string, std::pair<std::vector<std::string>, std::string>>> table;
  for (const auto& e : kernels::all_kernels()) {
    auto& slot = table[e.op][e.variant];
    std::string dd = std::string(device_name(e.device)) + "/" + std::string(dtype_name(e.dtype));
    if (e.available) {
      std::string why = e.available();
      if (!why.empty()) dd += " (unavailable here: " + why + ")";
    }
    slot.first.push_back(dd);
    if (slot.second.empty()) slot.second = e.description;
  }
  std::printf("%-22s %-14s %-34s %s\n", "op", "variant", "devices/dtypes", "implementation");
  for (auto& [op, variants] : table)
    for (auto& [variant, info] : variants) {
      std::string dd;
      for (auto& s : info.first) dd += (dd.empty() ? "" : " ") + s;
      std::printf("%-22s %-14s %-34s %s\n", op.c_str(), variant.c_str(), dd.c_str(), info.second.c_str());
    }
  std::printf("\n%zu ops, %zu kernels. \"default\" is used unless a [kernels] substitution picks another variant;\n"
              "\"reference\" is what every other variant is tested against.\n",
              table.size(), kernels::all_kernels().size());
  return 0;
}

int kernels_main(int argc, char** argv) {
  std::string sub = argc >= 2 ? argv[1] : "";
  if (sub == "list") {
    ArgParser p("kernels list", "Prints every op with its registered devices, dtypes and variants.");
    if (!p.parse(argc - 1, argv + 1)) return 0;
    return kernels_list();
  }
  std::fprintf(stderr, "usage: titan kernels list\n");
  return sub == "--help" || sub == "-h" ? 0 : 2;
}

TITAN_COMMAND("kernels", "list the registered kernels (op, device, dtype, variant)", kernels_main);

}  // namespace
}  // namespace titan::cli
