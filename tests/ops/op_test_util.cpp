#include "ops/op_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::testing {

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dtype);
}

Tensor make_labels(int64_t N, int64_t V, uint64_t seed, const std::vector<int64_t>& ignored, int64_t ignore_index) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> y(static_cast<size_t>(N));
  for (auto& v : y) v = int64_t(rng() % uint64_t(V));
  for (int64_t r : ignored) y[size_t(r)] = ignore_index;
  return Tensor::from_vector(y, {N});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

double max_rel_diff(const Tensor& a, const Tensor& b, double floor) {
  auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]) / std::max(std::fabs(y[i]), floor));
  return m;
}

namespace {

// The gradient of a bf16 output holds bf16 values (an f32 tensor of them): the kernels that round it
// to bf16 before their tensor-core GEMMs (linear's backward on the GPU and the CPU) then see what the
// reference sees, and the comparison measures their own arithmetic, not the rounding of their input
// (f32 seeds put a relative 2^-9 on every term of dx = dy W, which the GEMM tolerances never meant).
std::vector<Tensor> seeds_for(const std::vector<Tensor>& outputs, uint64_t seed) {
  std::vector<Tensor> w;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!dtype_is_float(o.dtype())) {
      w.emplace_back();
      continue;
    }
    Tensor g = random_tensor(o.shape(), grad_dtype(o.dtype()), seed + i);
    w.push_back(o.dtype() == DType::BF16 ? g.to(DType::BF16).to(grad_dtype(o.dtype())) : g);
  }
  return w;
}

double weighted_sum(const std::vector<Tensor>& outputs, const std::vector<Tensor>& w) {
  double s = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!w[i].defined()) continue;
    auto o = outputs[i].to_vector(), ww = w[i].to_vector();
    for (size_t k = 0; k < o.size(); ++k) s += o[k] * ww[k];
  }
  return s;
}

// Backward from the float outputs that took part in autograd.
void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& w) {
  std::vector<Tensor> outs, gs;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (w[i].defined() && outputs[i].requires_grad()) {
      outs.push_back(outputs[i]);
      gs.push_back(w[i]);
    }
  autograd::backward(autograd::current_tape(), outs, gs);
}

}  // namespace

void expect_gradcheck(const OpFn& f, const std::vector<Tensor>& inputs_in, double eps, double tol,
                      std::vector<int> check, int max_entries) {
  std::vector<Tensor> inputs;
  for (auto& t : inputs_in) inputs.push_back(t.clone());
  if (check.empty())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].dtype() == DType::F64) check.push_back(int(i));
  for (int i : check) {
    ASSERT_EQ(inputs[size_t(i)].dtype(), DType::F64) << "gradcheck input " << i << " must be f64";
    inputs[size_t(i)].set_requires_grad(true);
  }
  auto outputs = f(inputs);
  auto w = seeds_for(outputs, 99);
  run_backward(outputs, w);

  autograd::NoGradGuard no_grad;
  for (int i : check) {
    Tensor& x = inputs[size_t(i)];
    Tensor analytic = x.grad();
    int64_t n = x.numel();
    int64_t step = std::max<int64_t>(1, n / max_entries);
    for (int64_t e = 0; e < n; e += step) {
      double* p = x.data<double>() + e;
      double orig = *p;
      *p = orig + eps;
      double up = weighted_sum(f(inputs), w);
      *p = orig - eps;
      double down = weighted_sum(f(inputs), w);
      *p = orig;
      double numeric = (up - down) / (2 * eps);
      double got = analytic.defined() ? analytic.data<double>()[e] : 0.0;
      EXPECT_NEAR(got, numeric, tol * std::max(1.0, std::fabs(numeric)))
          << "input " << i << " " << x.str() << " element " << e;
    }
  }
}

OpRun run_variant(const std::string& op, const std::string& variant, const OpFn& f, const std::vector<Tensor>& inputs_in,
                  uint64_t seed, Device device) {
  kernels::ForceVariant force(op, variant);
  std::vector<Tensor> inputs;
  for (auto& t : inputs_in) {
    Tensor c = device == t.device() ? t.clone() : t.to(device);
    if (dtype_is_float(c.dtype()) && t.requires_grad()) c.set_requires_grad(true);
    inputs.push_back(c);
  }
  OpRun run;
  run.outputs = f(inputs);
  auto w = seeds_for(run.outputs, seed);
  for (auto& t : w)
    if (t.defined() && device != Device::CPU) t = t.to(device);
  run_backward(run.outputs, w);
  for (auto& t : inputs) run.input_grads.push_back(t.grad());
  return run;
}

namespace {

// Expects every output and input gradient of `got` within the tolerance of `ref` (on any devices).
void expect_runs_agree(const OpRun& got, const OpRun& ref, const std::string& what_ran, const kernels::Tolerance& tol) {
  auto compare = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    ASSERT_EQ(a.defined(), b.defined()) << what;
    if (!a.defined()) return;
    ASSERT_EQ(a.shape(), b.shape()) << what;
    auto x = a.to_vector(), y = b.to_vector();
    double max_ref = 0;
    for (double v : y)
      if (std::isfinite(v)) max_ref = std::max(max_ref, std::fabs(v));
    const double atol = tol.atol * (tol.atol_relative_to_max ? std::max(1.0, max_ref) : 1.0), rtol = tol.rtol;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      double excess = std::fabs(x[i] - y[i]) - (atol + rtol * std::fabs(y[i]));
      if (std::isnan(x[i]) != std::isnan(y[i])) excess = INFINITY;
      if (excess > worst) { worst = excess; at = i; }
    }
    EXPECT_LE(worst, 0.0) << what_ran << " " << what << " differs from reference at element " << at << ": "
                          << x[at] << " vs " << y[at] << " (atol " << atol << ", rtol " << rtol << ")";
  };
  for (size_t i = 0; i < ref.outputs.size(); ++i) compare(got.outputs[i], ref.outputs[i], "output " + std::to_string(i));
  for (size_t i = 0; i < ref.input_grads.size(); ++i)
    compare(got.input_grads[i], ref.input_grads[i], "gradient of input " + std::to_string(i));
}

}  // namespace

