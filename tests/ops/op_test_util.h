#pragma once
// Shared machinery for op tests:
//  - gradient checks: analytic backward vs central finite differences, in f64;
//  - variant checks: run an op under a forced variant, compare outputs and all
//    input gradients with the reference variant on the same inputs.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/tensor.h"
#include "titan/kernels/spec.h"

namespace titan::testing {

using OpFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Uniform random tensor in [lo, hi) with a fixed seed, converted to dtype.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0, double hi = 1.0);

// i64 labels [N] uniform in [0, V) from a fixed seed; the rows in `ignored` get ignore_index.
Tensor make_labels(int64_t N, int64_t V, uint64_t seed, const std::vector<int64_t>& ignored = {},
                   int64_t ignore_index = -100);

// Max |a - b| over all elements (shapes must match).
double max_abs_diff(const Tensor& a, const Tensor& b);
// Max |a - b| / max(|b|, floor) over all elements.
double max_rel_diff(const Tensor& a, const Tensor& b, double floor = 1e-3);

// Runs f on f64 inputs; checks d(sum_k w_k . out_k)/d(input) from backward against central
// differences for the inputs listed in `check` (all float inputs when empty). At most
// `max_entries` entries per input are probed (spread evenly). Fails the current test on mismatch.
void expect_gradcheck(const OpFn& f, const std::vector<Tensor>& inputs, double eps = 1e-6, double tol = 1e-7,
                      std::vector<int> check = {}, int max_entries = 48);

struct OpRun {
  std::vector<Tensor> outputs;
  std::vector<Tensor> input_grads;  // undefined for inputs that don't take gradients
};

// Runs f with the given variant of `op` forced, backward seeded with fixed random weights
// (seed) on every float output; returns outputs and input gradients. Inputs are copied (to
// `device`, where outputs and gradients then live too).
OpRun run_variant(const std::string& op, const std::string& variant, const OpFn& f, const std::vector<Tensor>& inputs,
                  uint64_t seed = 1234, Device device = Device::CPU);

// Runs `variant` and "reference" of `op` on the same inputs and expects every output and
// input gradient to agree within atol + rtol * |reference|.
void expect_variant_matches_reference(const std::string& op, const std::string& variant, const OpFn& f,
                                      const std::vector<Tensor>& inputs, double atol, double rtol);
// The same within a spec tolerance (atol scaled by max(1, max|reference|) of each tensor where the
// tolerance says so).
void expect_variant_matches_reference(const std::string& op, const std::string& variant, const OpFn& f,
                                      const std::vector<Tensor>& inputs, const kernels::Tolerance& tol);
// The same within the tolerance the op's spec states (ops/<op>/spec.cpp, the one `titan kernels
// parity` applies) for the problem `dims` (the spec's dimensions, e.g. {M, N, K} for linear) in
// the dtype of the first input.
void expect_variant_matches_spec(const std::string& op, const std::string& variant, const kernels::Dims& dims,
                                 const OpFn& f, const std::vector<Tensor>& inputs);

// Runs `op`'s default variant on `device` (inputs copied there) and its "reference" variant on the
// CPU, with the same inputs and backward seeds, and expects the same agreement.
void expect_device_matches_reference(const std::string& op, Device device, const OpFn& f,
                                     const std::vector<Tensor>& inputs, double atol, double rtol);

// A parameter's backward run twice from the same start, as a plain leaf and as a model parameter
// whose gradient buffer is preset (as ParamBlock does), each a copy of `start`: `step(p)` runs the
// op's forward on it and returns its backward (only the backward's CPU allocations are
// counted). `fresh` is autograd's own gradient plus `held` (what autograd would add into a buffer);
// `added` is the preset buffer, a copy of `held`, after the backward.
struct GradientIntoBuffer {
  Tensor fresh, added;
  int64_t fresh_allocations = 0, added_allocations = 0;
};
GradientIntoBuffer gradient_into_buffer(const Tensor& start, const Tensor& held,
                                        const std::function<std::function<void()>(const Tensor& p)>& step);

// f(activations, weights) on `device` with bf16 activation gradients on or off, then backward
// with seeded upstream gradients (bf16 values in f32, as seeds_for gives a bf16 output). Each
// activation passes through a probe node that takes bf16 gradients and records the dtype of the
// gradient the op returned for it.
struct ActivationGradsRun {
  std::vector<Tensor> grads;  // of every activation, then every weight, on the CPU (leaves: f32)
  std::vector<DType> seen;    // per activation: the dtype of the gradient the op returned
};
ActivationGradsRun run_activation_grads(
    const std::function<Tensor(const std::vector<Tensor>&, const std::vector<Tensor>&)>& f,
    const std::vector<Tensor>& activations, const std::vector<Tensor>& weights, bool bf16_grads,
    Device device);

// The tiers of the intrinsic CPU kernels this CPU runs, portable first, up to AVX-512 (the
// AVX512-BF16 tier only adds dot products that the bf16 attention tests cover on their own).
std::vector<cpu::KernelIsa> cpu_kernel_tiers();

// Caps cpu::kernel_isa() while it lives (cpu::limit_kernel_isa), so that a test checks each tier.
class KernelIsaCap {
 public:
  explicit KernelIsaCap(cpu::KernelIsa cap) { cpu::limit_kernel_isa(cap); }
  ~KernelIsaCap() { cpu::limit_kernel_isa(cpu::kHighestKernelIsa); }
  KernelIsaCap(const KernelIsaCap&) = delete;
  KernelIsaCap& operator=(const KernelIsaCap&) = delete;
};

}  // namespace titan::testing
