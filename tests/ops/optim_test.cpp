#include "titan/ops/optim/optim.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

using namespace titan;
using namespace titan::testing;

namespace {

const char* kPython = "/usr/bin/python3";

struct AdamState {
  Tensor p, g, m, v;
};

AdamState adam_state(int64_t n, uint64_t seed) {
  return {random_tensor({n}, DType::F32, seed), Tensor::zeros({n}, DType::F32),
          Tensor::zeros({n}, DType::F32), Tensor::zeros({n}, DType::F32)};
}

// Runs `steps` AdamW steps with fresh gradients (scaled by the step, so the moments see changing
// magnitudes) under the given variant; returns the final state.
AdamState run_adamw(const std::string& variant, int64_t n, const ops::AdamWConfig& c, int steps) {
  kernels::ForceVariant force("adamw", variant);
  AdamState s = adam_state(n, 11);
  for (int t = 1; t <= steps; ++t) {
    s.g = random_tensor({n}, DType::F32, 100 + uint64_t(t), -0.01 * t, 0.01 * t);
    ops::adamw_step(s.p, s.g, s.m, s.v, c, t);
  }
  return s;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

bool have_torch() {
  static const bool ok = run_command(std::string(kPython) + " -c 'import torch, numpy'", nullptr) == 0;
  return ok;
}

void write_f32(const std::filesystem::path& path, const std::vector<Tensor>& ts) {
  std::ofstream out(path, std::ios::binary);
  for (const Tensor& t : ts) out.write(static_cast<const char*>(t.raw_data()), std::streamsize(t.nbytes()));
}

Tensor read_f32(const std::filesystem::path& path, int64_t n, int64_t offset = 0) {
  Tensor t = Tensor::empty({n}, DType::F32);
  std::ifstream in(path, std::ios::binary);
  in.seekg(std::streamoff(offset * 4));
  in.read(static_cast<char*>(t.raw_data()), std::streamsize(n * 4));
  EXPECT_TRUE(in.good()) << path;
  return t;
}

// Elements agree to within `ulps` units in the last place of the torch value (inf/nan must match).
void expect_close_ulps(const Tensor& got, const Tensor& want, double ulps, const std::string& what) {
  auto a = got.to_vector(), b = want.to_vector();
  ASSERT_EQ(a.size(), b.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(b[i]) || std::isinf(b[i]))
      ok = std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i];
    else
      ok =
          std::fabs(a[i] - b[i]) <= ulps * std::ldexp(1.0, std::ilogb(std::max(std::fabs(b[i]), 1e-38)) - 23);
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ, first at " << first << ": "
                    << a[size_t(first)] << " vs torch " << b[size_t(first)];
}

}  // namespace

TEST(AdamW, VariantsAreBitIdenticalToReference) {
  // Odd sizes: below one vector, across the masked tail, and above the threading threshold.
  for (int64_t n : {1, 15, 17, 4099, 300007})
    for (const auto& [wd, decoupled] :
         std::vector<std::pair<double, bool>>{{0.0, true}, {0.1, true}, {0.1, false}}) {
      ops::AdamWConfig c{.lr = 3e-3, .weight_decay = wd, .decoupled_weight_decay = decoupled};  // false: Adam
      AdamState ref = run_adamw("reference", n, c, 4);
      for (const char* variant : {"default", "portable"})
        for (cpu::KernelIsa tier : cpu_kernel_tiers()) {  // every tier the "default" variant has
          KernelIsaCap cap(tier);
          const std::string what = std::string(variant) + " (" + cpu::kernel_isa_name(tier) +
                                   " cap) n=" + std::to_string(n) + " wd=" + std::to_string(wd) +
                                   (decoupled ? "" : " Adam");
          AdamState got = run_adamw(variant, n, c, 4);
          EXPECT_TRUE(bitwise_equal(got.p, ref.p)) << what << " param";
          EXPECT_TRUE(bitwise_equal(got.m, ref.m)) << what << " exp_avg";
          EXPECT_TRUE(bitwise_equal(got.v, ref.v)) << what << " exp_avg_sq";
        }
    }
}

