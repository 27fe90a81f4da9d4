#include "titan/ops/optim/optim.h"

#include <algorithm>
#include <cmath>

#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {

namespace {

void check_buffer(const char* what, const Tensor& t, const Tensor& param) {
  TITAN_CHECK(t.defined(), "adamw: ", what, " is undefined");
  TITAN_CHECK(t.shape() == param.shape() && t.dtype() == param.dtype() && t.device() == param.device(),
              "adamw: ", what, " ", t.str(), " does not match param ", param.str(),
              " (same shape, dtype and device required)");
  TITAN_CHECK(t.is_contiguous(), "adamw: ", what, " ", t.str(),
              " must be contiguous (it is updated in place)");
}

}  // namespace

void validate(const AdamWConfig& c) {
  auto finite = [](const char* field, double v) {
    TITAN_CHECK(std::isfinite(v), "optimizer: ", field, " = ", v, " must be finite");
  };
  finite("lr", c.lr);
  finite("beta1", c.beta1);
  finite("beta2", c.beta2);
  finite("eps", c.eps);
  finite("weight_decay", c.weight_decay);
  TITAN_CHECK(c.lr >= 0, "optimizer: lr = ", c.lr, " must be >= 0");
  TITAN_CHECK(c.beta1 >= 0 && c.beta1 < 1, "optimizer: beta1 = ", c.beta1, " must be in [0, 1)");
  TITAN_CHECK(c.beta2 >= 0 && c.beta2 < 1, "optimizer: beta2 = ", c.beta2, " must be in [0, 1)");
  TITAN_CHECK(c.eps >= 0, "optimizer: eps = ", c.eps, " must be >= 0");
  TITAN_CHECK(c.weight_decay >= 0, "optimizer: weight_decay = ", c.weight_decay, " must be >= 0");
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWConfig& c,
                int64_t step, double grad_scale, Tensor* compute_copy) {
  validate(c);
  TITAN_CHECK(step >= 1, "adamw: step = ", step, " must be >= 1 (1-based, this step included)");
  TITAN_CHECK(param.defined(), "adamw: param is undefined");
  TITAN_CHECK(param.dtype() == DType::F32 || param.dtype() == DType::F64, "adamw: param ", param.str(),
              " must be f32 (f64 for tests): optimizer state is kept in fp32");
  TITAN_CHECK(param.is_contiguous(), "adamw: param ", param.str(),
              " must be contiguous (it is updated in place)");
  check_buffer("grad", grad, param);
  check_buffer("exp_avg", exp_avg, param);
  check_buffer("exp_avg_sq", exp_avg_sq, param);
  uint16_t* copy = nullptr;
  if (compute_copy) {
    const Tensor& c = *compute_copy;
    TITAN_CHECK(c.defined() && c.dtype() == DType::BF16 && c.numel() == param.numel() &&
                    c.device() == param.device() && c.is_contiguous(),
                "adamw: compute_copy ", c.defined() ? c.str() : std::string("(undefined)"),
                " must be a contiguous bf16 tensor of param's ", param.numel(), " elements on ",
                device_name(param.device()));
    TITAN_CHECK(param.dtype() == DType::F32, "adamw: a compute_copy is written from f32 params, not ",
                param.str());
    copy = static_cast<uint16_t*>(compute_copy->raw_data());
  }

  AdamWScalars s;
  s.decay = c.decoupled_weight_decay ? 1.0 - c.lr * c.weight_decay : 1.0;
  s.l2 = c.decoupled_weight_decay ? 0.0 : c.weight_decay;
  s.beta1 = c.beta1;
  s.one_minus_beta1 = 1.0 - c.beta1;
  s.beta2 = c.beta2;
  s.one_minus_beta2 = 1.0 - c.beta2;
  s.neg_step_size = -(c.lr / (1.0 - std::pow(c.beta1, double(step))));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, double(step)));
  s.eps = c.eps;
  TITAN_CHECK(std::isfinite(grad_scale), "adamw: grad_scale = ", grad_scale, " must be finite");
  s.grad_scale = grad_scale;
  const auto& kernel = kernels::kernel_for<AdamWKernel>("adamw", param.device(), param.dtype());
  const KernelContext ctx = device_services(param.device()).context();
  kernel.step(ctx, param.numel(), param.raw_data(), grad.raw_data(), exp_avg.raw_data(),
              exp_avg_sq.raw_data(), copy, s);
}

double grad_norm_sq(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  const Device device = grads[0].defined() ? grads[0].device() : Device::CPU;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    TITAN_CHECK(g.defined(), "grad_norm: gradient is undefined (tensor ", i, ")");
    TITAN_CHECK(g.dtype() == DType::F32 || g.dtype() == DType::F64, "grad_norm: gradient ", g.str(),
                " must be f32 (f64 for tests) (tensor ", i, ")");
    TITAN_CHECK(g.is_contiguous(), "grad_norm: gradient ", g.str(), " must be contiguous (tensor ", i, ")");
    TITAN_CHECK(g.device() == device && g.dtype() == grads[0].dtype(), "grad_norm: gradient ", g.str(),
                " (tensor ", i, ") is not on ", device_name(device), " in ", dtype_name(grads[0].dtype()),
                " as tensor 0 is");
  }
  Tensor total = Tensor::zeros({1}, DType::F64, device);
  const auto& kernel = kernels::kernel_for<GradNormKernel>("grad_norm", device, grads[0].dtype());
  const KernelContext ctx = device_services(device).context();
  for (const Tensor& g : grads)
    if (g.numel() > 0) kernel.add_sum_sq(ctx, g.numel(), g.raw_data(), total.data<double>());
  return total.item();  // the one host read
}

double grad_norm_sq(const Tensor& grad) {
  return grad_norm_sq(std::vector<Tensor>{grad});
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  return std::sqrt(grad_norm_sq(grads));
}

void clip_grads_with_norm(std::vector<Tensor>& grads, double max_norm, double total_norm) {
  TITAN_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: max_norm = ", max_norm,
              " must be finite and > 0");
  const double coef = clip_coefficient(max_norm, total_norm);
  if (coef == 1.0) return;
  for (Tensor& g : grads) scale_inplace(g, coef);
}

double clip_coefficient(double max_norm, double total_norm) {
  TITAN_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: max_norm = ", max_norm,
              " must be finite and > 0");
  if (!std::isfinite(total_norm)) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

double clip_grad_norm(std::vector<Tensor>& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  clip_grads_with_norm(grads, max_norm, norm);
  return norm;
}

}  // namespace titan::ops
