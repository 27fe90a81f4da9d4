// normal_init's spec: N elements of a stream from element `begin` (odd begins and lengths split
// normal pairs), drawn plain and truncated at 2 std (5 % of values redrawn, some more than once).
#include "titan/kernels/spec.h"

#include "titan/ops/init/init.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(normal_init,
                       {"normal_init",
                        {"N", "begin"},
                        1,
                        {{1}, {4097, 1}, {1000003, 12345}},
                        [](const Dims& s) {
                          return s.size() < 2 || s[1] >= 0 ? std::string() : "begin must be >= 0";
                        },
                        [](const Dims& s, DType, uint64_t seed, const std::string&) {
                          const int64_t begin = s.size() > 1 ? s[1] : 0;
                          return ParityCase{
                              {Tensor::zeros({s[0]}, DType::F32), Tensor::zeros({s[0]}, DType::F32)},
                              {"plain", "truncated"},
                              [=](const std::vector<Tensor>& in) {
                                Tensor plain = in[0], truncated = in[1];  // the case's own copies
                                ops::normal_init(plain, seed, 0.02, 0, begin);
                                ops::normal_init(truncated, seed + 1, 0.5, 1.0, begin);
                                return std::vector<Tensor>{plain, truncated};
                              },
                              {"plain", "truncated"}};
                        },
                        spec_exact_tolerance(),
                        "the same integer and IEEE double operations on every device (normal_draw.h)",
                        {{1}, {2}, {7, 3}, {300}, {301, 1}}});

}  // namespace
}  // namespace titan::ops
