// The parity harness itself: it must catch a wrong forward, a wrong gradient, report unavailable
// variants as skipped, fail variants it cannot drive, and parse --shapes strictly. The broken
// variants below exist only in this test program.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/kernels/parity.h"
#include "titan/kernels/registry.h"
#include "titan/kernels/spec.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::kernels {
namespace {

using titan::testing::error_of;

const ops::SwigluKernel& ref() {
  return kernel_for<ops::SwigluKernel>("swiglu", Device::CPU, DType::F32, "reference");
}

// Output element 0 off by 1e-3 (far above swiglu's f32 tolerance of 1e-6 + 2e-6 |y|).
void fwd_off(const KernelContext& ctx, int64_t n, const void* g, const void* u, void* out) {
  ref().forward(ctx, n, g, u, out);
  static_cast<float*>(out)[n - 1] += 1e-3f;
}
// Correct forward, dup off by 1e-2 in its last element.
void bwd_off(const KernelContext& ctx, int64_t n, const void* g, const void* u, const void* dy, void* dg, void* du) {
  ref().backward(ctx, n, g, u, dy, dg, du);
  if (du) static_cast<float*>(du)[n - 1] += 1e-2f;
}
void fwd_ref(const KernelContext& ctx, int64_t n, const void* g, const void* u, void* out) {
  ref().forward(ctx, n, g, u, out);
}
void bwd_ref(const KernelContext& ctx, int64_t n, const void* g, const void* u, const void* dy, void* dg, void* du) {
  ref().backward(ctx, n, g, u, dy, dg, du);
}

TITAN_REGISTER_KERNEL(
    swiglu_test_fwd,
    {"swiglu", Device::CPU, DType::F32, "test_bad_forward", "test", ops::SwigluKernel{fwd_off, bwd_ref}, {}});
TITAN_REGISTER_KERNEL(swiglu_test_bwd, {"swiglu",
                                        Device::CPU,
                                        DType::F32,
                                        "test_bad_backward",
                                        "test",
                                        ops::SwigluKernel{fwd_ref, bwd_off},
                                        {}});
TITAN_REGISTER_KERNEL(swiglu_test_unavailable,
                      {"swiglu", Device::CPU, DType::F32, "test_unavailable", "test",
                       ops::SwigluKernel{fwd_ref, bwd_ref}, [] { return std::string("needs a test ISA"); }});
TITAN_REGISTER_KERNEL(
    undriven_test_op,
    {"test_undriven_op", Device::CPU, DType::F32, "fast", "test", ops::SwigluKernel{fwd_ref, bwd_ref}, {}});

// bf16 attention whose forward rounds every output one bf16 step away from zero (within the forward's
// tolerance of one step), with the reference's backward. Its backward reads its saved output
// (D_i = dout . out), so judged on its own output, that step would reach dq and dk amplified by the
// cancellation in dS = P (dP - D_i), though the backward kernel is the reference's.
const ops::AttentionKernel& attention_ref() {
  return kernel_for<ops::AttentionKernel>("attention", Device::CPU, DType::BF16, "reference");
}
void attention_fwd_one_step_off(const KernelContext& ctx, const ops::AttentionShape& s, const void* q,
                                const void* k, const void* v, void* out, void* lse) {
  attention_ref().forward(ctx, s, q, k, v, out, lse);
  bf16* o = static_cast<bf16*>(out);
  for (size_t i = 0; i < s.q_numel(); ++i)
    if (o[i].bits & 0x7fffu) ++o[i].bits;  // one step further from zero (no value here is near inf)
}
void attention_bwd_reference(const KernelContext& ctx, const ops::AttentionShape& s, const void* q,
                             const void* k, const void* v, const void* out, const void* lse, const void* dout,
                             void* dq, void* dk, void* dv) {
  attention_ref().backward(ctx, s, q, k, v, out, lse, dout, dq, dk, dv);
}
TITAN_REGISTER_KERNEL(attention_test_one_step_off,
                      {"attention",
                       Device::CPU,
                       DType::BF16,
                       "test_out_one_step_off",
                       "test",
                       ops::AttentionKernel{attention_fwd_one_step_off, attention_bwd_reference},
                       {}});

ParityResult only(const std::vector<ParityResult>& rs, const std::string& variant) {
  const ParityResult* found = nullptr;
  for (auto& r : rs)
    if (r.variant == variant) {
      EXPECT_EQ(found, nullptr) << "one shape was asked for";
      found = &r;
    }
  EXPECT_NE(found, nullptr) << variant;
  return found ? *found : ParityResult{};
}

std::vector<ParityResult> swiglu_f32(int64_t n) {
  ParityOptions o;
  o.op = "swiglu";
  o.dtypes = {DType::F32};
  o.shapes = {{"swiglu", {{n}}}};
  return run_parity(o);
}

TEST(ParityHarness, CatchesWrongForwardAndNamesTheElement) {
  ParityResult r = only(swiglu_f32(37), "test_bad_forward");
  EXPECT_EQ(r.status, ParityStatus::Fail);
  EXPECT_TRUE(r.compared);
  EXPECT_NEAR(r.max_abs, 1e-3, 1e-4);
  EXPECT_NE(r.note.find("y[36]"), std::string::npos) << r.note;
  EXPECT_NE(format_parity_result(r).find("FAIL"), std::string::npos);
}

TEST(ParityHarness, CatchesWrongParameterGradient) {
  ParityResult r = only(swiglu_f32(37), "test_bad_backward");
  EXPECT_EQ(r.status, ParityStatus::Fail);
  EXPECT_NE(r.note.find("dup[36]"), std::string::npos) << r.note;
  EXPECT_NEAR(r.max_abs, 1e-2, 1e-3);
}

TEST(ParityHarness, ReportsUnavailableVariantAsSkippedWithReason) {
  ParityResult r = only(swiglu_f32(5), "test_unavailable");
  EXPECT_EQ(r.status, ParityStatus::Skipped);
  EXPECT_EQ(r.note, "needs a test ISA");
  EXPECT_NE(format_parity_result(r).find("SKIPPED"), std::string::npos);
  EXPECT_NE(format_parity_result(r).find("needs a test ISA"), std::string::npos);
}

TEST(ParityHarness, RealVariantsStillPassBesideBrokenOnes) {
  int real = 0;
  for (auto& r : swiglu_f32(1031))
    if (r.variant.rfind("test_", 0) != 0) {
      EXPECT_EQ(r.status, ParityStatus::Pass) << format_parity_result(r);
      ++real;
    }
  EXPECT_GE(real, 1);
}

// The gradients compare the backward kernels on one input: the variant's backward runs on the
// reference's forward output, and the forward's own difference is judged once, as the output.
TEST(ParityHarness, BackwardRunsOnTheReferenceOutputSoAForwardRoundingIsJudgedOnce) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    ParityOptions o;
    o.op = "attention";
    o.dtypes = {DType::BF16};
    o.seed = seed;
    int cases = 0;
    for (const ParityResult& r : run_parity(o)) {
      if (r.variant != "test_out_one_step_off") continue;
      ++cases;
      EXPECT_EQ(r.status, ParityStatus::Pass) << "seed " << seed << ": " << format_parity_result(r);
      EXPECT_GT(r.max_abs, 0) << "the forward's step is measured";
    }
    EXPECT_EQ(cases, int(find_op_spec("attention")->default_shapes.size()));
  }
}

