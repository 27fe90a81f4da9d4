// The test and parity specification of embedding (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/embedding/embedding.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(embedding,
                       {"embedding",
                        {"N", "V", "D"},
                        3,
                        {{1, 1, 1}, {41, 37, 19}, {333, 1013, 97}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          // A padding row in the middle of the table (the one-row table has
                          // none, so some case adds into every row it holds).
                          const int64_t padding_idx = s[1] > 1 ? s[1] / 2 : -1;
                          return ParityCase{
                              {spec_random_ids(s[0], s[1], seed),
                               spec_grad_input(spec_uniform({s[1], s[2]}, dt, seed + 1))},
                              {"ids", "table"},
                              [padding_idx](const std::vector<Tensor>& in) {
                                return std::vector<Tensor>{ops::embedding(in[0], in[1], padding_idx)};
                              },
                              {"out"}};
                        },
                        spec_exact_tolerance(),
                        "exact",
                        {{1, 1, 1}, {41, 37, 19}}});

}  // namespace
}  // namespace titan::ops
