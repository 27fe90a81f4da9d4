// The test and parity specification of optim (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/optim/optim.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(adamw,
                       {"adamw",
                        {"n"},
                        1,
                        {{1}, {1000}, {65537}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t n = s[0];
                          // Three AdamW steps from non-zero moments, each with its own gradient, then
                          // an Adam step (weight decay as an L2 term) with the last one. f32 params
                          // also write the bf16 compute copy a bf16 job keeps (compared as f32).
                          const bool copy = dt == DType::F32;
                          std::vector<std::string> outputs = {"param", "exp_avg", "exp_avg_sq"};
                          if (copy) outputs.push_back("compute_copy");
                          return ParityCase{
                              {spec_uniform({n}, dt, seed), spec_uniform({n}, dt, seed + 1, -1e-2, 1e-2),
                               spec_uniform({n}, dt, seed + 2, 0, 1e-4), spec_uniform({n}, dt, seed + 3),
                               spec_uniform({n}, dt, seed + 4, -1e-3, 1e-3),
                               spec_uniform({n}, dt, seed + 5, -10, 10)},
                              {"param", "exp_avg", "exp_avg_sq", "grad1", "grad2", "grad3"},
                              [copy](const std::vector<Tensor>& in) {
                                Tensor p = in[0], m = in[1], v = in[2];
                                Tensor bf16 =
                                    copy ? Tensor::empty(p.shape(), DType::BF16, p.device()) : Tensor();
                                Tensor* into = copy ? &bf16 : nullptr;
                                for (int64_t t = 1; t <= 3; ++t)
                                  ops::adamw_step(p, in[size_t(2 + t)], m, v, {}, t, 1.0, into);
                                ops::AdamWConfig adam;
                                adam.decoupled_weight_decay = false;
                                ops::adamw_step(p, in[5], m, v, adam, 4, 1.0, into);
                                std::vector<Tensor> out{p, m, v};
                                if (copy) out.push_back(bf16.to(DType::F32));
                                return out;
                              },
                              outputs};
                        },
                        // optim_test: bit-identical to the reference (same fused multiply-adds).
                        spec_exact_tolerance(),
                        "bit-identical (same fused multiply-adds)",
                        {{1}, {1000}}});

TITAN_REGISTER_OP_SPEC(grad_norm,
                       {"grad_norm",
                        {"n"},
                        1,
                        {{1}, {1000}, {200003}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_uniform({s[0]}, dt, seed)},
                                            {"grad"},
                                            [](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{
                                                  Tensor::full({1}, ops::grad_norm_sq(in[0]), DType::F64)};
                                            },
                                            {"sum_sq"}};
                        },
                        // optim_test: exact squares summed in f64 in another order, n ulps of the sum.
                        [](const Dims& s, DType, Device, const std::string&) {
                          return Tolerance{0, double(s[0]) * 0x1p-52};
                        },
                        "f64 sums in another order: n ulps",
                        {{1}, {70001}}});

}  // namespace
}  // namespace titan::ops
