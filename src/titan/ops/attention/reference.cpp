// The reference kernels of attention: the textbook formulas, one query row of scores at a time
// (O(S) extra memory), the ground truth every other variant is tested against.
#include <omp.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/attention/cpu.h"

namespace titan::cpu {
namespace {

// Below this many multiply-adds per call a parallel region costs more than it saves.
bool worth_threads(const AttentionShape& s) {
  return s.B * s.Hq * s.S * s.S * s.D > (int64_t(1) << 18);
}

// ---------------------------------------------------------------------------------------------
// Reference: the textbook formulas, one query row at a time.

template <class T>
void fwd_reference(const AttentionShape& s, const T* q, const T* k, const T* v, T* out, T* lse) {
  ops::check_attention_shape(s, "attention_fwd_reference");
  const int64_t D = s.D, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D;
#pragma omp parallel if (worth_threads(s))
  {
    std::vector<T> p(s.S);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h) {
        const T* kb = k + b * s.S * ldk + (h / r) * D;
        const T* vb = v + b * s.S * ldk + (h / r) * D;
        for (int64_t i = 0; i < s.S; ++i) {
          const T* qi = q + (b * s.S + i) * ldq + h * D;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            T dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += qi[d] * kb[j * ldk + d];
            p[j] = dot * T(s.scale);
            m = std::max(m, p[j]);
          }
          T l = 0;
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = std::exp(p[j] - m);
            l += p[j];
          }
          T* oi = out + (b * s.S + i) * ldq + h * D;
          std::fill(oi, oi + D, T(0));
          for (int64_t j = 0; j <= i; ++j) {
            const T w = p[j] / l;
            for (int64_t d = 0; d < D; ++d) oi[d] += w * vb[j * ldk + d];
          }
          lse[(b * s.Hq + h) * s.S + i] = m + std::log(l);
        }
      }
  }
}

// dS_ij = P_ij (dP_ij - D_i) with D_i = dout_i . out_i; dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
// Parallel over (batch, kv head): the r query heads of a group only write that group's dk/dv rows.
template <class T>
void bwd_reference(const AttentionShape& s, const T* q, const T* k, const T* v, const T* out, const T* lse,
                   const T* dout, T* dq, T* dk, T* dv) {
  ops::check_attention_shape(s, "attention_bwd_reference");
  const int64_t D = s.D, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D;
  std::fill(dk, dk + s.B * s.S * ldk, T(0));
  std::fill(dv, dv + s.B * s.S * ldk, T(0));
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(s))
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t g = 0; g < s.Hkv; ++g) {
      const int64_t kvoff = b * s.S * ldk + g * D;
      for (int64_t h = g * r; h < (g + 1) * r; ++h)
        for (int64_t i = 0; i < s.S; ++i) {
          const int64_t qoff = (b * s.S + i) * ldq + h * D;
          const T *qi = q + qoff, *oi = out + qoff, *doi = dout + qoff;
          T* dqi = dq + qoff;
          T di = 0;
          for (int64_t d = 0; d < D; ++d) di += doi[d] * oi[d];
          const T L = lse[(b * s.Hq + h) * s.S + i];
          std::fill(dqi, dqi + D, T(0));
          for (int64_t j = 0; j <= i; ++j) {
            const T *kj = k + kvoff + j * ldk, *vj = v + kvoff + j * ldk;
            T sc = 0, dp = 0;
            for (int64_t d = 0; d < D; ++d) {
              sc += qi[d] * kj[d];
              dp += doi[d] * vj[d];
            }
            const T p = std::exp(sc * T(s.scale) - L);
            const T ds = p * (dp - di) * T(s.scale);
            T *dkj = dk + kvoff + j * ldk, *dvj = dv + kvoff + j * ldk;
            for (int64_t d = 0; d < D; ++d) {
              dqi[d] += ds * kj[d];
              dkj[d] += ds * qi[d];
              dvj[d] += p * doi[d];
            }
          }
        }
    }
}

}  // namespace

void attention_fwd_reference_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 float* out, float* lse) {
  fwd_reference(s, q, k, v, out, lse);
}
void attention_bwd_reference_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                 float* dv) {
  bwd_reference(s, q, k, v, out, lse, dout, dq, dk, dv);
}
void attention_fwd_reference_f64(const AttentionShape& s, const double* q, const double* k, const double* v,
                                 double* out, double* lse) {
  fwd_reference(s, q, k, v, out, lse);
}
void attention_bwd_reference_f64(const AttentionShape& s, const double* q, const double* k, const double* v,
                                 const double* out, const double* lse, const double* dout, double* dq,
                                 double* dk, double* dv) {
  bwd_reference(s, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace titan::cpu

namespace titan::ops {
namespace {

// An activation-sized f32 copy of a bf16 tensor (or room for one, without `bf16_src`): from the
// allocator, so a run's memory figures include it.
struct F32Copy {
  Scratch buffer;
  F32Copy(const KernelContext& ctx, size_t n, const void* bf16_src = nullptr)
      : buffer(ctx, n * sizeof(float)) {
    if (bf16_src) convert_bf16_to_f32(static_cast<const bf16*>(bf16_src), data(), n);
  }
  float* data() const { return buffer.as<float>(); }
};

// bf16 reference: widen to f32, run the f32 reference, round the output once.
void fwd_ref_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse) {
  const F32Copy qf(ctx, s.q_numel(), q), kf(ctx, s.kv_numel(), k), vf(ctx, s.kv_numel(), v),
      of(ctx, s.q_numel());
  cpu::attention_fwd_reference_f32(s, qf.data(), kf.data(), vf.data(), of.data(), static_cast<float*>(lse));
  convert_f32_to_bf16(of.data(), static_cast<bf16*>(out), s.q_numel());
}
void bwd_ref_bf16(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                  const void* lse, const void* dout, void* dq, void* dk, void* dv) {
  const F32Copy qf(ctx, s.q_numel(), q), kf(ctx, s.kv_numel(), k), vf(ctx, s.kv_numel(), v),
      of(ctx, s.q_numel(), out);
  cpu::attention_bwd_reference_f32(s, qf.data(), kf.data(), vf.data(), of.data(), static_cast<const float*>(lse),
                                   static_cast<const float*>(dout), static_cast<float*>(dq), static_cast<float*>(dk),
                                   static_cast<float*>(dv));
}

// f64 and f32 run the raw plain loops of their type (attention_forward_entry, attention.h); bf16
// the f32 ones on widened inputs.
const bool registered = kernels::register_reference_kernels(
    "attention", "one row of scores at a time", "f32 reference on widened inputs, output rounded once",
    []<class T, class Acc>(kernels::ReferenceTypes<T, Acc>) {
      if constexpr (std::is_same_v<T, double>)
        return AttentionKernel{attention_forward_entry<T, T, cpu::attention_fwd_reference_f64>,
                               attention_backward_entry<T, T, cpu::attention_bwd_reference_f64>};
      else if constexpr (std::is_same_v<T, float>)
        return AttentionKernel{attention_forward_entry<T, T, cpu::attention_fwd_reference_f32>,
                               attention_backward_entry<T, T, cpu::attention_bwd_reference_f32>};
      else
        return AttentionKernel{fwd_ref_bf16, bwd_ref_bf16};
    });

}  // namespace
}  // namespace titan::ops
