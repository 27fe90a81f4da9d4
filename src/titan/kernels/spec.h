#pragma once
// Op specifications: how to test an op's kernels, registered by the op itself (ops/<op>/spec.cpp)
// in one place: the dimensions of its problem and the shapes checked by default, how to make seeded
// inputs for a shape (on the host), the function that runs the op, and the tolerance per dtype and
// variant. The parity harness (kernels/parity.h, `titan kernels parity`) and the op tests read them;
// the harness itself knows no op.
//
// An element passes when |variant - reference| <= atol * (atol_relative_to_max ? max(1, max|ref| of
// the tensor) : 1) + rtol * |reference| (NaN must match NaN); integer outputs must be equal.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::kernels {

using Dims = std::vector<int64_t>;

// One comparison: inputs made on the host (float inputs marked requires_grad get their gradients
// compared too), the op run on them, and the names of inputs and outputs for messages.
struct ParityCase {
  std::vector<Tensor> inputs;
  std::vector<std::string> input_names;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  std::vector<std::string> output_names;
};

struct Tolerance {
  double atol = 0, rtol = 0;
  bool atol_relative_to_max = false;
};

// The tolerance for a problem (the spec's dims), dtype and variant on a device (a device's
// "default" may round where the CPU's does not, e.g. the GPU's tensor-core attention).
using ToleranceFn = std::function<Tolerance(const Dims&, DType, Device, const std::string& variant)>;

struct OpSpec {
  std::string op;                 // the registry's op name
  std::vector<std::string> dims;  // dimension names, in the order --shapes gives them
  size_t required_dims;           // trailing dims beyond this many are optional
  std::vector<Dims> default_shapes;
  std::function<std::string(const Dims&)> check;  // "" or why the shape is invalid
  std::function<ParityCase(const Dims&, DType, uint64_t seed, const std::string& variant)> make;
  ToleranceFn tolerance;
  // Why the tolerances are what they are, one line (the last column of docs/kernels.md's table).
  std::string tolerance_why = "";
  // Small versions of the default shapes (odd sizes, a GQA group, a vocabulary chunk that does not
  // divide V, more MoE assignments than experts, ...): what the tests run in every dtype.
  std::vector<Dims> small_shapes = {};
};

void register_op_spec(OpSpec spec);
const std::vector<OpSpec>& op_specs();  // sorted by op name
const OpSpec* find_op_spec(const std::string& op);  // null when the op registered none

// Input makers for specs: seeded, on the host.
Tensor spec_uniform(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1);
Tensor spec_random_ids(int64_t n, int64_t hi, uint64_t seed);  // [n] in [0, hi)
// Labels in [0, V) with every fourth row ignored (-100), so both paths see ignored rows.
Tensor spec_random_labels(int64_t n, int64_t V, uint64_t seed);
Tensor spec_grad_input(Tensor t);  // marks t requires_grad
// f64 variants exist only where f64 is a test path; there the only difference is reassociation.
Tolerance spec_f64_tolerance(double scale = 1);
// The tolerance function of an op whose tolerance depends on the dtype only (the same for every
// shape and variant): `f32`, `bf16`, and spec_f64_tolerance() for f64.
ToleranceFn spec_tolerance(Tolerance f32, Tolerance bf16);
// The tolerance function of an op whose every variant must equal the reference bit for bit.
ToleranceFn spec_exact_tolerance();

// docs/kernels.md's tolerance table, from the specs and the registry: one row per op and
// non-reference CPU variant (registered in every build; the CUDA kernels take the spec's tolerance
// for Device::CUDA, which is the CPU default's except where the spec says otherwise), with the f32 and bf16 tolerances at the default shapes ("lo..hi" where
// they grow with the shape, "·m" where atol is relative to max(1, max|reference|), "-" where the
// variant has no kernel in that dtype) and the spec's tolerance_why. A test keeps the docs equal.
std::string tolerance_table_markdown();

struct OpSpecRegistrar {
  explicit OpSpecRegistrar(OpSpec spec) { register_op_spec(std::move(spec)); }
};

}  // namespace titan::kernels

// TITAN_REGISTER_OP_SPEC(linear, {"linear", {"M", "N", "K"}, 3, {{7, 33, 19}}, check, make, tolerance,
//                                 "why", {{1, 1, 1}, {7, 33, 19}}});
#define TITAN_REGISTER_OP_SPEC(id, ...) \
  static ::titan::kernels::OpSpecRegistrar titan_op_spec_registrar_##id(::titan::kernels::OpSpec __VA_ARGS__)
