// The test and parity specification of rope (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/rope/rope.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(rope, {"rope",
                              {"B", "S", "H", "D"},
                              4,
                              {{1, 1, 1, 2}, {2, 7, 3, 10}, {2, 33, 4, 128}},
                              [](const Dims& s) { return s[3] % 2 == 0 ? std::string() : "D must be even"; },
                              [](const Dims& s, DType dt, uint64_t seed, const std::string& variant) {
                                // gather_free requires positions 0..S-1 (what training uses); the others are
                                // also given scattered positions per batch row, which exercises their table
                                // lookups.
                                std::vector<int64_t> pos;
                                Shape pos_shape;
                                if (variant == "gather_free") {
                                  for (int64_t i = 0; i < s[1]; ++i) pos.push_back(i);
                                  pos_shape = {s[1]};
                                } else {
                                  Tensor r = spec_random_ids(s[0] * s[1], 4096, seed + 1);
                                  pos.assign(r.data<int64_t>(), r.data<int64_t>() + r.numel());
                                  pos_shape = {s[0], s[1]};
                                }
                                return ParityCase{
                                    {spec_grad_input(spec_uniform({s[0], s[1], s[2], s[3]}, dt, seed, -3, 3)),
                                     Tensor::from_vector(pos, pos_shape)},
                                    {"x", "positions"},
                                    [](const std::vector<Tensor>& in) {
                                      return std::vector<Tensor>{ops::rope(in[0], in[1], 1e6)};
                                    },
                                    {"y"}};
                              },
                              spec_exact_tolerance(),
                              "all variants are bit-identical",
                              {{1, 1, 1, 2}, {2, 7, 3, 10}, {1, 9, 2, 64}}});

}  // namespace
}  // namespace titan::ops
