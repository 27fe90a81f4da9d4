// rope on CUDA (f32 and bf16): one thread per rotated pair (token, head, j < D/2), reading cos/sin
// from a device copy of the op's shared table (rope_table), so results are bit-identical to the
// CPU "default" and "reference" kernels (same f32 cos/sin, same roundings, no fused multiply-add).
// The device copy is made once per (theta, D) and replaced only when a longer table arrives (rows
// of a longer table equal the shorter table's rows).
#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/rope/rope.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

struct DeviceTable {
  double theta = 0;
  int64_t D = 0, positions = 0;
  float *cos = nullptr, *sin = nullptr;  // [positions, D/2] each
};

// The device copy of `table`'s rows (kept for the process; a few MiB per (theta, D)).
DeviceTable device_table(const KernelContext& ctx, const RopeTable& table) {
  static std::mutex mutex;
  static std::vector<DeviceTable> tables;
  std::lock_guard<std::mutex> lock(mutex);
  DeviceTable* slot = nullptr;
  for (auto& t : tables)
    if (t.theta == table.theta && t.D == table.D) slot = &t;
  if (slot && slot->positions >= table.positions) return *slot;
  if (!slot) slot = &tables.emplace_back(DeviceTable{table.theta, table.D, 0, nullptr, nullptr});
  const size_t bytes = table.cos.size() * sizeof(float);
  if (slot->cos) {  // stream-ordered frees: kernels already queued keep reading valid memory
    const size_t old = size_t(slot->positions * (slot->D / 2)) * sizeof(float);
    ctx.services->deallocate(slot->cos, old);
    ctx.services->deallocate(slot->sin, old);
  }
  slot->cos = static_cast<float*>(ctx.services->allocate(bytes));
  slot->sin = static_cast<float*>(ctx.services->allocate(bytes));
  ctx.services->copy_from_host(slot->cos, table.cos.data(), bytes);
  ctx.services->copy_from_host(slot->sin, table.sin.data(), bytes);
  slot->positions = table.positions;
  return *slot;
}

// Each pair (x1, x2) = (x[j], x[j + D/2]) becomes (x1 c - x2 s, x2 c + x1 s), each product rounded to
// Elem as torch does. The backward (kTranspose) is the transpose rotation, s -> -s, of f32 gradients
// (Elem = float: no rounding); negating s is exact, so x1 c + x2 s and x2 c - x1 s come out as if
// written directly.
// Threads: x over the pairs j of a row (a token's head), y over rows, so the row's token and its
// table row are found once per row, not by 64-bit divisions per pair.
template <class T, class Elem, bool kTranspose>
__global__ void rope_rotate_kernel(int64_t rows, int64_t H, int64_t D, const int64_t* pos, const float* cos_t,
                                   const float* sin_t, const Elem* x, Elem* y) {
  const int64_t half = D / 2;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
       row += int64_t(gridDim.x) * blockDim.y) {
    const int64_t table_row = pos[row / H] * half;
    const Elem* xr = x + row * D;
    Elem* yr = y + row * D;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      const float c = round_to<T>(cos_t[table_row + j]), s0 = round_to<T>(sin_t[table_row + j]);
      const float s = kTranspose ? -s0 : s0;
      const float x1 = load_f32(xr, j), x2 = load_f32(xr, j + half);
      store_f32(yr, j, __fadd_rn(round_to<Elem>(__fmul_rn(x1, c)), round_to<Elem>(-__fmul_rn(x2, s))));
      store_f32(yr, j + half, __fadd_rn(round_to<Elem>(__fmul_rn(x2, c)), round_to<Elem>(__fmul_rn(x1, s))));
    }
  }
}

// The forward (x, y of T) or the backward (dy, dx in f32).
template <class T, bool kBackward>
void rotate(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos,
            const RopeTable& table, const void* x, void* y) {
  using Elem = std::conditional_t<kBackward, float, T>;
  const int64_t rows = B * S * H, half = D / 2;
  if (rows == 0 || half == 0) return;
  const DeviceTable t = device_table(ctx, table);
  // A row's pairs on whole warps (head_dim 128: 64 threads, 4 rows a block of 256).
  const unsigned pair_threads = unsigned(std::min<int64_t>(kThreads, (half + 31) / 32 * 32));
  const dim3 block(pair_threads, unsigned(kThreads) / pair_threads);
  const unsigned blocks = unsigned(std::min<int64_t>((rows + block.y - 1) / block.y, 65536));
  rope_rotate_kernel<T, Elem, kBackward><<<blocks, block, 0, stream_of(ctx)>>>(
      rows, H, D, pos, t.cos, t.sin, static_cast<const Elem*>(x), static_cast<Elem*>(y));
  check_launch(kBackward ? "rope_backward_kernel" : "rope_forward_kernel");
}

const bool registered = cuda::register_float_kernels(
    "rope", "CUDA: thread per rotated pair, device copy of the shared cos/sin table",
    "CUDA: thread per rotated pair, device cos/sin table, bf16 arithmetic as torch",
    TITAN_FLOAT_KERNEL(RopeKernel, rotate<T, false>, rotate<T, true>, true));

}  // namespace
}  // namespace titan::ops
