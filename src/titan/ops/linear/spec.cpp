// The test and parity specification of linear (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/linear/linear.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(linear,
                       {"linear",
                        {"M", "N", "K"},
                        3,
                        {{1, 1, 1}, {7, 33, 19}, {64, 96, 130}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_grad_input(spec_uniform({s[0], s[2]}, dt, seed)),
                                             spec_grad_input(spec_uniform({s[1], s[2]}, dt, seed + 1))},
                                            {"x", "w"},
                                            [](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{ops::linear(in[0], in[1])};
                                            },
                                            {"y"}};
                        },
                        [](const Dims& s, DType dt, Device, const std::string&) -> Tolerance {
                          // The longest sum behind an output: K for y, N for dx, M for dw.
                          const double L = double(std::max({s[0], s[1], s[2]}));
                          if (dt == DType::F64) return spec_f64_tolerance(L);
                          return dt == DType::BF16 ? Tolerance{1e-4 * L, 8e-3} : Tolerance{1e-5 * L, 1e-5};
                        },
                        "reassociation grows with the longest sum (K for y, N for dx, M for dw); bf16 output "
                        "rounded (2^-8)",
                        {{1, 1, 1}, {7, 33, 19}, {33, 17, 70}}});

}  // namespace
}  // namespace titan::ops
