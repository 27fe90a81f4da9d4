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

// dst (the grad dtype) += src (the op dtype), as autograd accumulates gradients.
TITAN_REGISTER_OP_SPEC(add_inplace,
                       {"add_inplace",
                        {"N"},
                        1,
                        {{1}, {37}, {4099}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_uniform({s[0]}, grad_dtype(dt), seed),
                                             spec_uniform({s[0]}, dt, seed + 1)},
                                            {"dst", "src"},
                                            [](const std::vector<Tensor>& in) {
                                              Tensor dst = in[0];  // the case's own copy
                                              ops::add_inplace(dst, in[1]);
                                              return std::vector<Tensor>{dst};
                                            },
                                            {"dst"}};
                        },
                        // One correctly rounded addition per element (bf16 widened exactly).
                        spec_exact_tolerance(),
                        "one correctly rounded add per element",
                        {{1}, {37}}});

TITAN_REGISTER_OP_SPEC(scale_inplace,
                       {"scale_inplace",
                        {"N"},
                        1,
                        {{1}, {37}, {4099}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_uniform({s[0]}, dt, seed)},
                                            {"x"},
                                            [](const std::vector<Tensor>& in) {
                                              Tensor x = in[0];  // the case's own copy
                                              ops::scale_inplace(x, 0.3712);
                                              return std::vector<Tensor>{x};
                                            },
                                            {"x"}};
                        },
                        // One correctly rounded multiply per element (f32 math; bf16 rounded once).
                        spec_exact_tolerance(),
                        "one correctly rounded multiply per element",
                        {{1}, {37}}});

// The f64 total as a [1] tensor.
TITAN_REGISTER_OP_SPEC(sum,
                       {"sum",
                        {"N"},
                        1,
                        {{1}, {1000}, {200003}},
                        {},
                        [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                          return ParityCase{{spec_uniform({s[0]}, dt, seed)},
                                            {"x"},
                                            [](const std::vector<Tensor>& in) {
                                              return std::vector<Tensor>{
                                                  Tensor::full({1}, ops::sum_all(in[0]), DType::F64)};
                                            },
                                            {"sum"}};
                        },
                        // Elements in [-1, 1] summed in f64 in another order. f32 and bf16 values sum
                        // almost always exactly in f64 at these sizes; n * 2^-52 leaves room for the
                        // rare tiny element that does not.
                        [](const Dims& s, DType, Device, const std::string&) {
                          return Tolerance{double(s[0]) * 0x1p-52, 0};
                        },
                        "f64 sums in another order: n * 2^-52 absolute",
                        {{1}, {70001}}});

}  // namespace
}  // namespace titan::ops
