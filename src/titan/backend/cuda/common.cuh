#pragma once
// Small helpers every CUDA kernel file uses: element conversions that round exactly as the CPU
// code does (core/dtype.h), grid sizing, the launch check, and the stream of a KernelContext.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::cuda {

// bf16 as its 16 bits. Widening is exact; narrowing rounds to nearest even and keeps NaN a quiet
// NaN with the same sign and top payload bits, bit for bit as titan::f32_to_bf16 on the CPU.
__host__ __device__ inline float bf16_to_f32(uint16_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(uint32_t(b) << 16);
#else
  uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}
__host__ __device__ inline uint16_t f32_to_bf16(float f) {
#ifdef __CUDA_ARCH__
  uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Loads and stores of the op dtypes through f32 (bf16 stored as uint16_t bits).
__device__ inline float load_f32(const float* p, int64_t i) { return p[i]; }
__device__ inline float load_f32(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
__device__ inline void store_f32(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store_f32(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }
// Vector loads and stores of kVec consecutive elements (1, 2 or 4) through f32: element index
// v * kVec .. v * kVec + kVec - 1, one 4-, 8- or 16-byte access. The address must be aligned to
// kVec elements (callers check with vector_aligned). bf16 pairs are little-endian: the element at
// the lower address is the low half of the word.
template <int kVec>
__device__ inline void load_vec(const float* p, int64_t v, float (&out)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 q = reinterpret_cast<const float4*>(p)[v];
    out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
  } else if constexpr (kVec == 2) {
    const float2 q = reinterpret_cast<const float2*>(p)[v];
    out[0] = q.x, out[1] = q.y;
  } else {
    out[0] = p[v];
  }
}
template <int kVec>
__device__ inline void load_vec(const uint16_t* p, int64_t v, float (&out)[kVec]) {
  if constexpr (kVec == 4) {
    const uint2 q = reinterpret_cast<const uint2*>(p)[v];
    out[0] = bf16_to_f32(uint16_t(q.x)), out[1] = bf16_to_f32(uint16_t(q.x >> 16));
    out[2] = bf16_to_f32(uint16_t(q.y)), out[3] = bf16_to_f32(uint16_t(q.y >> 16));
  } else if constexpr (kVec == 2) {
    const uint32_t q = reinterpret_cast<const uint32_t*>(p)[v];
    out[0] = bf16_to_f32(uint16_t(q)), out[1] = bf16_to_f32(uint16_t(q >> 16));
  } else {
    out[0] = bf16_to_f32(p[v]);
  }
}
template <int kVec>
__device__ inline void store_vec(float* p, int64_t v, const float (&in)[kVec]) {
  if constexpr (kVec == 4)
    reinterpret_cast<float4*>(p)[v] = make_float4(in[0], in[1], in[2], in[3]);
  else if constexpr (kVec == 2)
    reinterpret_cast<float2*>(p)[v] = make_float2(in[0], in[1]);
  else
    p[v] = in[0];
}
template <int kVec>
__device__ inline void store_vec(uint16_t* p, int64_t v, const float (&in)[kVec]) {
  auto pair = [&](int i) { return uint32_t(f32_to_bf16(in[i])) | (uint32_t(f32_to_bf16(in[i + 1])) << 16); };
  if constexpr (kVec == 4)
    reinterpret_cast<uint2*>(p)[v] = make_uint2(pair(0), pair(2));
  else if constexpr (kVec == 2)
    reinterpret_cast<uint32_t*>(p)[v] = pair(0);
  else
    p[v] = f32_to_bf16(in[0]);
}
// The same kVec elements v * kVec .. v * kVec + kVec - 1 one access each, at any alignment: a
// kernel that lays its elements out by kVec reads an unaligned view through these and so sums in
// the same order as for an aligned one (the bits of a row do not depend on where it sits).
template <int kVec, class T>
__device__ inline void load_elements(const T* p, int64_t v, float (&out)[kVec]) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) out[e] = load_f32(p, v * kVec + e);
}
template <int kVec, class T>
__device__ inline void store_elements(T* p, int64_t v, const float (&in)[kVec]) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) store_f32(p, v * kVec + e, in[e]);
}
// load_vec when kAligned, load_elements otherwise (and the stores alike).
template <int kVec, bool kAligned, class T>
__device__ inline void load_run(const T* p, int64_t v, float (&out)[kVec]) {
  if constexpr (kAligned)
    load_vec<kVec>(p, v, out);
  else
    load_elements<kVec>(p, v, out);
}
template <int kVec, bool kAligned, class T>
__device__ inline void store_run(T* p, int64_t v, const float (&in)[kVec]) {
  if constexpr (kAligned)
    store_vec<kVec>(p, v, in);
  else
    store_elements<kVec>(p, v, in);
}
// Whether `p` (or null) may be read kVec elements of `elem_bytes` at a time.
inline bool vector_aligned(const void* p, int vec, size_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(p) % (size_t(vec) * elem_bytes) == 0;
}
// Whether runs of n elements (n a multiple of 4) at every pointer (with its element size) may be
// read and written 4 elements at a time.
inline bool vectors_of_4(int64_t n, std::initializer_list<std::pair<const void*, size_t>> pointers) {
  if (n % 4 != 0) return false;
  for (const auto& [p, elem_bytes] : pointers)
    if (!vector_aligned(p, 4, elem_bytes)) return false;
  return true;
}

