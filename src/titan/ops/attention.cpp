#include "titan/ops/attention.h"

#include "titan/backend/cpu/attention.h"

#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

namespace {



size_t numel_q(const AttentionShape& s) { return size_t(s.B * s.S * s.Hq * s.D); }
size_t numel_kv(const AttentionShape& s) { return size_t(s.B * s.S * s.Hkv * s.D); }

// f64 and f32 references are the raw kernels' plain-loop versions.
void fwd_ref_f64(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  cpu::attention_fwd_reference_f64(s, static_cast<const double*>(q), static_cast<const double*>(k),
                                   static_cast<const double*>(v), static_cast<double*>(out), static_cast<double*>(lse));
}
void bwd_ref_f64(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                 const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  cpu::attention_bwd_reference_f64(s, static_cast<const double*>(q), static_cast<const double*>(k),
                                   static_cast<const double*>(v), static_cast<const double*>(out),
                                   static_cast<const double*>(lse), static_cast<const double*>(dout),
                                   static_cast<double*>(dq), static_cast<double*>(dk), static_cast<double*>(dv));
}
void fwd_ref_f32(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  cpu::attention_fwd_reference_f32(s, static_cast<const float*>(q), static_cast<const float*>(k),
                                   static_cast<const float*>(v), static_cast<float*>(out), static_cast<float*>(lse));
}
void bwd_ref_f32(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                 const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  cpu::attention_bwd_reference_f32(s, static_cast<const float*>(q), static_cast<const float*>(k),
                                   static_cast<const float*>(v), static_cast<const float*>(out),
                                   static_cast<const float*>(lse), static_cast<const float*>(dout),
                                   static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
}

std::vector<float> widen(const void* p, size_t n) {
  std::vector<float> out(n);
  convert_bf16_to_f32(static_cast<const bf16*>(p), out.data(), n);
  return out;
}

// bf16 reference: widen to f32, run the f32 reference, round the output once.
void fwd_ref_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  auto qf = widen(q, numel_q(s)), kf = widen(k, numel_kv(s)), vf = widen(v, numel_kv(s));
  std::vector<float> of(numel_q(s));
  cpu::attention_fwd_reference_f32(s, qf.data(), kf.data(), vf.data(), of.data(), static_cast<float*>(lse));
  convert_f32_to_bf16(of.data(), static_cast<bf16*>(out), of.size());
}
void bwd_ref_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                  const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  auto qf = widen(q, numel_q(s)), kf = widen(k, numel_kv(s)), vf = widen(v, numel_kv(s)), of = widen(out, numel_q(s));
  cpu::attention_bwd_reference_f32(s, qf.data(), kf.data(), vf.data(), of.data(), static_cast<const float*>(lse),
                                   static_cast<const float*>(dout), static_cast<float*>(dq), static_cast<float*>(dk),
                                   static_cast<float*>(dv));
}

// Flash variants.
void fwd_flash_f32(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  cpu::attention_fwd_flash_f32(s, static_cast<const float*>(q), static_cast<const float*>(k),
                               static_cast<const float*>(v), static_cast<float*>(out), static_cast<float*>(lse));
}
void bwd_flash_f32(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                   const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  cpu::attention_bwd_flash_f32(s, static_cast<const float*>(q), static_cast<const float*>(k),
                               static_cast<const float*>(v), static_cast<const float*>(out),
                               static_cast<const float*>(lse), static_cast<const float*>(dout),
                               static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
}
void fwd_flash_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  cpu::attention_fwd_flash_bf16(s, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                                static_cast<const bf16*>(v), static_cast<bf16*>(out), static_cast<float*>(lse));
}
// The bf16 backward kernels take bf16 dout and return bf16 gradients (as a bf16 autograd would): the
// f32 upstream gradient is rounded once and the results widened.
using Bf16Backward = void (*)(const AttentionShape&, const bf16*, const bf16*, const bf16*, const bf16*,
                              const float*, const bf16*, bf16*, bf16*, bf16*);
void bwd_bf16_via(Bf16Backward kernel, const AttentionShape& s, const void* q, const void* k, const void* v,
                  const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  std::vector<bf16> dout16(numel_q(s)), dq16(numel_q(s)), dk16(numel_kv(s)), dv16(numel_kv(s));
  convert_f32_to_bf16(static_cast<const float*>(dout), dout16.data(), dout16.size());
  kernel(s, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
         static_cast<const bf16*>(out), static_cast<const float*>(lse), dout16.data(), dq16.data(), dk16.data(),
         dv16.data());
  convert_bf16_to_f32(dq16.data(), static_cast<float*>(dq), dq16.size());
  convert_bf16_to_f32(dk16.data(), static_cast<float*>(dk), dk16.size());
  convert_bf16_to_f32(dv16.data(), static_cast<float*>(dv), dv16.size());
}
void bwd_flash_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                    const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  bwd_bf16_via(cpu::attention_bwd_flash_bf16, s, q, k, v, out, lse, dout, dq, dk, dv);
}

