#pragma once
// Kernel parity: every registered variant of every op on a device (on the CPU: every variant but
// "reference"), run against the op's CPU "reference" variant on the same seeded random inputs, made
// on the host and copied to the device, forward and backward (input and parameter gradients),
// through the public op functions with ForceVariant. The ops, their shapes, inputs and tolerances
// come from the specs the ops register (kernels/spec.h, ops/<op>/spec.cpp); this harness knows no
// op. Behind `titan kernels parity` and tests/kernels/parity_test.cpp; docs/kernels.md.
//
// An element passes when |variant - reference| <= atol + rtol * |reference| (NaN must match NaN);
// integer outputs (router indices and counts) must be equal.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/core/dtype.h"

namespace titan::kernels {

struct ParityOptions {
  std::string op;             // one op, or "" for every op with a non-reference variant
  std::vector<DType> dtypes;  // empty: f32, bf16 and f64
  // Shapes per op (see parse_parity_shapes); ops not listed use their default shape set.
  std::map<std::string, std::vector<std::vector<int64_t>>> shapes;
  uint64_t seed = 1;
  Device device = Device::CPU;  // whose variants are checked against the CPU reference
};

enum class ParityStatus { Pass, Fail, Skipped };

struct ParityResult {
  std::string op, variant;
  DType dtype = DType::F32;
  std::string shape;  // "M=7 N=33 K=19"
  ParityStatus status = ParityStatus::Fail;
  bool compared = false;            // the numbers below were measured (false: skipped or an error)
  double max_abs = 0, max_rel = 0;  // over every output and gradient
  double atol = 0, rtol = 0;        // the tolerance applied (atol after its per-op scaling)
  // Fail: the worst element ("dw[12]: 0.5 vs 0.49") or the error raised; Skipped: why the
  // variant cannot run here (KernelEntry::available).
  std::string note;
};

// Ops with a registered spec, and the dimension names of their shapes ("M,N,K" for linear).
std::vector<std::string> parity_ops();
std::string parity_shape_dims(const std::string& op);

// "linear=7x33x19,64x64x64;rope=1x9x3x8": per op, shapes of 'x'-separated dimensions (in the order
// of parity_shape_dims) separated by ','; ops separated by ';'. Errors name the op and the rule.
std::map<std::string, std::vector<std::vector<int64_t>>> parse_parity_shapes(const std::string& spec);

// Runs the comparisons; on_result (optional) sees each result as soon as it is known. A registered
// non-reference variant of an op the harness cannot drive is reported as a failure.
std::vector<ParityResult> run_parity(const ParityOptions& options,
                                     const std::function<void(const ParityResult&)>& on_result = {});

// One line: "PASS  linear  default  f32  M=7 N=33 K=19  max_abs ... max_rel ... (atol ... rtol ...)".
std::string format_parity_result(const ParityResult& r);

}  // namespace titan::kernels
