// The test and parity specification of moe (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/autograd/autograd.h"
#include "titan/kernels/registry.h"
#include "titan/ops/moe/moe.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(router_topk,
                       {"router_topk",
                        {"T", "E", "k"},
                        3,
                        {{1, 1, 1}, {37, 8, 2}, {64, 128, 8}},
                        [](const Dims& s) { return s[2] <= s[1] ? std::string() : "k must be <= E"; },
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t k = s[2];
                          return ParityCase{
                              {spec_grad_input(spec_uniform({s[0], s[1]}, dt, seed, -2, 2))},
                              {"logits"},
                              [k](const std::vector<Tensor>& in) {
                                auto r = ops::router_topk(in[0], k, true);
                                return std::vector<Tensor>{r.weights, r.indices.tensor(), r.probs, r.counts};
                              },
                              {"weights", "indices", "probs", "counts"}};
                        },
                        // The router's softmax runs in f32 on widened logits in every dtype: the f32 bound of
                        // a vectorised exp and reassociated sums (as cross_entropy) holds for bf16 too.
                        spec_tolerance({1e-7, 2e-5}, {1e-7, 2e-5}),
                        "softmax in f32 on widened logits, as cross_entropy",
                        {{1, 1, 1}, {37, 8, 2}, {9, 64, 8}}});

// One layer's bias moved by its counts (coeff 1e-3, three micro-batches' rows), in place.
TITAN_REGISTER_OP_SPEC(update_expert_bias,
                       {"update_expert_bias",
                        {"E"},
                        1,
                        {{1}, {8}, {128}},
                        {},
                        [](const Dims& s, DType, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_uniform({s[0]}, DType::F32, seed, -0.01, 0.01),
                                             spec_random_ids(3 * s[0], 100, seed + 1).reshape({3, s[0]})},
                                            {"bias", "counts"},
                                            [](const std::vector<Tensor>& in) {
                                              Tensor bias = in[0];  // the case's own copy
                                              ops::update_expert_bias(bias, in[1], 1e-3);
                                              return std::vector<Tensor>{bias};
                                            },
                                            {"bias"}};
                        },
                        spec_exact_tolerance(),
                        "the same i64 loads, f64 means and one f32 add per expert",
                        {{1}, {8}}});

// Two layers of T and T/2 + 1 tokens (the loss runs over all MoE layers at once); probabilities
// positive, not normalised (the loss does not need it), expert indices uniform in [0, E).
TITAN_REGISTER_OP_SPEC(moe_aux_loss,
                       {"moe_aux_loss",
                        {"T", "E", "k"},
                        3,
                        {{1, 1, 1}, {37, 8, 2}, {300, 64, 4}},
                        [](const Dims& s) { return s[2] <= s[1] ? std::string() : "k must be <= E"; },
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t T0 = s[0], T1 = s[0] / 2 + 1, E = s[1], k = s[2];
                          return ParityCase{
                              {spec_grad_input(spec_uniform({T0, E}, dt, seed, 0, 1)),
                               spec_grad_input(spec_uniform({T1, E}, dt, seed + 1, 0, 1)),
                               spec_random_ids(T0 * k, E, seed + 2).reshape({T0, k}),
                               spec_random_ids(T1 * k, E, seed + 3).reshape({T1, k})},
                              {"probs0", "probs1", "indices0", "indices1"},
                              [E, k](const std::vector<Tensor>& in) {
                                return std::vector<Tensor>{
                                    ops::moe_aux_loss({in[0], in[1]}, {in[2], in[3]}, E, k)};
                              },
                              {"aux_loss"}};
                        },
                        // f64 sums in another order, rounded to f32 once; the gradient is one product.
                        spec_tolerance({1e-7, 1e-6}, {1e-7, 1e-6}),
                        "f64 sums in another order, rounded once",
                        {{1, 1, 1}, {37, 8, 2}}});

