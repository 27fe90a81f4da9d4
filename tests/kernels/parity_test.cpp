// Every registered non-reference CPU variant against its reference, through the parity library, on
// small shapes (odd sizes included), in f32, bf16 and f64, forward and backward.
#include "titan/kernels/parity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "titan/kernels/registry.h"

namespace titan::kernels {
namespace {

// Small versions of each op's default shapes: odd sizes, a GQA group, a vocabulary chunk that
// does not divide V, more MoE assignments than experts, a grad_norm longer than one 64Ki block.
const std::map<std::string, std::vector<std::vector<int64_t>>> kSmallShapes = {
    {"linear", {{1, 1, 1}, {7, 33, 19}, {33, 17, 70}}},
    {"attention", {{1, 1, 2, 1, 8}, {2, 19, 4, 2, 16}, {1, 70, 2, 1, 25}}},
    {"rms_norm", {{1, 1}, {5, 7}, {9, 130}}},
    {"rope", {{1, 1, 1, 2}, {2, 7, 3, 10}, {1, 9, 2, 64}}},
    {"swiglu", {{1}, {37}, {1031}}},
    {"embedding", {{1, 1, 1}, {41, 37, 19}}},
    {"cross_entropy", {{1, 1}, {7, 301}}},
    {"linear_cross_entropy", {{1, 1, 1, 1}, {17, 300, 19, 128}, {16, 100, 8, 7}}},
    {"router_topk", {{1, 1, 1}, {37, 8, 2}, {9, 64, 8}}},
    {"moe_experts", {{1, 8, 4, 3, 1}, {5, 6, 4, 4, 2}, {37, 24, 20, 7, 3}}},
    {"adamw", {{1}, {1000}}},
    {"grad_norm", {{1}, {70001}}},
    {"add", {{1}, {37}}},
};

TEST(KernelParity, EveryVariantMatchesItsReference) {
  ParityOptions o;
  o.shapes = kSmallShapes;
  std::set<std::string> covered;
  int passed = 0;
  for (const ParityResult& r : run_parity(o)) {
    SCOPED_TRACE(format_parity_result(r));
    covered.insert(r.op + "/" + r.variant + "/" + std::string(dtype_name(r.dtype)));
    if (r.status == ParityStatus::Skipped) {
      EXPECT_FALSE(r.note.empty()) << "a skipped variant must say why";
      continue;
    }
    EXPECT_EQ(r.status, ParityStatus::Pass) << r.note;
    EXPECT_TRUE(r.compared);
    EXPECT_TRUE(std::isfinite(r.max_abs) && std::isfinite(r.max_rel));
    ++passed;
  }
  EXPECT_GT(passed, 0);
  // Nothing registered is left out.
  for (const KernelEntry& e : all_kernels()) {
    if (e.device != Device::CPU || e.variant == "reference") continue;
    EXPECT_TRUE(covered.count(e.op + "/" + e.variant + "/" + std::string(dtype_name(e.dtype))))
        << e.op << " " << e.variant << " " << dtype_name(e.dtype);
  }
}

// Every op the harness drives is exercised above.
TEST(KernelParity, SmallShapesCoverEveryDriver) {
  for (const std::string& op : parity_ops()) {
    EXPECT_FALSE(parity_shape_dims(op).empty()) << op;
    EXPECT_TRUE(kSmallShapes.count(op)) << op << " has no small shapes in this test";
  }
}

}  // namespace
}  // namespace titan::kernels
