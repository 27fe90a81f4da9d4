// The test and parity specification of rms_norm (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(rms_norm, {"rms_norm",
                                  {"R", "D"},
                                  2,
                                  {{1, 1}, {5, 7}, {33, 128}, {3, 1000}},
                                  {},
                                  [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                                    return ParityCase{
                                        {spec_grad_input(spec_uniform({s[0], s[1]}, dt, seed, -2, 2)),
                                         spec_grad_input(spec_uniform({s[1]}, dt, seed + 1, 0.5, 1.5))},
                                        {"x", "w"},
                                        [](const std::vector<Tensor>& in) {
                                          return std::vector<Tensor>{ops::rms_norm(in[0], in[1], 1e-6)};
                                        },
                                        {"y"}};
                                  },
                                  spec_tolerance({1e-5, 1e-5}, {2e-2, 8e-3}),
                                  "SIMD sums; bf16 1-ulp flips propagate to dw",
                                  {{1, 1}, {5, 7}, {9, 130}}});

}  // namespace
}  // namespace titan::ops