// A bf16 job's optimizer writes the bf16 copy of the weights its forward reads (ParamBlock::
// keep_compute_shard) in the same pass: in every variant and tier the copy is the updated params
// cast to bf16, bit for bit (ties to even, NaN kept), and the update itself does not change.
TEST(AdamW, ComputeCopyIsTheUpdatedParamsCastToBf16) {
  for (int64_t n : {1, 15, 17, 4099, 4096 * 3 + 5, 300007}) {
    const ops::AdamWConfig c{.lr = 3e-3, .weight_decay = 0.1};
    AdamState ref = run_adamw("reference", n, c, 2);
    for (const char* variant : {"reference", "default", "portable"})
      for (cpu::KernelIsa tier : cpu_kernel_tiers()) {
        KernelIsaCap cap(tier);
        kernels::ForceVariant force("adamw", variant);
        const std::string what =
            std::string(variant) + " (" + cpu::kernel_isa_name(tier) + " cap) n=" + std::to_string(n);
        AdamState s = adam_state(n, 11);
        // Weights that round to bf16 ties and away from them, and one that is not a number: the
        // update keeps the low bits that decide them (a zero gradient with no decay moves nothing).
        const uint32_t patterns[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7fc00001u, 0xff800000u};
        for (int64_t i = 0; i < n && i < 5 * 4; i += 4)
          std::memcpy(s.p.data<float>() + i, &patterns[i / 4], 4);
        Tensor copy = Tensor::full({n}, 7.0, DType::BF16);
        ops::adamw_step(s.p, s.g, s.m, s.v, {.lr = 3e-3, .weight_decay = 0.0}, 1, 1.0, &copy);
        EXPECT_TRUE(bitwise_equal(copy, s.p.to(DType::BF16))) << what << " ties and NaN";
        // Updates from random gradients: the same params as without a copy, and their cast.
        s = adam_state(n, 11);
        for (int t = 1; t <= 2; ++t) {
          s.g = random_tensor({n}, DType::F32, 100 + uint64_t(t), -0.01 * t, 0.01 * t);
          ops::adamw_step(s.p, s.g, s.m, s.v, c, t, 1.0, &copy);
        }
        EXPECT_TRUE(bitwise_equal(s.p, ref.p)) << what << " param";
        EXPECT_TRUE(bitwise_equal(s.m, ref.m)) << what << " exp_avg";
        EXPECT_TRUE(bitwise_equal(s.v, ref.v)) << what << " exp_avg_sq";
        EXPECT_TRUE(bitwise_equal(copy, s.p.to(DType::BF16))) << what << " bf16 copy";
      }
  }
}

// The trainer folds gradient clipping into the update (grad_scale = the clip coefficient): every
// variant must give, bit for bit, what scaling the gradient in place and then stepping gives, and
// leave the gradient buffer untouched.
TEST(AdamW, GradScaleEqualsClippingTheGradientFirst) {
  const double coef = ops::clip_coefficient(1.0, 3.7);
  ASSERT_LT(coef, 1.0);
  for (int64_t n : {15, 4099, 300007})
    for (const char* variant : {"reference", "default", "portable"}) {
      kernels::ForceVariant force("adamw", variant);
      const ops::AdamWConfig c{.lr = 3e-3, .weight_decay = 0.1};
      AdamState a = adam_state(n, 21), b = adam_state(n, 21);
      const Tensor g = random_tensor({n}, DType::F32, 22, -0.05, 0.05), g_before = g.clone();
      std::vector<Tensor> clipped{g.clone()};
      ops::clip_grads_with_norm(clipped, 1.0, 3.7);
      for (int64_t t = 1; t <= 2; ++t) {
        ops::adamw_step(a.p, clipped[0], a.m, a.v, c, t);
        ops::adamw_step(b.p, g, b.m, b.v, c, t, coef);
      }
      EXPECT_TRUE(bitwise_equal(a.p, b.p)) << variant << " n=" << n << " param";
      EXPECT_TRUE(bitwise_equal(a.m, b.m)) << variant << " n=" << n << " exp_avg";
      EXPECT_TRUE(bitwise_equal(a.v, b.v)) << variant << " n=" << n << " exp_avg_sq";
      EXPECT_TRUE(bitwise_equal(g, g_before)) << variant << " n=" << n << " the gradient was modified";
    }
  EXPECT_EQ(ops::clip_coefficient(1.0, 0.5), 1.0);
  EXPECT_EQ(ops::clip_coefficient(1.0, NAN), 1.0);
}

