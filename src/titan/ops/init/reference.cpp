// normal_init on the CPU: normal_draw.h's pairs in chunks over the OpenMP threads. The draw is
// counter-based, so this loop is the definition (the reference) and any split of it gives the
// same bits.
#include <algorithm>
#include <functional>

#include "titan/kernels/registry.h"
#include "titan/ops/init/cpu.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan::ops {

void for_each_init_chunk(int64_t begin, int64_t n, const std::function<void(int64_t b, int64_t e)>& draw) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t end = begin + n, first = begin / kChunk, last = (end - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (last > first)
  for (int64_t c = first; c <= last; ++c) draw(std::max(begin, c * kChunk), std::min(end, (c + 1) * kChunk));
}

namespace {

void normal_init_ref(const KernelContext&, uint64_t stream, double std, double bound, int64_t begin,
                     int64_t n, float* out) {
  for_each_init_chunk(begin, n, [&](int64_t b, int64_t e) {
    init_draw::draw_elements(stream, std, bound, b, e, out + (b - begin));
  });
}

const bool normal_init_kernels_registered = kernels::register_kernels(
    "normal_init", Device::CPU,
    {{DType::F32, "reference", "polar-method pairs in 64 Ki-element chunks over the threads",
      NormalInitKernel{normal_init_ref}}});

}  // namespace
}  // namespace titan::ops
