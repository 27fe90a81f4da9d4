#include "titan/ops/init/init.h"

#include <cmath>

#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

void normal_init(Tensor& out, uint64_t stream, double std, double bound, int64_t begin) {
  TITAN_CHECK(out.dtype() == DType::F32 && out.is_contiguous(), "normal_init: out ", out.str(),
              " must be a contiguous f32 tensor");
  TITAN_CHECK(std::isfinite(std) && std >= 0, "normal_init: std ", std, " must be finite and >= 0");
  // A bound of at least one std keeps the redraws few (32 % of values fall outside one std).
  TITAN_CHECK(std::isfinite(bound) && (bound == 0 || bound >= std), "normal_init: bound ", bound,
              " must be 0 (no truncation) or at least std (", std, ")");
  TITAN_CHECK(begin >= 0, "normal_init: begin ", begin, " must be >= 0");
  if (out.numel() == 0) return;
  kernels::kernel_for<NormalInitKernel>("normal_init", out.device(), DType::F32)
      .draw(device_services(out.device()).context(), stream, std, bound, begin, out.numel(),
            out.data<float>());
}

}  // namespace titan::ops
