#pragma once
// rope: rotary position embedding with the half-split layout of transformers (rotate_half):
//   inv_freq[j] = 1 / theta^(2j/D)   (f32: float(2j) / float(D), powf, then 1/x, as transformers;
//                                     glibc's powf is correctly rounded, torch's vectorised pow can be
//                                     1 ulp off: 1 of 64 entries for theta 1e6, D 128)
//   angle[p, j] = float(p) * inv_freq[j]  (f32),  cos/sin of it in f32,  emb = cat(freqs, freqs)
//   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1)
// x [B, S, H, D] (D even), positions i64 [S] (shared by the batch) or [B, S]; any non-negative
// positions work (out of order, repeated, offset).
// Precision follows transformers exactly: cos/sin are computed in f32 and cast to the input dtype,
// and the arithmetic runs in the input dtype. In bf16 that means cos and sin are rounded to bf16,
// each product x*cos and rotate_half(x)*sin is rounded to bf16 and so is their sum (torch's bf16
// elementwise ops compute in f32 and round each result). In f32 each product and the sum are
// rounded to f32 (no fused multiply-add). f64 (gradient checks) computes everything in f64.
// Autograd: dx = the transposed rotation of dy with the same (rounded) cos/sin, in f32:
//   dx1 = dy1 * cos + dy2 * sin,   dx2 = dy2 * cos - dy1 * sin.
//
// Variants: "reference" computes inv_freq, cos and sin per element; "default" reads a shared
// cos/sin table (rope_table) at each token's position; "gather_free" needs positions that are a
// contiguous range p0, p0+1, ..., p0+S-1 in every batch row (0..S-1 in training) and walks the
// table rows directly; other positions are an error naming the first offending position (checked
// by that kernel on every call; the default and reference kernels read positions as they are). All three give bit-identical results where they run.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

// Positions known valid for every rope call that uses them, checked once (rope_positions) or valid
// by construction (sequential_positions, what the model uses), never once per call: on a GPU a
// check reads a value back to the host and stalls the queue. Only those two (and rope with a
// plain tensor) make them, so holding one means the check is done.
class RopePositions {
 public:
  const Tensor& tensor() const { return pos_; }  // i64 [B, S], contiguous, every value >= 0; read only
  int64_t max() const { return max_; }           // the largest position (the table rows needed - 1)

 private:
  friend RopePositions rope_positions(const Tensor& positions, int64_t B, int64_t S);
  friend RopePositions sequential_positions(int64_t B, int64_t S, Device device, int64_t first,
                                            std::span<const int64_t> left_padding);
  friend Tensor rope(const Tensor& x, const Tensor& positions, double theta);
  RopePositions(Tensor pos, int64_t max) : pos_(std::move(pos)), max_(max) {}
  // The check of rope_positions, naming in its errors what the positions are for.
  static RopePositions checked(const Tensor& positions, int64_t B, int64_t S, const std::string& what);
  Tensor pos_;
  int64_t max_ = 0;
};
// positions i64 [S] (shared by the batch) or [B, S]; a negative position is an error naming it.
RopePositions rope_positions(const Tensor& positions, int64_t B, int64_t S);

// Positions first .. first+S-1 in each of B rows (0 .. S-1 in training; a generation step's new
// tokens start after the cached ones), written on the host and copied to `device` (a meta tensor
// holds no values): in range by construction, so unlike rope_positions no device value is read.
// `left_padding` (empty, or one count per row: batched generation's left-padded prompts) shifts row
// b back by left_padding[b], so its first token after the padding is position 0, as transformers
// numbers a left-padded row; the padding's own positions are 0.
RopePositions sequential_positions(int64_t B, int64_t S, Device device, int64_t first = 0,
                                   std::span<const int64_t> left_padding = {});

// x [B, S, H, D] with positions made for the same B and S.
Tensor rope(const Tensor& x, const RopePositions& positions, double theta);
// The same with the positions checked by this call: rope(x, rope_positions(positions, B, S), theta).
Tensor rope(const Tensor& x, const Tensor& positions, double theta);

// cos/sin of angle[p, j] for p < positions, j < D/2, in f32, computed exactly as the reference does.
struct RopeTable {
  double theta = 0;
  int64_t D = 0;
  int64_t positions = 0;
  std::vector<float> cos, sin;  // [positions, D/2]
};

// cos/sin of position p, frequency j, as transformers computes them in f32 (and in f64 for f64);
// the table and the reference kernels both use it.
void rope_cos_sin(double theta, int64_t D, int64_t p, int64_t j, float* c, float* s);
void rope_cos_sin(double theta, int64_t D, int64_t p, int64_t j, double* c, double* s);

// The cached table for (theta, D) covering at least `positions` rows. Tables are shared by every
// call (and kept alive by the backward closures that use them); a call needing more rows replaces
// the cached table by a longer one. Thread-safe.
std::shared_ptr<const RopeTable> rope_table(double theta, int64_t D, int64_t positions);

// Kernels; pointers are contiguous row-major. x, y [B, S, H, D] in the op dtype; pos [B, S];
// dy, dx [B, S, H, D] in the grad dtype. `table` has theta and D; it holds rows for every position
// in pos when needs_table is true (else it may be empty).
struct RopeKernel {
  void (*forward)(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos, const RopeTable& table,
                  const void* x, void* y);
  void (*backward)(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos, const RopeTable& table,
                   const void* dy, void* dx);
  bool needs_table = true;
  // bf16 activation gradients (ops/activation_grads.h), bf16 kernels only, null where the kernel
  // has none: the backward with dy and dx in bf16 (computed in f32, dx rounded once as stored).
  void (*backward_bf16_grads)(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D,
                              const int64_t* pos, const RopeTable& table, const void* dy, void* dx) = nullptr;
};

}  // namespace titan::ops
