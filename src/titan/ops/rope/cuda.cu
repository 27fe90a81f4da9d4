// rope on CUDA (f32 and bf16): one thread per run of up to 4 rotated pairs of a token, across all
// of the token's heads, reading cos/sin once per token from a device copy of the op's shared table
// (rope_table), so results are bit-identical to the CPU "default" and "reference" kernels (same f32
// cos/sin, same roundings, no fused multiply-add).
// The device copy is made once per (theta, D) and replaced only when a longer table arrives (rows
// of a longer table equal the shorter table's rows).
#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "titan/backend/cuda/common.cuh"
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
// Elem as torch does. The backward (kTranspose) is the transpose rotation, s -> -s, of the gradients
// in f32 (Elem = float: no rounding); negating s is exact, so x1 c + x2 s and x2 c - x1 s come out as
// if written directly. x and y are stored as Store: Elem, or bf16 bits for bf16 activation
// gradients (dy widened exactly, dx rounded once as it is stored: bit for bit the f32 gradient
// rounded, as the CPU's).
// Threads: x over the pair vectors j (kVec consecutive pairs, one 4-, 8- or 16-byte access), y over
// tokens; each thread reads its cos/sin once per token and rotates that vector in every head, so
// the table is read once per token instead of once per head, with no 64-bit divisions.
template <class T, class Elem, class Store, bool kTranspose, int kVec>
__global__ void rope_rotate_kernel(int64_t tokens, int64_t H, int64_t D, const int64_t* __restrict__ pos,
                                   const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                   const Store* __restrict__ x, Store* __restrict__ y) {
  const int64_t half = D / 2, vectors = half / kVec;
  for (int64_t token = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; token < tokens;
       token += int64_t(gridDim.x) * blockDim.y) {
    const float* cos_row = cos_t + pos[token] * half;
    const float* sin_row = sin_t + pos[token] * half;
    for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
      float c[kVec], s[kVec];
      load_vec<kVec>(cos_row, j, c);
      load_vec<kVec>(sin_row, j, s);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        c[e] = round_to<T>(c[e]);
        s[e] = kTranspose ? -round_to<T>(s[e]) : round_to<T>(s[e]);
      }
#pragma unroll 4
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = (token * H + h) * D;
        float x1[kVec], x2[kVec], y1[kVec], y2[kVec];
        load_vec<kVec>(x + row, j, x1);
        load_vec<kVec>(x + row + half, j, x2);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          y1[e] = __fadd_rn(round_to<Elem>(__fmul_rn(x1[e], c[e])), round_to<Elem>(-__fmul_rn(x2[e], s[e])));
          y2[e] = __fadd_rn(round_to<Elem>(__fmul_rn(x2[e], c[e])), round_to<Elem>(__fmul_rn(x1[e], s[e])));
        }
        store_vec<kVec>(y + row, j, y1);
        store_vec<kVec>(y + row + half, j, y2);
      }
    }
  }
}

template <class T, class Elem, class Store, bool kTranspose, int kVec>
void launch_rotate(const KernelContext& ctx, int64_t tokens, int64_t H, int64_t D, const int64_t* pos,
                   const DeviceTable& t, const Store* x, Store* y) {
  // A token's pair vectors on a power-of-two run of threads (head_dim 128 in vectors of 4: 16
  // threads, 16 tokens a block of 256).
  const int64_t vectors = D / 2 / kVec;
  unsigned pair_threads = 1;
  while (pair_threads < unsigned(kThreads) && pair_threads < vectors) pair_threads *= 2;
  const dim3 block(pair_threads, unsigned(kThreads) / pair_threads);
  const unsigned blocks = unsigned(std::min<int64_t>((tokens + block.y - 1) / block.y, 65536));
  rope_rotate_kernel<T, Elem, Store, kTranspose, kVec>
      <<<blocks, block, 0, stream_of(ctx)>>>(tokens, H, D, pos, t.cos, t.sin, x, y);
  check_launch(kTranspose ? "rope_rotate_kernel (backward)" : "rope_rotate_kernel (forward)");
}

// The forward (x, y of T) or the backward (dy, dx in f32, or stored as Store).
template <class T, bool kBackward, class Store = std::conditional_t<kBackward, float, T>>
void rotate(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos,
            const RopeTable& table, const void* x, void* y) {
  using Elem = std::conditional_t<kBackward, float, T>;
  const int64_t tokens = B * S, half = D / 2;
  if (tokens == 0 || H == 0 || half == 0) return;
  const DeviceTable t = device_table(ctx, table);
  const Store* xe = static_cast<const Store*>(x);
  Store* ye = static_cast<Store*>(y);
  // Vectors of 4 or 2 pairs where half divides and every row start is aligned (the table's rows
  // start at multiples of half; its buffers come from the allocator, aligned).
  auto fits = [&](int vec) {
    return half % vec == 0 && vector_aligned(x, vec, sizeof(Store)) &&
           vector_aligned(y, vec, sizeof(Store)) && vector_aligned(t.cos, vec, sizeof(float)) &&
           vector_aligned(t.sin, vec, sizeof(float));
  };
  if (fits(4))
    launch_rotate<T, Elem, Store, kBackward, 4>(ctx, tokens, H, D, pos, t, xe, ye);
  else if (fits(2))
    launch_rotate<T, Elem, Store, kBackward, 2>(ctx, tokens, H, D, pos, t, xe, ye);
  else
    launch_rotate<T, Elem, Store, kBackward, 1>(ctx, tokens, H, D, pos, t, xe, ye);
}

// The bf16-gradient backward of the bf16 kernel (none for f32).
template <class T>
constexpr decltype(RopeKernel::backward_bf16_grads) bf16_grads_backward() {
  if constexpr (sizeof(T) == 2)
    return &rotate<T, true, uint16_t>;
  else
    return nullptr;
}

const bool registered = cuda::register_float_kernels(
    "rope", "CUDA: thread per pair vector across a token's heads, device copy of the shared cos/sin table",
    "CUDA: thread per pair vector across a token's heads, device cos/sin table, bf16 arithmetic as torch",
    TITAN_FLOAT_KERNEL(RopeKernel, rotate<T, false>, rotate<T, true>, true, bf16_grads_backward<T>()));

}  // namespace
}  // namespace titan::ops
