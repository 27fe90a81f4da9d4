// elementwise on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {
namespace {

const AddKernel add_meta{[](const KernelContext&, int64_t, const void*, const void*, void*) {}};
const AccumulateKernel accumulate_meta{[](const KernelContext&, int64_t, void*, const void*) {}};
const ScaleKernel scale_meta{[](const KernelContext&, int64_t, void*, double) {}};
const SumKernel sum_meta{[](const KernelContext&, int64_t, const void*) { return 0.0; }};
const IndexKernel index_meta{
    [](const KernelContext&, int64_t, const int64_t*, int64_t, int64_t, int64_t) { return int64_t(-1); },
    [](const KernelContext&, int64_t n, const int64_t*, int64_t) { return n; },
    [](const KernelContext&, int64_t, const int64_t*) { return int64_t(0); }};

const bool registered = [] {
  const auto floats = {DType::F32, DType::BF16, DType::F64};
  kernels::register_meta_kernel("add", floats, add_meta);
  kernels::register_meta_kernel("add_inplace", floats, accumulate_meta);
  kernels::register_meta_kernel("scale_inplace", floats, scale_meta);
  kernels::register_meta_kernel("sum", floats, sum_meta);
  kernels::register_meta_kernel("index", {DType::I64}, index_meta);
  return true;
}();

}  // namespace
}  // namespace titan::ops