TEST(AdamW, F32MatchesF64Reference) {
  // The same formula in f64: checks the f32 path rounds only where it must.
  const int64_t n = 1001;
  ops::AdamWConfig c{.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05};
  AdamState s32 = adam_state(n, 5);
  AdamState s64{s32.p.to(DType::F64), Tensor(), Tensor::zeros({n}, DType::F64),
                Tensor::zeros({n}, DType::F64)};
  for (int t = 1; t <= 5; ++t) {
    Tensor g = random_tensor({n}, DType::F32, 40 + uint64_t(t));
    ops::adamw_step(s32.p, g, s32.m, s32.v, c, t);
    Tensor g64 = g.to(DType::F64);
    ops::adamw_step(s64.p, g64, s64.m, s64.v, c, t);
  }
  // Moments of size ~1 carry f32 rounding (~1e-7 absolute; relative error grows where m cancels).
  EXPECT_LT(max_abs_diff(s32.p, s64.p), 1e-6);
  EXPECT_LT(max_abs_diff(s32.m, s64.m), 2e-7);
  EXPECT_LT(max_abs_diff(s32.v, s64.v), 2e-7);
}

TEST(AdamW, FirstStepMovesEachParameterByLrTimesSignOfGradient) {
  // Step 1 from zero moments: m/(1-b1) = g, sqrt(v/(1-b2)) = |g|, so p -= lr * g / (|g| + eps).
  const int64_t n = 257;
  for (double wd : {0.0, 0.1}) {
    ops::AdamWConfig c{.lr = 1e-2, .weight_decay = wd};
    AdamState s = adam_state(n, 3);
    Tensor p0 = s.p.clone();
    s.g = random_tensor({n}, DType::F32, 4);
    ops::adamw_step(s.p, s.g, s.m, s.v, c, 1);
    auto p = s.p.to_vector(), q = p0.to_vector(), g = s.g.to_vector();
    for (int64_t i = 0; i < n; ++i) {
      double want = q[size_t(i)] * (1 - c.lr * wd) - c.lr * g[size_t(i)] / (std::fabs(g[size_t(i)]) + c.eps);
      ASSERT_NEAR(p[size_t(i)], want, 1e-6) << "element " << i << " wd " << wd;
    }
  }
}

TEST(AdamW, ZeroGradientOnlyDecaysWeights) {
  const int64_t n = 100;
  ops::AdamWConfig c{.lr = 1e-2, .weight_decay = 0.1};
  AdamState s = adam_state(n, 9);
  Tensor p0 = s.p.clone();
  ops::adamw_step(s.p, s.g, s.m, s.v, c, 1);
  auto p = s.p.to_vector(), q = p0.to_vector();
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_EQ(float(p[i]), float(q[i]) * float(1 - c.lr * c.weight_decay));
  EXPECT_EQ(max_abs_diff(s.m, Tensor::zeros({n}, DType::F32)), 0.0);
  EXPECT_EQ(max_abs_diff(s.v, Tensor::zeros({n}, DType::F32)), 0.0);
  // Without weight decay nothing moves at all.
  c.weight_decay = 0;
  ops::adamw_step(s.p, s.g, s.m, s.v, c, 2);
  EXPECT_TRUE(bitwise_equal(s.p, Tensor::from_vector(std::vector<float>(p.begin(), p.end()), {n})));
}

