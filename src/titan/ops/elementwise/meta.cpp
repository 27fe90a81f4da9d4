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

const bool add_registered =
    kernels::register_meta_kernel("add", {DType::F32, DType::BF16, DType::F64}, add_meta);
const bool add_inplace_registered =
    kernels::register_meta_kernel("add_inplace", {DType::F32, DType::BF16, DType::F64}, accumulate_meta);
const bool scale_inplace_registered =
    kernels::register_meta_kernel("scale_inplace", {DType::F32, DType::BF16, DType::F64}, scale_meta);
const bool sum_registered =
    kernels::register_meta_kernel("sum", {DType::F32, DType::BF16, DType::F64}, sum_meta);
const bool index_registered = kernels::register_meta_kernel("index", {DType::I64}, index_meta);

}  // namespace
}  // namespace titan::ops
