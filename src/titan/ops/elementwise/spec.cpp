// The test and parity specification of elementwise (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(add, {"add",
                             {"N"},
                             1,
                             {{1}, {37}, {4099}},
                             {},
                             [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                               return ParityCase{{spec_grad_input(spec_uniform({s[0]}, dt, seed)),
                                                  spec_grad_input(spec_uniform({s[0]}, dt, seed + 1))},
                                                 {"a", "b"},
                                                 [](const std::vector<Tensor>& in) {
                                                   return std::vector<Tensor>{ops::add(in[0], in[1])};
                                                 },
                                                 {"out"}};
                             },
                             // One correctly rounded addition per element: any variant must be exact.
                             spec_exact_tolerance(),
                             "one correctly rounded add per element",
                             {{1}, {37}}});

}  // namespace
}  // namespace titan::ops
