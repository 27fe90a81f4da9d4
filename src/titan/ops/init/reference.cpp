// normal_init on the CPU: normal_draw.h's pairs in chunks over the OpenMP threads. The draw is
// counter-based, so this loop is the definition (the reference) and any split of it gives the
// same bits.
#include <algorithm>

#include "titan/kernels/registry.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan::ops {
namespace {

void normal_init_ref(const KernelContext&, uint64_t stream, double std, double bound, int64_t begin,
                     int64_t n, float* out) {
  // Chunks of 64 Ki elements over every thread: the largest parameter (a 0.6B model's 155M-element
  // embedding) does not set the pace alone.
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t end = begin + n, first = begin / kChunk, last = (end - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (last > first)
  for (int64_t c = first; c <= last; ++c) {
    const int64_t b = std::max(begin, c * kChunk), e = std::min(end, (c + 1) * kChunk);
    for (int64_t j = b; j < e;) {  // element j is component j % 2 of pair j / 2
      float pair[2];
      init_draw::draw_pair(stream, std, bound, uint64_t(j / 2), pair);
      for (int64_t k = j % 2; k < 2 && j < e; ++k, ++j) out[j - begin] = pair[k];
    }
  }
}

const bool normal_init_kernels_registered = kernels::register_kernels(
    "normal_init", Device::CPU,
    {{DType::F32, "reference", "polar-method pairs in 64 Ki-element chunks over the threads",
      NormalInitKernel{normal_init_ref}}});

}  // namespace
}  // namespace titan::ops