TEST(ParityHarness, VariantWithoutDriverFails) {
  ParityOptions o;
  o.op = "test_undriven_op";
  auto rs = run_parity(o);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, ParityStatus::Fail);
  EXPECT_NE(rs[0].note.find("no spec registered"), std::string::npos) << rs[0].note;
}

TEST(ParityHarness, ParsesShapes) {
  auto s = parse_parity_shapes("linear=7x33x19,64x64x64;rope=1x9x3x8;linear_cross_entropy=4x10x3");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s["linear"], (std::vector<std::vector<int64_t>>{{7, 33, 19}, {64, 64, 64}}));
  EXPECT_EQ(s["rope"], (std::vector<std::vector<int64_t>>{{1, 9, 3, 8}}));
  EXPECT_EQ(s["linear_cross_entropy"], (std::vector<std::vector<int64_t>>{{4, 10, 3}}));  // chunk optional
  EXPECT_EQ(parity_shape_dims("linear"), "MxNxK");
  EXPECT_EQ(parity_shape_dims("linear_cross_entropy"), "NxVxDx[chunk]");

  EXPECT_NE(error_of([] { parse_parity_shapes("lnear=1x2x3"); }).find("unknown op 'lnear'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("linear=1x2"); }).find("needs 3 dimensions MxNxK"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("linear=1xAx3"); }).find("not a list of integers"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("linear"); }).find("op=AxBxC"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("rope=1x2x3x5"); }).find("D must be even"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("attention=1x4x3x2x8"); }).find("multiple of Hkv"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("router_topk=4x2x3"); }).find("k must be <= E"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_parity_shapes("swiglu=0"); }).find(">= 1"), std::string::npos);
  ParityOptions o;
  o.op = "nope";
  EXPECT_NE(error_of([&] { run_parity(o); }).find("unknown op 'nope'"), std::string::npos);
}

// docs/kernels.md's table of default shapes ("| op | dimensions | 1x1x1, 7x33x19 |") lists exactly
// the registered specs with their default shapes.
TEST(ParityHarness, DocsShapesTableMatchesSpecs) {
  std::ifstream in(titan::testing::source_dir() / "docs" / "kernels.md");
  ASSERT_TRUE(in) << "docs/kernels.md";
  std::map<std::string, std::string> documented;
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| op | dimensions | default shapes |", 0) == 0) {
      in_table = true;
    } else if (in_table && line.rfind("|---", 0) == 0) {
      continue;
    } else if (in_table && line.rfind("| ", 0) != 0) {
      break;
    } else if (in_table) {
      const size_t a = line.find(" | "), b = line.rfind(" | ");
      documented[line.substr(2, a - 2)] = line.substr(b + 3, line.size() - b - 5);
    }
  }
  std::map<std::string, std::string> registered;
  for (const OpSpec& spec : op_specs()) {
    std::string shapes;
    for (const Dims& d : spec.default_shapes) {
      shapes += shapes.empty() ? "" : ", ";
      for (size_t i = 0; i < d.size(); ++i) shapes += (i ? "x" : "") + std::to_string(d[i]);
    }
    registered[spec.op] = shapes;
  }
  EXPECT_EQ(documented, registered);
}

