// The test and parity specification of attention (kernels/spec.h): shapes, seeded inputs and the
// tolerance per dtype and variant, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/attention/attention.h"

namespace titan::ops {
namespace {

using namespace kernels;

TITAN_REGISTER_OP_SPEC(
    attention,
    {"attention",
     {"B", "S", "Hq", "Hkv", "D"},
     5,
     {{1, 1, 2, 1, 8}, {2, 37, 4, 2, 64}, {1, 70, 4, 1, 25}},
     [](const Dims& s) { return s[2] % s[3] == 0 ? std::string() : "Hq must be a multiple of Hkv"; },
     [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
       const double scale = 1.0 / std::sqrt(double(s[4]));
       return ParityCase{{spec_grad_input(spec_uniform({s[0], s[1], s[2], s[4]}, dt, seed, -2, 2)),
                          spec_grad_input(spec_uniform({s[0], s[1], s[3], s[4]}, dt, seed + 1, -2, 2)),
                          spec_grad_input(spec_uniform({s[0], s[1], s[3], s[4]}, dt, seed + 2))},
                         {"q", "k", "v"},
                         [scale](const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{ops::attention(in[0], in[1], in[2], scale)};
                         },
                         {"out"}};
     },
     [](const Dims& s, DType dt, Device device, const std::string& variant) -> Tolerance {
       if (dt == DType::F64) return spec_f64_tolerance();
       // bf16_probs rounds P and dS to bf16 (tests/backend/attention_test.cpp, Bf16Probs...), as do
       // the GPU's tensor-core kernels: its bf16 "default" and "mma_sync" where head_dim is 64 or 128
       // (elsewhere they run the f32-math kernels, which "f32_math" runs everywhere).
       // cuDNN's fused attention ("cudnn") rounds them too, and its bf16 gradients, at every head_dim
       // it takes (a multiple of 8 up to 128; shapes it refuses run the f32-math kernels, within this).
       const bool cudnn = variant == "cudnn" && s[4] % 8 == 0 && s[4] <= 128;
       const bool gpu_tensor_cores = device == Device::CUDA && dt == DType::BF16 && variant != "f32_math" &&
                                     (s[4] == 64 || s[4] == 128 || cudnn);
       if (variant == "bf16_probs" || gpu_tensor_cores) return Tolerance{1e-2, 1e-2, true};
       // bf16: each side rounds its f32 result once, so two results near a rounding boundary land
       // one bf16 step apart: up to 2^-7 of the value.
       return dt == DType::BF16 ? Tolerance{1e-4, 8e-3, true} : Tolerance{2e-5, 2e-5, true};
     },
     "summation order; m = max(1, max\\|reference\\|) of each tensor; bf16 outputs rounded once on each side "
     "(one bf16 step, 2^-7, apart); bf16_probs rounds P and dS to bf16",
     {{1, 1, 2, 1, 8}, {2, 19, 4, 2, 16}, {1, 70, 2, 1, 25}}});

}  // namespace
}  // namespace titan::ops