// The experts' output rows of T*k (token, slot) pairs and their routing weights, routed by the
// reference router.
TITAN_REGISTER_OP_SPEC(moe_combine,
                       {"moe_combine",
                        {"T", "D", "E", "k"},
                        4,
                        {{1, 8, 3, 1}, {5, 6, 4, 2}, {37, 24, 7, 3}, {131, 72, 8, 2}},
                        [](const Dims& s) { return s[3] <= s[2] ? std::string() : "k must be <= E"; },
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t T = s[0], D = s[1], E = s[2], k = s[3];
                          ops::RouterOutput r;
                          {
                            autograd::NoGradGuard no_grad;
                            ForceVariant ref("router_topk", "reference");
                            r = ops::router_topk(spec_uniform({T, E}, DType::F32, seed, -2, 2), k, true);
                          }
                          const DType wdt = dt == DType::F64 ? DType::F64 : DType::F32;
                          return ParityCase{
                              {spec_grad_input(spec_uniform({T * k, D}, dt, seed + 1)),
                               spec_grad_input(r.weights.to(wdt)), r.indices.tensor()},
                              {"rows", "weights", "indices"},
                              [E](const std::vector<Tensor>& in) {
                                return std::vector<Tensor>{ops::moe_combine(
                                    in[0], in[1], ops::expert_indices(in[2], E, "moe_combine"))};
                              },
                              {"y"}};
                        },
                        // The forward's rounding points and order are the reference's on every device (a
                        // fused f32 multiply-add at most): no bf16 slack; the weights' gradient is a D-long
                        // f32 dot product, reassociated.
                        [](const Dims& s, DType dt, Device, const std::string&) -> Tolerance {
                          if (dt == DType::F64) return spec_f64_tolerance(double(s[1]));
                          return Tolerance{1e-7 * double(s[1]), 1e-5};
                        },
                        "the same rounding points and order; the weights' gradient a D-long sum, "
                        "reassociated",
                        {{1, 8, 3, 1}, {5, 6, 4, 2}, {37, 24, 7, 3}}});

TITAN_REGISTER_OP_SPEC(moe_experts,
                       {"moe_experts",
                        {"T", "D", "F", "E", "k"},
                        5,
                        {{1, 8, 4, 3, 1}, {5, 6, 4, 4, 2}, {37, 24, 20, 7, 3}, {131, 72, 40, 8, 2}},
                        [](const Dims& s) { return s[4] <= s[3] ? std::string() : "k must be <= E"; },
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          const int64_t T = s[0], D = s[1], F = s[2], E = s[3], k = s[4];
                          // Routing from the reference router on f32 logits; routing weights stay f32 (as the
                          // model passes them) while x and the expert weights take the dtype.
                          ops::RouterOutput r;
                          {
                            autograd::NoGradGuard no_grad;
                            ForceVariant ref("router_topk", "reference");
                            r = ops::router_topk(spec_uniform({T, E}, DType::F32, seed, -2, 2), k, true);
                          }
                          const DType wdt = dt == DType::F64 ? DType::F64 : DType::F32;
                          const double sd = 1.7 / std::sqrt(double(D)), sf = 1.7 / std::sqrt(double(F));
                          return ParityCase{{spec_grad_input(spec_uniform({T, D}, dt, seed + 1)),
                                             spec_grad_input(r.weights.to(wdt)), r.indices.tensor(),
                                             spec_grad_input(spec_uniform({E, F, D}, dt, seed + 2, -sd, sd)),
                                             spec_grad_input(spec_uniform({E, F, D}, dt, seed + 3, -sd, sd)),
                                             spec_grad_input(spec_uniform({E, D, F}, dt, seed + 4, -sf, sf))},
                                            {"x", "weights", "indices", "w_gate", "w_up", "w_down"},
                                            [](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{
                                                  ops::moe_experts(in[0], in[1], in[2], in[3], in[4], in[5])};
                                            },
                                            {"y"}};
                        },
                        [](const Dims& s, DType dt, Device, const std::string&) -> Tolerance {
                          const double n = double(std::max({s[0], s[1], s[2]}));
                          if (dt == DType::F64) return spec_f64_tolerance(n);
                          return dt == DType::BF16 ? Tolerance{1e-2, 1e-2} : Tolerance{1e-7 * n, 1e-5};
                        },
                        "reassociation (atol grows with max(T, D, F)); bf16 rounding flips propagate",
                        {{1, 8, 4, 3, 1}, {5, 6, 4, 4, 2}, {37, 24, 20, 7, 3}}});

}  // namespace
}  // namespace titan::ops
