// The test and parity specification of swiglu (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/swiglu/swiglu.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(swiglu, {"swiglu",
                                {"N"},
                                1,
                                {{1}, {37}, {4099}},
                                {},
                                [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                                  return ParityCase{
                                      {spec_grad_input(spec_uniform({s[0]}, dt, seed, -8, 8)),
                                       spec_grad_input(spec_uniform({s[0]}, dt, seed + 1, -2, 2))},
                                      {"gate", "up"},
                                      [](const std::vector<Tensor>& in) {
                                        return std::vector<Tensor>{ops::swiglu(in[0], in[1])};
                                      },
                                      {"y"}};
                                },
                                spec_tolerance({1e-6, 2e-6}, {1e-6, 8e-3}),
                                "polynomial exp ~1 ulp; bf16 1-ulp flips",
                                {{1}, {37}, {1031}}});

}  // namespace
}  // namespace titan::ops
