#include "titan/ops/cached_attention/cached_attention.h"

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

void check_cached_attention_shape(const CachedAttentionShape& s, const char* who) {
  TITAN_CHECK(s.B > 0 && s.Sq > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, who,
              ": every dimension must be positive, got B=", s.B, " Sq=", s.Sq, " Hq=", s.Hq, " Hkv=", s.Hkv,
              " D=", s.D);
  TITAN_CHECK(s.Sq <= s.length && s.length <= s.capacity, who,
              ": need Sq <= length <= capacity, got Sq=", s.Sq, " length=", s.length,
              " capacity=", s.capacity);
  TITAN_CHECK(s.Hq % s.Hkv == 0, who, ": Hq=", s.Hq, " must be a multiple of Hkv=", s.Hkv);
}

Tensor cached_attention(const Tensor& q_in, const Tensor& k_cache, const Tensor& v_cache, int64_t length,
                        double scale, const Tensor& first_key) {
  TITAN_CHECK(q_in.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4,
              "cached_attention: expected q [B, Sq, Hq, D], k and v caches [B, capacity, Hkv, D]; got q ",
              q_in.str(), ", k ", k_cache.str(), ", v ", v_cache.str());
  TITAN_CHECK(k_cache.shape() == v_cache.shape(), "cached_attention: k cache ", k_cache.str(),
              " and v cache ", v_cache.str(), " differ");
  check_same_device("cached_attention", {{"q", &q_in}, {"k", &k_cache}, {"v", &v_cache}});
  TITAN_CHECK(q_in.size(0) == k_cache.size(0) && q_in.size(3) == k_cache.size(3), "cached_attention: q ",
              q_in.str(), " and the k cache ", k_cache.str(), " disagree on B or D");
  TITAN_CHECK(q_in.dtype() == k_cache.dtype() && q_in.dtype() == v_cache.dtype(),
              "cached_attention: dtypes differ: q ", q_in.str(), ", k ", k_cache.str(), ", v ",
              v_cache.str());
  TITAN_CHECK(!autograd::needs_grad({&q_in, &k_cache, &v_cache}),
              "cached_attention: inference only (no backward); run it under autograd::NoGradGuard");
  TITAN_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "cached_attention: the k and v caches must be contiguous (a cache is written in place)");
  const CachedAttentionShape s{q_in.size(0), q_in.size(1),    length,       k_cache.size(1),
                               q_in.size(2), k_cache.size(2), q_in.size(3), float(scale)};
  check_cached_attention_shape(s, "cached_attention");
  if (first_key.defined()) {
    check_same_device("cached_attention", {{"q", &q_in}, {"first_key", &first_key}});
    TITAN_CHECK(first_key.dtype() == DType::I64 && first_key.dim() == 1 && first_key.size(0) == s.B &&
                    first_key.is_contiguous(),
                "cached_attention: first_key must be a contiguous i64 [", s.B, "] (one per row), got ",
                first_key.str());
  }
  const Tensor q = q_in.contiguous();
  const auto& kernel = kernels::kernel_for<CachedAttentionKernel>("cached_attention", q.device(), q.dtype());
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  kernel.forward(device_services(q.device()).context(), s, q.raw_data(), k_cache.raw_data(),
                 v_cache.raw_data(), first_key.defined() ? first_key.data<int64_t>() : nullptr,
                 out.raw_data());
  return out;
}

}  // namespace titan::ops
