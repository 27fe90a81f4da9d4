// normal_init on the meta device: nothing to draw (kernels/registry.h, register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/init/init.h"

namespace titan::ops {
namespace {

const NormalInitKernel normal_init_meta{
    [](const KernelContext&, uint64_t, double, double, int64_t, int64_t, float*) {}};
const bool normal_init_registered =
    kernels::register_meta_kernel("normal_init", {DType::F32}, normal_init_meta);

}  // namespace
}  // namespace titan::ops
