// titan kernels list   : every op with its registered devices, dtypes and variants.
// titan kernels parity : every non-reference variant against the reference (docs/kernels.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/suggest.h"
#include "titan/kernels/parity.h"
#include "titan/kernels/registry.h"

namespace titan::cli {
namespace {

int kernels_list() {
  // The CUDA kernels are listed when the CUDA backend library loads (it need not find a GPU).
  const std::string cuda_not_loaded = load_device_backend(Device::CUDA);
  // One row per (op, variant, device, implementation) with its dtypes: the meta device's "default"
  // is a shape computation, the CUDA one a kernel, and a device's bf16 kernel may not be its f32 one.
  std::map<std::tuple<std::string, std::string, std::string, std::string>, std::string> table;
  // Why kernels cannot run here, each reason once (a missing GPU would otherwise repeat on every
  // CUDA kernel): a dtype carries its reason's number, "bf16[2]", the footer prints the reasons.
  std::vector<std::string> reasons;
  std::set<std::string> ops;
  for (const auto& e : kernels::all_kernels()) {
    ops.insert(e.op);
    std::string& dtypes = table[{e.op, e.variant, std::string(device_name(e.device)), e.description}];
    std::string dtype(dtype_name(e.dtype));
    if (const std::string why = e.available ? e.available() : ""; !why.empty()) {
      auto it = std::find(reasons.begin(), reasons.end(), why);
      if (it == reasons.end()) it = reasons.insert(reasons.end(), why);
      dtype += "[" + std::to_string(it - reasons.begin() + 1) + "]";
    }
    dtypes += (dtypes.empty() ? "" : " ") + dtype;
  }
  std::printf("%-21s %-11s %-6s %-17s %s\n", "op", "variant", "device", "dtypes", "implementation");
  for (const auto& [key, dtypes] : table) {
    const auto& [op, variant, device, description] = key;
    std::printf("%-21s %-11s %-6s %-17s %s\n", op.c_str(), variant.c_str(), device.c_str(), dtypes.c_str(),
                description.c_str());
  }
  std::printf(
      "\n%zu ops, %zu kernels. \"default\" is used unless a [kernels] substitution picks another variant;\n"
      "\"reference\" is what every other variant is tested against.\n",
      ops.size(), kernels::all_kernels().size());
  for (size_t i = 0; i < reasons.size(); ++i)
    std::printf("[%zu] unavailable here: %s\n", i + 1, reasons[i].c_str());
  if (!cuda_not_loaded.empty()) std::printf("No cuda kernels listed: %s.\n", cuda_not_loaded.c_str());
  return 0;
}

std::string shapes_help() {
  std::string h = "shapes per op, e.g. 'linear=7x33x19,64x64x64;rope=1x9x3x8' (dims:";
  for (auto& op : kernels::parity_ops()) h += " " + op + " " + kernels::parity_shape_dims(op) + ";";
  h.back() = ')';
  return h;
}

int kernels_parity(int argc, char** argv) {
  ArgParser p(
      "kernels parity",
      "Runs every registered variant on a device (on cpu: every non-reference variant) against the CPU\n"
      "reference on seeded random inputs, forward and backward; prints max abs / max rel difference per\n"
      "op, variant, dtype and shape and exits 1 when any exceeds the op's tolerance (the op's spec.cpp,\n"
      "docs/kernels.md).");
  p.option("op", "only this op (default: every op)")
      .option("dtype", "f32, bf16 or f64 (default: all three)")
      .option("shapes", shapes_help())
      .option("seed", "seed of the random inputs", "1")
      .option("device", "whose variants to check: cpu or cuda", "cpu");
  if (!p.parse(argc, argv)) return 0;
  // TITAN_KERNEL_ISA is read where a tiered kernel first runs: a bad value is an error before any
  // line, whichever ops are checked (an op without tiers would otherwise pass under it).
  cpu::kernel_isa();
  kernels::ParityOptions o;
  if (auto op = p.get_optional("op")) o.op = *op;
  if (auto dt = p.get_optional("dtype")) {
    DType d = dtype_from_name(*dt);
    TITAN_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F64, "titan kernels parity: --dtype ", *dt,
                ": expected f32, bf16 or f64");
    o.dtypes = {d};
  }
  const std::string device = p.get("device");
  TITAN_CHECK(device == "cpu" || device == "cuda", "titan kernels parity: --device ", device,
              ": expected cpu or cuda", device_suggestion(device));
  o.device = device == "cpu" ? Device::CPU : Device::CUDA;
  if (auto sh = p.get_optional("shapes")) o.shapes = kernels::parse_parity_shapes(*sh);
  o.seed = uint64_t(p.get_int("seed", 0));

  int passed = 0, failed = 0, skipped = 0;
  std::string skipped_because;  // the first skip's reason (no CUDA device, a missing ISA)
  kernels::run_parity(o, [&](const kernels::ParityResult& r) {
    std::printf("%s\n", kernels::format_parity_result(r).c_str());
    std::fflush(stdout);
    passed += r.status == kernels::ParityStatus::Pass;
    failed += r.status == kernels::ParityStatus::Fail;
    skipped += r.status == kernels::ParityStatus::Skipped;
    if (r.status == kernels::ParityStatus::Skipped && skipped_because.empty()) skipped_because = r.note;
  });
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  // A check that compared nothing (no kernel for the op and dtype, every case skipped: no GPU) is
  // not a pass; the summary says which of the two, as the SKIPPED lines above it may have scrolled.
  if (!failed && !passed)
    std::fprintf(stderr, "titan kernels parity: nothing was compared (%d skipped): not a pass%s\n", skipped,
                 skipped > 0 ? (skipped_because.empty() ? std::string() : ": " + skipped_because).c_str()
                 : o.op.empty()
                     ? ""
                     : (" ('" + o.op + "' has no " + device +
                        " kernel besides its reference for these dtypes: `titan kernels list` shows them)")
                           .c_str());
  return failed || !passed ? 1 : 0;
}

int kernels_main(int argc, char** argv) {
  std::string sub = argc >= 2 ? argv[1] : "";
  if (sub == "list") {
    ArgParser p("kernels list", "Prints every op with its registered devices, dtypes and variants.");
    if (!p.parse(argc - 1, argv + 1)) return 0;
    return kernels_list();
  }
  if (sub == "parity") return kernels_parity(argc - 1, argv + 1);
  const bool help = sub == "--help" || sub == "-h";
  if (!help)
    std::fprintf(stderr, "titan kernels: %s\n",
                 sub.empty()
                     ? "a subcommand is needed"
                     : ("unknown subcommand '" + sub + "'" + suggestion(sub, {"list", "parity"})).c_str());
  std::fprintf(stderr,
               "usage: titan kernels list | titan kernels parity [--op NAME] [--dtype f32|bf16|f64] "
               "[--shapes SPEC] [--seed N] [--device cpu|cuda]\n");
  return help ? 0 : 2;
}

TITAN_COMMAND("kernels", "list the registered kernels; check every variant against the reference (parity)",
              kernels_main);

}  // namespace
}  // namespace titan::cli
