// The elementwise kernels on CUDA (elementwise.h): add (f32, bf16), add_inplace (f32 += f32 / bf16),
// scale_inplace (f32, bf16), sum (f32, bf16) and the i64 index scans the other ops' argument checks
// use. Grid-stride loops (unrolled over restrict pointers: several loads in flight); each result is rounded exactly as the CPU kernels round it (one f32 add or
// multiply, rounded to bf16 where the element is bf16), so add / add_inplace / scale_inplace are
// bit-identical to the CPU. sum accumulates in f64 over 1024 fixed block partials (deterministic;
// it differs from the CPU's serial f64 sum only in f64 rounding). The scans return one 8-byte value
// to the host (a synchronisation), where the op needs it to raise its error.
#include <climits>

#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

#define TITAN_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <class T>
__global__ void add_kernel(int64_t n, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out) {
#pragma unroll 4
  TITAN_GRID_STRIDE(i, n) store_f32(out, i, __fadd_rn(load_f32(a, i), load_f32(b, i)));
}

template <class S>
__global__ void accumulate_kernel(int64_t n, float* __restrict__ dst, const S* __restrict__ src) {
#pragma unroll 4
  TITAN_GRID_STRIDE(i, n) dst[i] = __fadd_rn(dst[i], load_f32(src, i));
}

template <class T>
__global__ void scale_kernel(int64_t n, T* __restrict__ x, float s) {
#pragma unroll 4
  TITAN_GRID_STRIDE(i, n) store_f32(x, i, __fmul_rn(load_f32(x, i), s));
}

template <class T>
__global__ void sum_partial_kernel(int64_t n, const T* x, double* partial) {
  double acc = 0;
  TITAN_GRID_STRIDE(i, n) acc += double(load_f32(x, i));
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void first_outside_kernel(int64_t n, const int64_t* v, int64_t lo, int64_t hi, int64_t allowed,
                                     unsigned long long* first) {
  TITAN_GRID_STRIDE(i, n) {
    if ((v[i] < lo || v[i] >= hi) && v[i] != allowed) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

__global__ void count_not_equal_kernel(int64_t n, const int64_t* v, int64_t value, unsigned long long* count) {
  unsigned long long c = 0;
  TITAN_GRID_STRIDE(i, n) c += v[i] != value;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

__global__ void max_kernel(int64_t n, const int64_t* v, long long* result) {
  long long m = LLONG_MIN;
  TITAN_GRID_STRIDE(i, n) m = max(m, static_cast<long long>(v[i]));
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(result, m);
}

template <class T>
void add(const KernelContext& ctx, int64_t n, const void* a, const void* b, void* out) {
  if (n == 0) return;
  launch_grid_stride(ctx, "add_kernel", n, add_kernel<T>, n, static_cast<const T*>(a), static_cast<const T*>(b),
                     static_cast<T*>(out));
}

template <class S>
void accumulate(const KernelContext& ctx, int64_t n, void* dst, const void* src) {
  if (n == 0) return;
  launch_grid_stride(ctx, "accumulate_kernel", n, accumulate_kernel<S>, n, static_cast<float*>(dst),
                     static_cast<const S*>(src));
}

template <class T>
void scale(const KernelContext& ctx, int64_t n, void* x, double s) {
  if (n == 0) return;
  launch_grid_stride(ctx, "scale_kernel", n, scale_kernel<T>, n, static_cast<T*>(x), float(s));
}

// An 8-byte device scalar set to `init`, read back after the kernels that `launch` queues.
template <class V, class Launch>
V device_scalar(const KernelContext& ctx, V init, Launch&& launch) {
  V* d = static_cast<V*>(ctx.services->allocate(sizeof(V)));
  ctx.services->copy_from_host(d, &init, sizeof(V));
  launch(d);
  V host{};
  ctx.services->copy_to_host(&host, d, sizeof(V));
  ctx.services->deallocate(d, sizeof(V));
  return host;
}

template <class T>
double sum(const KernelContext& ctx, int64_t n, const void* x) {
  if (n == 0) return 0.0;
  return sum_block_partials(ctx, [&](double* partials) {
    sum_partial_kernel<T><<<kReduceBlocks, kThreads, 0, stream_of(ctx)>>>(n, static_cast<const T*>(x), partials);
    check_launch("sum_partial_kernel");
  });
}

int64_t first_outside_scan(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t lo, int64_t hi, int64_t allowed) {
  if (n == 0) return -1;
  const auto first = device_scalar<unsigned long long>(ctx, static_cast<unsigned long long>(n), [&](auto* out) {
    launch_grid_stride(ctx, "first_outside_kernel", n, first_outside_kernel, n, v, lo, hi, allowed, out);
  });
  return int64_t(first) < n ? int64_t(first) : -1;
}

int64_t count_not_equal_scan(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t value) {
  if (n == 0) return 0;
  return int64_t(device_scalar<unsigned long long>(ctx, 0ull, [&](auto* out) {
    launch_grid_stride(ctx, "count_not_equal_kernel", n, count_not_equal_kernel, n, v, value, out);
  }));
}

int64_t max_scan(const KernelContext& ctx, int64_t n, const int64_t* v) {
  return int64_t(device_scalar<long long>(ctx, LLONG_MIN, [&](auto* out) {
    launch_grid_stride(ctx, "max_kernel", n, max_kernel, n, v, out);
  }));
}

#undef TITAN_GRID_STRIDE

const bool add_kernels_registered = cuda::register_float_kernels(
    "add", "CUDA: elementwise f32 add", "CUDA: elementwise add in f32, rounded to bf16",
    TITAN_FLOAT_KERNEL(AddKernel, add<T>));
const bool add_inplace_kernels_registered =
    cuda::register_float_kernels("add_inplace", "CUDA: f32 += f32", "CUDA: f32 += bf16",
                                 TITAN_FLOAT_KERNEL(AccumulateKernel, accumulate<T>));
const bool scale_inplace_kernels_registered = cuda::register_float_kernels(
    "scale_inplace", "CUDA: x *= s in f32", "CUDA: x *= s in f32, rounded to bf16",
    TITAN_FLOAT_KERNEL(ScaleKernel, scale<T>));
const bool sum_kernels_registered = cuda::register_float_kernels(
    "sum", "CUDA: f64 sum, 1024 fixed block partials (deterministic)",
    "CUDA: f64 sum, 1024 fixed block partials (deterministic)", TITAN_FLOAT_KERNEL(SumKernel, sum<T>));
const bool index_kernels_registered = kernels::register_kernels(
    "index", Device::CUDA,
    {{DType::I64, "default", "CUDA: parallel scans (atomic min / count / max), one value read back",
      IndexKernel{first_outside_scan, count_not_equal_scan, max_scan}}},
    cuda::kernel_available);

}  // namespace
}  // namespace titan::ops