void fwd_flash_bf16_probs(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out,
                          void* lse) {
  cpu::attention_fwd_flash_bf16_probs(s, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                                      static_cast<const bf16*>(v), static_cast<bf16*>(out), static_cast<float*>(lse));
}
void bwd_flash_bf16_probs(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                          const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  bwd_bf16_via(cpu::attention_bwd_flash_bf16_probs, s, q, k, v, out, lse, dout, dq, dk, dv);
}

TITAN_REGISTER_KERNEL(attention_f64_ref, {"attention", Device::CPU, DType::F64, "reference",
                                          "one row of scores at a time, f64", AttentionKernel{fwd_ref_f64, bwd_ref_f64}, {}});
TITAN_REGISTER_KERNEL(attention_f32_ref, {"attention", Device::CPU, DType::F32, "reference",
                                          "one row of scores at a time, f32", AttentionKernel{fwd_ref_f32, bwd_ref_f32}, {}});
TITAN_REGISTER_KERNEL(attention_bf16_ref, {"attention", Device::CPU, DType::BF16, "reference",
                                           "f32 reference on widened inputs, output rounded once",
                                           AttentionKernel{fwd_ref_bf16, bwd_ref_bf16}, {}});
TITAN_REGISTER_KERNEL(attention_f32_flash, {"attention", Device::CPU, DType::F32, "default",
                                            "flash tiles, online softmax, AVX-512 when available, OpenMP",
                                            AttentionKernel{fwd_flash_f32, bwd_flash_f32}, {}});
TITAN_REGISTER_KERNEL(attention_bf16_flash, {"attention", Device::CPU, DType::BF16, "default",
                                             "flash tiles, bf16 in/out, f32 math, AVX-512 when available, OpenMP",
                                             AttentionKernel{fwd_flash_bf16, bwd_flash_bf16}, {}});
TITAN_REGISTER_KERNEL(attention_bf16_probs,
                      {"attention", Device::CPU, DType::BF16, "bf16_probs",
                       "flash tiles with P and dS rounded to bf16: all six products on AVX512-BF16 "
                       "(backward: head_dim % 64 == 0, else f32 products there)",
                       AttentionKernel{fwd_flash_bf16_probs, bwd_flash_bf16_probs},
                       [] { return cpu::attention_bf16_probs_available() ? std::string() : "needs AVX512-BF16"; }});

}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  TITAN_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "attention: expected q [B, S, Hq, D], k and v [B, S, Hkv, D]; got q ", q_in.str(), ", k ", k_in.str(),
              ", v ", v_in.str());
  TITAN_CHECK(k_in.shape() == v_in.shape(), "attention: k ", k_in.str(), " and v ", v_in.str(), " differ");
  TITAN_CHECK(q_in.size(0) == k_in.size(0) && q_in.size(1) == k_in.size(1) && q_in.size(3) == k_in.size(3),
              "attention: q ", q_in.str(), " and k ", k_in.str(), " disagree on B, S or D");
  TITAN_CHECK(k_in.size(2) > 0 && q_in.size(2) % k_in.size(2) == 0, "attention: query heads (", q_in.size(2),
              ") must be a multiple of kv heads (", k_in.size(2), "); q ", q_in.str(), ", k ", k_in.str());
  TITAN_CHECK(q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype(), "attention: dtypes differ: q ",
              q_in.str(), ", k ", k_in.str(), ", v ", v_in.str());
  Tensor q = q_in.contiguous().detach(), k = k_in.contiguous().detach(), v = v_in.contiguous().detach();
  AttentionShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), float(scale)};
  const DType stat = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const auto& kernel = kernels::kernel_for<AttentionKernel>("attention", q.device(), q.dtype());
  const KernelContext ctx = device_services(q.device()).context();
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({s.B, s.Hq, s.S}, stat, q.device());
  kernel.forward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data());
  if (autograd::needs_grad({&q_in, &k_in, &v_in})) {
    Tensor saved_out = out.detach();
    autograd::record("attention", {q_in, k_in, v_in}, {&out}, [=, &kernel](const std::vector<Tensor>& g) {
      DType gd = grad_dtype(q.dtype());
      Tensor dout = g[0].contiguous();
      Tensor dq = Tensor::empty(q.shape(), gd, q.device()), dk = Tensor::empty(k.shape(), gd, q.device()), dv = Tensor::empty(v.shape(), gd, q.device());
      kernel.backward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), saved_out.raw_data(), lse.raw_data(),
                      dout.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data());
      return std::vector<Tensor>{dq, dk, dv};
    });
  }
  return out;
}

}  // namespace titan::ops