// The CLI prints one line per (op, variant, dtype, shape) and the summary, and exits 0 / 1 / 2-ish.
TEST(ParityHarness, CliPrintsLinesAndSummary) {
  const std::string titan = titan::testing::titan_binary().string();
  std::string out;
  int rc = titan::testing::run_command(
      titan + " kernels parity --op rope --dtype f32 --shapes rope=1x5x2x8,2x3x1x4 2>&1", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("PASS    rope"), std::string::npos) << out;
  EXPECT_NE(out.find("B=1 S=5 H=2 D=8"), std::string::npos) << out;
  EXPECT_NE(out.find("B=2 S=3 H=1 D=4"), std::string::npos) << out;
  EXPECT_NE(out.find("max_abs 0.000e+00"), std::string::npos) << out;
  EXPECT_NE(out.find(" passed, 0 failed"), std::string::npos) << out;

  rc = titan::testing::run_command(titan + " kernels parity --shapes rope=1x5x2x7 2>&1", &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("D must be even"), std::string::npos) << out;
  // A shape whose tensors (4 TB) cannot be allocated fails as such, not as a kernel's mistake. (Only
  // where the kernel refuses what memory cannot back: with overcommit_memory = 1 it would be granted.)
  if (std::ifstream("/proc/sys/vm/overcommit_memory").get() != '1') {
    rc = titan::testing::run_command(
        titan + " kernels parity --op linear --dtype f32 --shapes linear=1000000x1000000x1000000 2>&1", &out);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("not run: the case's tensors do not fit in this machine's memory"), std::string::npos)
        << out;
  }
  rc = titan::testing::run_command(titan + " kernels parity --dtype f16 2>&1", &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("expected f32, bf16 or f64"), std::string::npos) << out;
  // A check that compares nothing is not a pass: adamw has no bf16 kernel.
  rc = titan::testing::run_command(titan + " kernels parity --op adamw --dtype bf16 2>&1", &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("0 passed, 0 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("nothing was compared"), std::string::npos) << out;
  // An op whose only CPU kernel is its reference: said so.
  rc = titan::testing::run_command(titan + " kernels parity --op sum 2>&1", &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("'sum' has no cpu kernel besides its reference"), std::string::npos) << out;
  // Options are strict: given once, integers whole, shapes for the op checked.
  for (const char* bad : {" kernels parity --op rope --op linear", " kernels parity --seed 12x",
                          " kernels parity --seed -5", " kernels parity --op rope --shapes linear=2x3x4"}) {
    rc = titan::testing::run_command(titan + bad + " 2>&1", &out);
    EXPECT_NE(rc, 0) << bad << ": " << out;
    EXPECT_NE(out.find("error"), std::string::npos) << bad << ": " << out;
  }
  rc = titan::testing::run_command(titan + " kernels parity --op rope --op linear 2>&1", &out);
  EXPECT_NE(out.find("--op is given twice"), std::string::npos) << out;
  rc = titan::testing::run_command(titan + " kernels parity --seed 12x 2>&1", &out);
  EXPECT_NE(out.find("--seed 12x: expected an integer >= 0"), std::string::npos) << out;
  // A command that takes no plain arguments refuses one.
  rc = titan::testing::run_command(titan + " kernels list extra 2>&1", &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("titan kernels list: error: unexpected argument 'extra'"), std::string::npos) << out;
}

// `titan kernels list` has a row for every CPU and meta kernel this build registers, under its op,
// variant and device, with that kernel's own description and its dtype (a device's kernels do not
// borrow another device's description). The test_ ops and variants exist only in this program.
TEST(KernelsList, EveryKernelHasARowWithItsOwnDescription) {
  std::string out;
  ASSERT_EQ(titan::testing::run_command(titan::testing::titan_binary().string() + " kernels list", &out), 0)
      << out;
  std::vector<std::vector<std::string>> rows;  // op, variant, device, the rest of the line
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string op, variant, device;
    if (!(words >> op >> variant >> device)) continue;
    std::string rest;
    std::getline(words, rest);
    rows.push_back({op, variant, device, rest});
  }
  size_t checked = 0;
  for (const auto& e : all_kernels()) {
    if (e.device == Device::CUDA || e.variant.rfind("test_", 0) == 0 || e.op.rfind("test_", 0) == 0) continue;
    bool found = false;
    for (const auto& r : rows) {
      if (r[0] != e.op || r[1] != e.variant || r[2] != device_name(e.device)) continue;
      const std::string& rest = r[3];
      const bool ends_with_description =
          rest.size() >= e.description.size() &&
          rest.compare(rest.size() - e.description.size(), std::string::npos, e.description) == 0;
      std::istringstream dtypes(rest.substr(0, rest.size() - e.description.size()));
      bool has_dtype = false;
      for (std::string d; dtypes >> d;)
        has_dtype |= d == dtype_name(e.dtype) || d.rfind(std::string(dtype_name(e.dtype)) + "[", 0) == 0;
      found |= ends_with_description && has_dtype;
    }
    EXPECT_TRUE(found) << e.op << " " << e.variant << " " << device_name(e.device) << " "
                       << dtype_name(e.dtype) << " '" << e.description << "' has no row of its own in:\n"
                       << out;
    ++checked;
  }
  EXPECT_GT(checked, 50u);
}

}  // namespace
}  // namespace titan::kernels