TEST(AdamW, MatchesTorchOverSeveralSteps) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and numpy not available";
  const int64_t n = 4099;  // not a multiple of the vector width: torch's scalar tail is checked too
  const int steps = 6;
  struct Case {
    ops::AdamWConfig c;
    double grad_scale;
  };
  const std::vector<Case> cases = {
      {{.lr = 1e-3, .weight_decay = 0.1}, 1e-2},
      {{.lr = 3e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0}, 1.0},
      // Huge gradients: (1 - beta2) * g * g overflows f32 for the largest, so v = inf and the update is -0.
      {{.lr = 1e-3, .weight_decay = 0.1}, 1e20},
      // torch.optim.Adam: weight decay added to the gradient (L2), small and large against it.
      {{.lr = 1e-3, .weight_decay = 0.1, .decoupled_weight_decay = false}, 1e-2},
      {{.lr = 3e-2, .beta1 = 0.8, .weight_decay = 30.0, .decoupled_weight_decay = false}, 1.0},
  };
  auto dir = temp_dir("optim_adamw_torch");
  // One line per case: lr beta1 beta2 eps weight_decay decoupled (1: AdamW, 0: Adam); case k reads
  // p0_k.bin and g_k.bin ([steps, n]).
  const char* script = R"PY(
import sys, numpy as np, torch
d, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for k, line in enumerate(open(d + "/cases.txt")):
    lr, b1, b2, eps, wd, decoupled = map(float, line.split())
    p = torch.nn.Parameter(torch.from_numpy(np.fromfile(d + f"/p0_{k}.bin", dtype=np.float32)))
    g = torch.from_numpy(np.fromfile(d + f"/g_{k}.bin", dtype=np.float32)).reshape(steps, n)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = kind([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(steps):
        p.grad = g[t].clone()
        opt.step()
    st = opt.state[p]
    out = [p.detach().numpy(), st["exp_avg"].numpy(), st["exp_avg_sq"].numpy()]
    np.concatenate(out).tofile(d + f"/out_{k}.bin")
)PY";
  std::ofstream(dir / "adamw.py") << script;
  std::ofstream cases_txt(dir / "cases.txt");
  cases_txt.precision(17);
  std::vector<AdamState> states;
  std::vector<std::vector<Tensor>> grads(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const ops::AdamWConfig& c = cases[k].c;
    cases_txt << c.lr << " " << c.beta1 << " " << c.beta2 << " " << c.eps << " " << c.weight_decay << " "
              << int(c.decoupled_weight_decay) << "\n";
    states.push_back(adam_state(n, 21 + k));
    write_f32(dir / ("p0_" + std::to_string(k) + ".bin"), {states[k].p});
    for (int t = 0; t < steps; ++t) {
      const double a = cases[k].grad_scale;
      grads[k].push_back(random_tensor({n}, DType::F32, 200 + uint64_t(t), -a, a));
      if (t == 2) grads[k].back().data<float>()[7] = 0.f;
    }
    write_f32(dir / ("g_" + std::to_string(k) + ".bin"), grads[k]);
  }
  cases_txt.close();
  std::string out;
  ASSERT_EQ(run_command(std::string(kPython) + " " + (dir / "adamw.py").string() + " " + dir.string() + " " +
                            std::to_string(n) + " " + std::to_string(steps),
                        &out),
            0)
      << out;
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    AdamState& s = states[k];
    for (int t = 0; t < steps; ++t) ops::adamw_step(s.p, grads[k][size_t(t)], s.m, s.v, cases[k].c, t + 1);
    // Bit-identical with Debian torch 1.13 on Zen4 (measured: 0 ulps); 1 ulp allows another build's rounding.
    auto file = dir / ("out_" + std::to_string(k) + ".bin");
    expect_close_ulps(s.p, read_f32(file, n, 0), 1, "param");
    expect_close_ulps(s.m, read_f32(file, n, n), 1, "exp_avg");
    expect_close_ulps(s.v, read_f32(file, n, 2 * n), 1, "exp_avg_sq");
  }
}

