// Every registered non-reference CPU variant against its reference, through the parity library, on
// small shapes (odd sizes included), in f32, bf16 and f64, forward and backward.
#include "titan/kernels/parity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "titan/kernels/registry.h"
#include "titan/kernels/spec.h"

namespace titan::kernels {
namespace {

// Each op's small shapes (its spec's small_shapes).
std::map<std::string, std::vector<Dims>> small_shapes() {
  std::map<std::string, std::vector<Dims>> shapes;
  for (const OpSpec& spec : op_specs()) shapes[spec.op] = spec.small_shapes;
  return shapes;
}

TEST(KernelParity, EveryVariantMatchesItsReference) {
  ParityOptions o;
  o.shapes = small_shapes();
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

// Every op the harness drives is exercised above, on valid shapes of its own dimensions.
TEST(KernelParity, SmallShapesCoverEveryDriver) {
  for (const std::string& op : parity_ops()) {
    EXPECT_FALSE(parity_shape_dims(op).empty()) << op;
    const OpSpec* spec = find_op_spec(op);
    ASSERT_TRUE(spec) << op;
    EXPECT_FALSE(spec->small_shapes.empty()) << op << " has no small shapes in its spec";
    for (const Dims& d : spec->small_shapes) {
      EXPECT_GE(d.size(), spec->required_dims) << op;
      EXPECT_LE(d.size(), spec->dims.size()) << op;
      if (spec->check) {
        EXPECT_EQ(spec->check(d), "") << op;
      }
    }
  }
}

}  // namespace
}  // namespace titan::kernels