// Rounds v to the element type T and widens it back (the T(...) of the CPU reference kernels).
template <class T>
__device__ inline float round_to(float v) {
  if constexpr (sizeof(T) == 2) return bf16_to_f32(f32_to_bf16(v));
  else return v;
}

// Threads per block for the elementwise kernels, and the grid for n elements with a grid-stride
// loop (capped: past a few waves more blocks only add scheduling work).
constexpr int kThreads = 256;
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65536) blocks = 65536;
  return unsigned(blocks);
}

// The `available` check of every CUDA kernel registration: empty when a GPU is usable.
inline std::string kernel_available() { return unavailable_reason(); }

inline cudaStream_t stream_of(const KernelContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Call after each kernel launch: turns a bad launch configuration into a titan::Error naming it.
inline void check_launch(const char* kernel) { check(int(cudaGetLastError()), kernel, __FILE__, __LINE__); }

// Lets `kernel` launch with `bytes` of dynamic shared memory (past the default 48 KiB: an opt-in per
// kernel and device, made once each, since a driver call per launch would add up); `what` names it
// in the error.
void allow_dynamic_shared_memory(const void* kernel, size_t bytes, const char* what);

// Launches kernel(args...) on the grid-stride grid for n elements (grid_for(n) blocks of kThreads)
// on ctx's stream and checks the launch; `name` names the kernel in the error.
template <class Kernel, class... Args>
void launch_grid_stride(const KernelContext& ctx, const char* name, int64_t n, Kernel kernel, Args... args) {
  kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(args...);
  check_launch(name);
}

// Deterministic f64 reductions: `write_partials` queues a kernel of kReduceBlocks blocks that
// writes one partial sum per block (block_sum_f64 below) into the buffer it is given; the partials
// are then summed by one block in a fixed order and the total read back. The fixed block count
// fixes the summation order, so the result does not depend on the GPU.
constexpr int kReduceBlocks = 1024;
double sum_block_partials(const KernelContext& ctx, const std::function<void(double* partials)>& write_partials);

// Warp and block sums (f32). block_sum needs blockDim.x a multiple of 32, <= 1024, and `scratch`
// of 32 floats in shared memory; every thread gets the total.
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// The f64 block sum of the deterministic reductions (sum, grad norm): warp trees, then the warps'
// sums in warp order. Every thread of the block (blockDim.x a multiple of 32) must call it once per
// kernel; thread 0 gets the total.
__device__ inline double block_sum_f64(double v) {
  __shared__ double scratch[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? scratch[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The kernels that work on CUDA's own bf16 type: widen to f32 exactly, narrow to nearest even.
using bf16_t = __nv_bfloat16;
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// ---- tensor-core primitives (sm_80+; the attention and MoE mma.sync kernels) ----------------
// mma.sync m16n8k16 bf16 -> f32. Lane = 4 g + t holds, of a 16 x 8 accumulator tile, rows g and
// g + 8 at columns 2t and 2t + 1 (c[0], c[1] row g; c[2], c[3] row g + 8). ldmatrix_x4 loads four
// 8 x 8 bf16 matrices from shared memory, lanes 8i .. 8i+7 giving the row addresses of matrix i;
// the _trans form transposes each on the way. The asm that reads or writes shared memory declares
// a "memory" clobber, so the compiler cannot move ordinary shared loads and stores across it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
// c += a b for one 16 x 8 x 16 tile.
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c0 += a b[0..1] and c1 += a b[2..3]: the two 16 x 8 halves of the 16 x 16 B operand that one
// ldmatrix_x4 loads.
__device__ __forceinline__ void mma_16x16x16(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[4]) {
  mma_16x8x16(c0, a, b[0], b[1]);
  mma_16x8x16(c1, a, b[2], b[3]);
}
// Two floats as a bf16 pair, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// 16 bytes global -> shared without passing through registers (cp.async, L2 only); when `inside`
// is false the 16 shared bytes are zero-filled and nothing is read. Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool inside) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(inside ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `kPending` of this thread's committed cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace titan::cuda