void expect_variant_matches_reference(const std::string& op, const std::string& variant, const OpFn& f,
                                      const std::vector<Tensor>& inputs, double atol, double rtol) {
  expect_variant_matches_reference(op, variant, f, inputs, kernels::Tolerance{atol, rtol});
}

void expect_variant_matches_reference(const std::string& op, const std::string& variant, const OpFn& f,
                                      const std::vector<Tensor>& inputs, const kernels::Tolerance& tol) {
  OpRun ref = run_variant(op, "reference", f, inputs);
  OpRun got = run_variant(op, variant, f, inputs);
  expect_runs_agree(got, ref, op + " variant '" + variant + "'", tol);
}

void expect_variant_matches_spec(const std::string& op, const std::string& variant, const kernels::Dims& dims,
                                 const OpFn& f, const std::vector<Tensor>& inputs) {
  const kernels::OpSpec* spec = kernels::find_op_spec(op);
  ASSERT_NE(spec, nullptr) << op << " registers no spec";
  ASSERT_FALSE(inputs.empty());
  expect_variant_matches_reference(op, variant, f, inputs, spec->tolerance(dims, inputs[0].dtype(), Device::CPU, variant));
}

void expect_device_matches_reference(const std::string& op, Device device, const OpFn& f,
                                     const std::vector<Tensor>& inputs, double atol, double rtol) {
  OpRun ref = run_variant(op, "reference", f, inputs);
  OpRun got = run_variant(op, "default", f, inputs, 1234, device);
  for (const Tensor& t : got.outputs)
    EXPECT_TRUE(!t.defined() || t.device() == device) << op << ": an output left the device";
  for (const Tensor& t : got.input_grads)
    EXPECT_TRUE(!t.defined() || t.device() == device) << op << ": a gradient left the device";
  expect_runs_agree(got, ref, op + " on " + std::string(device_name(device)), kernels::Tolerance{atol, rtol});
}

GradientIntoBuffer gradient_into_buffer(const Tensor& start, const Tensor& held,
                                        const std::function<std::function<void()>(const Tensor& p)>& step) {
  GradientIntoBuffer r;
  DeviceServices& cpu = device_services(Device::CPU);
  for (bool preset : {false, true}) {
    Tensor p = start.clone().set_requires_grad(true);
    Tensor buffer = held.clone();
    if (preset) p.set_grad(buffer);
    const std::function<void()> backward = step(p);
    const int64_t before = cpu.stats().total_allocations;
    backward();
    (preset ? r.added_allocations : r.fresh_allocations) = cpu.stats().total_allocations - before;
    (preset ? r.added : r.fresh) = preset ? buffer : ops::add(p.grad(), held);
  }
  return r;
}

namespace {
// A copy with its own storage and no autograd state (to() may hand back t itself on its device).
Tensor fresh_copy(const Tensor& t, Device device) {
  return t.device() == device ? t.clone() : t.to(device);
}
}  // namespace

ActivationGradsRun run_activation_grads(
    const std::function<Tensor(const std::vector<Tensor>&, const std::vector<Tensor>&)>& f,
    const std::vector<Tensor>& activations, const std::vector<Tensor>& weights, bool bf16_grads,
    Device device) {
  autograd::Bf16ActivationGradientsScope setting(bf16_grads);
  ActivationGradsRun r;
  r.seen.assign(activations.size(), DType::F64);
  std::vector<Tensor> leaves, probed, w;
  for (size_t i = 0; i < activations.size(); ++i) {
    leaves.push_back(fresh_copy(activations[i], device).set_requires_grad(true));
    Tensor out = leaves.back().detach();
    DType* seen = &r.seen[i];
    autograd::record(
        "probe", {leaves.back()}, {&out},
        [seen](const std::vector<Tensor>& g) {
          *seen = g[0].dtype();
          return std::vector<Tensor>{g[0]};
        },
        /*takes_bf16_grads=*/true);
    probed.push_back(out);
  }
  for (const Tensor& t : weights) w.push_back(fresh_copy(t, device).set_requires_grad(true));
  const Tensor y = f(probed, w);
  Tensor seed = seeds_for({y}, 99)[0];
  if (device != Device::CPU) seed = seed.to(device);
  autograd::backward(autograd::current_tape(), {y}, {seed});
  for (const Tensor& t : leaves) r.grads.push_back(t.grad().to(Device::CPU));
  for (const Tensor& t : w) r.grads.push_back(t.grad().to(Device::CPU));
  return r;
}

std::vector<cpu::KernelIsa> cpu_kernel_tiers() {
  std::vector<cpu::KernelIsa> tiers;
  for (auto t : {cpu::KernelIsa::kPortable, cpu::KernelIsa::kAvx2, cpu::KernelIsa::kAvx512})
    if (t <= cpu::cpu_kernel_isa()) tiers.push_back(t);
  return tiers;
}

}  // namespace titan::testing