TEST(AdamW, BadArgumentsNameTheFieldOrShapes) {
  AdamState s = adam_state(8, 1);
  auto step = [&](ops::AdamWConfig c, int64_t t = 1) { ops::adamw_step(s.p, s.g, s.m, s.v, c, t); };
  EXPECT_NE(error_of([&] { step({.lr = -1e-3}); }).find("lr = -0.001"), std::string::npos);
  EXPECT_NE(error_of([&] { step({.beta1 = 1.0}); }).find("beta1 = 1 must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of([&] { step({.beta2 = -0.1}); }).find("beta2"), std::string::npos);
  EXPECT_NE(error_of([&] { step({.eps = -1}); }).find("eps"), std::string::npos);
  EXPECT_NE(error_of([&] { step({.weight_decay = -0.1}); }).find("weight_decay"), std::string::npos);
  EXPECT_NE(error_of([&] {
              step({.lr = std::numeric_limits<double>::quiet_NaN()});
            }).find("lr = nan must be finite"),
            std::string::npos);
  EXPECT_NE(error_of([&] { step({}, 0); }).find("step = 0 must be >= 1"), std::string::npos);

  Tensor short_grad = Tensor::zeros({7}, DType::F32);
  std::string m = error_of([&] { ops::adamw_step(s.p, short_grad, s.m, s.v, {}, 1); });
  EXPECT_NE(m.find("adamw: grad f32[7] does not match param f32[8]"), std::string::npos) << m;
  Tensor bf = s.p.to(DType::BF16), bg = s.g.to(DType::BF16), bm = s.m.to(DType::BF16),
         bv = s.v.to(DType::BF16);
  m = error_of([&] { ops::adamw_step(bf, bg, bm, bv, {}, 1); });
  EXPECT_NE(m.find("adamw: param bf16[8] must be f32"), std::string::npos) << m;
  Tensor wide = Tensor::zeros({8, 2}, DType::F32), strided = wide.narrow(1, 0, 1);
  Tensor p2 = Tensor::zeros({8, 1}, DType::F32), m2 = p2.clone(), v2 = p2.clone();
  m = error_of([&] { ops::adamw_step(p2, strided, m2, v2, {}, 1); });
  EXPECT_NE(m.find("grad f32[8, 1] must be contiguous"), std::string::npos) << m;

  Tensor f32_copy = Tensor::zeros({8}, DType::F32), short_copy = Tensor::zeros({7}, DType::BF16);
  m = error_of([&] { ops::adamw_step(s.p, s.g, s.m, s.v, {}, 1, 1.0, &f32_copy); });
  EXPECT_NE(m.find("adamw: compute_copy f32[8] must be a contiguous bf16 tensor of param's 8 elements"),
            std::string::npos)
      << m;
  m = error_of([&] { ops::adamw_step(s.p, s.g, s.m, s.v, {}, 1, 1.0, &short_copy); });
  EXPECT_NE(m.find("compute_copy bf16[7]"), std::string::npos) << m;
  Tensor p64 = s.p.to(DType::F64), g64 = s.g.to(DType::F64), m64 = s.m.to(DType::F64),
         v64 = s.v.to(DType::F64), copy = Tensor::zeros({8}, DType::BF16);
  m = error_of([&] { ops::adamw_step(p64, g64, m64, v64, {}, 1, 1.0, &copy); });
  EXPECT_NE(m.find("a compute_copy is written from f32 params, not f64[8]"), std::string::npos) << m;
}

TEST(GradNorm, VariantsMatchReference) {
  for (int64_t n : {1, 31, 65536, 65537, 200003}) {
    Tensor g = random_tensor({n}, DType::F32, uint64_t(n), -3, 3);
    double ref, def, port;
    {
      kernels::ForceVariant f("grad_norm", "reference");
      ref = ops::grad_norm_sq(g);
    }
    {
      kernels::ForceVariant f("grad_norm", "portable");
      port = ops::grad_norm_sq(g);
    }
    // Exact squares summed in f64 in different orders: the serial reference's error bound is n ulps.
    const double tol = double(n) * 0x1p-52 * ref;
    EXPECT_NEAR(port, ref, tol) << n;
    for (cpu::KernelIsa tier : cpu_kernel_tiers()) {  // every tier the "default" variant has
      kernels::ForceVariant f("grad_norm", "default");
      KernelIsaCap cap(tier);
      def = ops::grad_norm_sq(g);
      EXPECT_NEAR(def, ref, tol) << n << " " << cpu::kernel_isa_name(tier);
    }
  }
  // f64 (tests) goes through the reference.
  Tensor g64 = random_tensor({1000}, DType::F64, 3);
  double want = 0;
  for (double x : g64.to_vector()) want += x * x;
  EXPECT_NEAR(ops::grad_norm_sq(g64), want, 1e-12 * want);
  EXPECT_EQ(ops::grad_norm_sq(Tensor::zeros({0}, DType::F32)), 0.0);
}

TEST(GradNorm, IndependentOfThreadCount) {
  Tensor g = random_tensor({300001}, DType::F32, 8);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  double one = ops::grad_norm_sq(g);
  omp_set_num_threads(3);
  double three = ops::grad_norm_sq(g);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);
}

TEST(GradNorm, GlobalNormIsNormOfConcatenation) {
  std::vector<Tensor> gs = {random_tensor({17}, DType::F32, 1), random_tensor({3, 5}, DType::F32, 2),
                            random_tensor({70000}, DType::F32, 3)};
  double sum = 0;
  for (auto& g : gs)
    for (double x : g.to_vector()) sum += x * x;
  EXPECT_NEAR(ops::global_grad_norm(gs), std::sqrt(sum), 1e-12 * std::sqrt(sum));
}

TEST(GradNorm, ManyBuffersAddInOrderWithOneHostRead) {
  std::vector<Tensor> gs = {random_tensor({70000}, DType::F32, 4), Tensor::zeros({0}, DType::F32),
                            random_tensor({129}, DType::F32, 5), random_tensor({3, 7}, DType::F32, 6)};
  double in_order = 0;  // each buffer's own sum, added in the order given (what the trainer did per block)
  for (const Tensor& g : gs) in_order += ops::grad_norm_sq(g);
  DeviceServices& cpu = device_services(Device::CPU);
  const int64_t before = cpu.host_reads();
  EXPECT_EQ(ops::grad_norm_sq(gs), in_order);
  EXPECT_EQ(cpu.host_reads() - before, 1);
  EXPECT_EQ(ops::grad_norm_sq(std::vector<Tensor>{}), 0.0);
  const std::string m = error_of([&] { ops::grad_norm_sq({gs[0], Tensor::zeros({4}, DType::F64)}); });
  EXPECT_NE(m.find("f64[4] (tensor 1) is not on cpu in f32"), std::string::npos) << m;
}

TEST(ClipGradNorm, MatchesTorch) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and numpy not available";
  auto dir = temp_dir("optim_clip_torch");
  // Case k: g_k.bin holds the gradients back to back; one line of cases.txt gives max_norm.
  const char* script = R"PY(
import sys, numpy as np, torch
d, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
for k, line in enumerate(open(d + "/cases.txt")):
    flat = np.fromfile(d + f"/g_{k}.bin", dtype=np.float32)
    params, off = [], 0
    for s in sizes:
        p = torch.nn.Parameter(torch.zeros(s))
        p.grad = torch.from_numpy(flat[off:off + s].copy())
        params.append(p)
        off += s
    norm = torch.nn.utils.clip_grad_norm_(params, float(line))
    np.concatenate([p.grad.numpy() for p in params]).tofile(d + f"/out_{k}.bin")
    print(repr(float(norm)))
)PY";
  std::ofstream(dir / "clip.py") << script;
  const std::vector<int64_t> sizes = {33, 1000, 70001};
  struct Case {
    double scale, max_norm;
  };
  // Total norms ~0.15 (no clipping) and ~150 (clipped).
  const std::vector<Case> cases = {{0.001, 1.0}, {0.001, 0.1}, {1.0, 1.0}, {1.0, 0.5}};
  std::vector<std::vector<Tensor>> grads;
  std::ofstream cases_txt(dir / "cases.txt");
  for (size_t k = 0; k < cases.size(); ++k) {
    cases_txt << cases[k].max_norm << "\n";
    grads.emplace_back();
    for (size_t i = 0; i < sizes.size(); ++i)
      grads[k].push_back(
          random_tensor({sizes[i]}, DType::F32, 60 + i + 7 * k, -cases[k].scale, cases[k].scale));
    write_f32(dir / ("g_" + std::to_string(k) + ".bin"), grads[k]);
  }
  cases_txt.close();
  std::string out;
  std::string cmd = std::string(kPython) + " " + (dir / "clip.py").string() + " " + dir.string();
  for (int64_t s : sizes) cmd += " " + std::to_string(s);
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  std::istringstream torch_norms(out);
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    double torch_norm = NAN;
    ASSERT_TRUE(torch_norms >> torch_norm) << out;
    std::vector<Tensor>& gs = grads[k];
    const double max_norm = cases[k].max_norm;
    double norm = ops::clip_grad_norm(gs, max_norm);
    EXPECT_NEAR(norm, torch_norm, 1e-6 * torch_norm);  // torch sums in f32, we sum in f64
    int64_t off = 0;
    auto file = dir / ("out_" + std::to_string(k) + ".bin");
    for (size_t i = 0; i < gs.size(); ++i) {
      Tensor want = read_f32(file, sizes[i], off);
      EXPECT_LE(max_rel_diff(gs[i], want, 1e-6), 2e-6) << "tensor " << i;
      off += sizes[i];
    }
    if (norm > max_norm) {
      EXPECT_NEAR(ops::global_grad_norm(gs), max_norm, 1e-5 * max_norm);
    }
  }
}

