#include "titan/ops/attention/attention.h"

#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

void check_attention_shape(const AttentionShape& s, const char* who) {
  TITAN_CHECK(s.B > 0 && s.S > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, who,
              ": every dimension must be positive, got B=", s.B, " S=", s.S, " Hq=", s.Hq, " Hkv=", s.Hkv,
              " D=", s.D);
  TITAN_CHECK(s.Hq % s.Hkv == 0, who, ": Hq=", s.Hq, " must be a multiple of Hkv=", s.Hkv);
}

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  TITAN_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "attention: expected q [B, S, Hq, D], k and v [B, S, Hkv, D]; got q ", q_in.str(), ", k ", k_in.str(),
              ", v ", v_in.str());
  TITAN_CHECK(k_in.shape() == v_in.shape(), "attention: k ", k_in.str(), " and v ", v_in.str(), " differ");
  check_same_device("attention", {{"q", &q_in}, {"k", &k_in}, {"v", &v_in}});
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
