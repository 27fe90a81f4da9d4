// Every op kernel can be checked by `titan kernels parity`: the harness fails a non-reference kernel
// whose op registered no spec (kernels/spec.h), so each device's kernels must have one. The CUDA
// backend registers its kernels when its library loads, which needs no GPU: in a build with the
// backend this checks them too. (This program registers no test kernels of its own, unlike
// parity_harness_test.) The i64 index scans run under no floating dtype; cuda_ops_test tests them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/kernels/spec.h"

namespace titan {
namespace {

TEST(KernelSpecs, EveryNonReferenceKernelHasASpec) {
  const std::string cuda = load_device_backend(Device::CUDA);
  if (!cuda.empty())
    std::printf("CUDA backend not loaded (%s): checking the CPU and meta kernels\n", cuda.c_str());
  int64_t checked = 0;
  for (const kernels::KernelEntry& e : kernels::all_kernels()) {
    if (e.variant == "reference" || !dtype_is_float(e.dtype)) continue;
    EXPECT_NE(kernels::find_op_spec(e.op), nullptr)
        << e.op << " (" << device_name(e.device) << ", " << e.variant << ", " << dtype_name(e.dtype)
        << ") has no spec: its `titan kernels parity` line would be a FAIL";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace titan