TEST(ClipGradNorm, NonFiniteNormIsReturnedAndGradsAreLeftAlone) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<Tensor> gs = {random_tensor({100}, DType::F32, 1, -10, 10),
                              random_tensor({200000}, DType::F32, 2)};
    gs[1].data<float>()[123457] = bad;
    std::vector<Tensor> before = {gs[0].clone(), gs[1].clone()};
    double norm = ops::clip_grad_norm(gs, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_TRUE(bitwise_equal(gs[0], before[0]));
    EXPECT_TRUE(bitwise_equal(gs[1], before[1]));
  }
}

TEST(ClipGradNorm, HugeGradientsDoNotOverflowTheF64Sum) {
  // Squares of 1e30 overflow f32 (torch's f32 norm would be inf) but not the f64 accumulation.
  const int64_t n = 1000;
  std::vector<Tensor> gs = {Tensor::full({n}, 1e30, DType::F32)};
  double norm = ops::clip_grad_norm(gs, 1.0);
  double want = double(1e30f) * std::sqrt(double(n));
  EXPECT_NEAR(norm, want, 1e-12 * want);
  EXPECT_NEAR(ops::global_grad_norm(gs), 1.0, 1e-6);
}

TEST(ClipGradNorm, NormJustBelowMaxIsScaledLikeTorch) {
  // clip_coef = max / (norm + 1e-6) < 1 even when norm == max: torch scales, so do we.
  std::vector<Tensor> gs = {Tensor::full({4}, 0.5, DType::F32)};  // norm exactly 1
  double norm = ops::clip_grad_norm(gs, 1.0);
  EXPECT_EQ(norm, 1.0);
  EXPECT_EQ(gs[0].to_vector()[0], double(0.5f * float(1.0 / (1.0 + 1e-6))));
  // Below max_norm - 1e-6 nothing changes.
  std::vector<Tensor> small = {Tensor::full({4}, 0.25, DType::F32)};
  ops::clip_grad_norm(small, 1.0);
  EXPECT_EQ(small[0].to_vector()[0], 0.25);
}

TEST(ClipGradNorm, BadArguments) {
  std::vector<Tensor> gs = {Tensor::zeros({4}, DType::F32)};
  EXPECT_NE(error_of([&] { ops::clip_grad_norm(gs, 0.0); }).find("max_norm = 0 must be finite and > 0"),
            std::string::npos);
  std::vector<Tensor> undefined = {Tensor()};
  EXPECT_NE(error_of([&] { ops::global_grad_norm(undefined); }).find("grad_norm: gradient is undefined"),
            std::string::npos);
  std::vector<Tensor> bf = {Tensor::zeros({4}, DType::BF16)};
  EXPECT_NE(error_of([&] { ops::global_grad_norm(bf); }).find("grad_norm: gradient bf16[4] must be f32"),
            std::string::npos);
}
