// The test and parity specification of cross_entropy (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(cross_entropy,
                       {"cross_entropy",
                        {"N", "V"},
                        2,
                        {{1, 1}, {7, 1000}, {33, 257}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_grad_input(spec_uniform({s[0], s[1]}, dt, seed, -8, 8)),
                                             spec_random_labels(s[0], s[1], seed + 1)},
                                            {"logits", "labels"},
                                            [](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{ops::cross_entropy(in[0], in[1])};
                                            },
                                            {"loss"}};
                        },
                        spec_tolerance({1e-7, 2e-5}, {1e-7, 2e-5}),
                        "vector exp, summation order; bf16 widened exactly",
                        {{1, 1}, {7, 301}}});

TITAN_REGISTER_OP_SPEC(linear_cross_entropy,
                       {"linear_cross_entropy",
                        {"N", "V", "D", "chunk"},
                        3,
                        // chunk 1024: f32 rows of 4 KiB, so the CPU backward pads its dlogits rows.
                        {{1, 1, 1, 1},
                         {37, 1000, 19, 384},
                         {33, 2600, 24, 1024},
                         {13, 257, 64},
                         {16, 100, 8, 7}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t chunk = s.size() > 3 ? s[3] : 8192;
                          return ParityCase{{spec_grad_input(spec_uniform({s[0], s[2]}, dt, seed)),
                                             spec_grad_input(spec_uniform({s[1], s[2]}, dt, seed + 1)),
                                             spec_random_labels(s[0], s[1], seed + 2)},
                                            {"hidden", "weight", "labels"},
                                            [chunk](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{ops::linear_cross_entropy(
                                                  in[0], in[1], in[2], -100, chunk)};
                                            },
                                            {"loss"}};
                        },
                        [](const Dims& s, DType dt, Device, const std::string&) -> Tolerance {
                          // The longest sum behind an output: V for dhidden, N for dweight, D for the
                          // logits. f32 at a real vocabulary (N 8, V 151936, D 256) differed by 9.7e-5
                          // in dhidden: the absolute bound grows by 2e-9 per summed term past 500.
                          const double L = double(std::max({s[0], s[1], s[2]}));
                          if (dt == DType::F64) return spec_f64_tolerance(L);
                          const double grows = std::max(1.0, L / 500);
                          return dt == DType::BF16 ? Tolerance{1e-5 * grows, 1e-3}
                                                   : Tolerance{1e-6 * grows, 1e-4};
                        },
                        "GEMM reassociation grows with the longest sum (V for dhidden, N for dweight, D for "
                        "the logits); bf16 logit rounding",
                        {{1, 1, 1, 1}, {17, 300, 19, 128}, {16, 100, 8, 7}}});

}  // namespace
}  // namespace titan::ops
