// Kernel substitutions: glob matching, module scopes, rule checking, and the [kernels] table of a
// job config checked before any compute.
#include "titan/kernels/substitution.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/swiglu/swiglu.h"
#include "titan/train/job_config.h"

namespace titan::kernels {
namespace {

using titan::testing::error_of;

// A variant that can never run here, to check the availability rule.
void fwd(const KernelContext&, int64_t, const void*, const void*, void*) {}
void bwd(const KernelContext&, int64_t, const void*, const void*, const void*, void*, void*) {}
TITAN_REGISTER_KERNEL(swiglu_test_needs_isa,
                      {"swiglu", Device::CPU, DType::F32, "test_needs_isa", "test",
                       ops::SwigluKernel{fwd, bwd}, [] { return std::string("no AMX"); }});

// Clears the process-wide rules whatever a test does.
struct RulesGuard {
  ~RulesGuard() { set_substitutions({}); }
};

TEST(GlobMatch, StarsQuestionMarksAndClasses) {
  EXPECT_TRUE(glob_match("layers.*.attention", "layers.12.attention"));
  EXPECT_TRUE(glob_match("layers.*.attention", "layers.0.attention"));
  EXPECT_FALSE(glob_match("layers.*.attention", "layers.12.moe"));
  EXPECT_FALSE(glob_match("layers.*.attention", "layers.12.attention.extra"));
  EXPECT_TRUE(glob_match("layers.*", "layers.3.feed_forward"));  // '*' crosses '.'
  EXPECT_TRUE(glob_match("*", "output"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("", "output"));

  EXPECT_TRUE(glob_match("layers.[0-3].moe", "layers.2.moe"));
  EXPECT_TRUE(glob_match("layers.[0-3].moe", "layers.0.moe"));
  EXPECT_TRUE(glob_match("layers.[0-3].moe", "layers.3.moe"));
  EXPECT_FALSE(glob_match("layers.[0-3].moe", "layers.4.moe"));
  EXPECT_FALSE(glob_match("layers.[0-3].moe", "layers.12.moe"));  // one character only
  EXPECT_TRUE(glob_match("layers.[137].moe", "layers.7.moe"));
  EXPECT_FALSE(glob_match("layers.[137].moe", "layers.5.moe"));
  EXPECT_TRUE(glob_match("layers.1[0-9].*", "layers.15.attention"));
  // "[!...]": one character not in the set (fnmatch's negation, once read as the set {'!', ...}).
  EXPECT_TRUE(glob_match("layers.[!0].moe", "layers.1.moe"));
  EXPECT_FALSE(glob_match("layers.[!0].moe", "layers.0.moe"));
  EXPECT_TRUE(glob_match("layers.[!0].moe", "layers.!.moe"));  // "!" is not in the set {0}
  EXPECT_TRUE(glob_match("layers.[!0-3].moe", "layers.7.moe"));
  EXPECT_FALSE(glob_match("layers.[!0-3].moe", "layers.2.moe"));
  EXPECT_NE(glob_problem("layers.[!].moe"), "");

  EXPECT_TRUE(glob_match("layers.?.attention", "layers.5.attention"));
  EXPECT_FALSE(glob_match("layers.?.attention", "layers.15.attention"));
  EXPECT_TRUE(glob_match("layers.??.attention", "layers.15.attention"));
  EXPECT_TRUE(glob_match("norm", "norm"));
  EXPECT_FALSE(glob_match("norm", "norms"));
  EXPECT_FALSE(glob_match("norm", "nor"));
  EXPECT_TRUE(glob_match("*.moe", "layers.1.moe"));
  EXPECT_TRUE(glob_match("l*s.*.m*e", "layers.1.moe"));

  EXPECT_NE(error_of([] { glob_match("layers.[0-3.moe", "layers.1.moe"); }).find("unterminated '['"),
            std::string::npos);
}

// Patterns that would match nothing, silently, are named before any rule is used.
TEST(Glob, MalformedPatternsAreNamed) {
  for (const char* good : {"*", "layers.[0-3].moe", "layers.[137].*", "layers.1[0-9].*", "norm", "a-b"})
    EXPECT_EQ(glob_problem(good), "") << good;
  EXPECT_EQ(glob_problem("layers.[0-3.moe"), "the '[' at character 8 is never closed by ']'");
  EXPECT_EQ(glob_problem("layers.[3-0].moe"),
            "the range '3-0' is reversed: it matches nothing (write '0-3')");
  EXPECT_EQ(glob_problem("layers.[]"), "'[]' is an empty set: it matches nothing");
  EXPECT_EQ(glob_problem("layers.[0-3].[9-1]"),
            "the range '9-1' is reversed: it matches nothing (write '1-9')");
  // set_substitutions (the API under the config) checks it too, naming the op's key.
  EXPECT_NE(error_of([] {
              set_substitutions({{"rope", "gather_free", "layers.[3-0].attention"}});
            }).find("kernels.rope.modules = \"layers.[3-0].attention\": the range '3-0' is reversed"),
            std::string::npos);
}

TEST(ModuleScope, NestsWithDots) {
  EXPECT_EQ(current_module(), "");
  {
    ModuleScope a("layers");
    ModuleScope b("3");
    EXPECT_EQ(current_module(), "layers.3");
    {
      ModuleScope c("attention");
      EXPECT_EQ(current_module(), "layers.3.attention");
    }
    EXPECT_EQ(current_module(), "layers.3");
  }
  EXPECT_EQ(current_module(), "");
}

TEST(SelectVariant, HonoursARuleOnlyInsideAMatchingModule) {
  RulesGuard guard;
  set_substitutions({});
  const std::string plain = select_variant("rope", Device::CPU, DType::F32);
  ASSERT_NE(plain, "gather_free");
  ASSERT_TRUE(has_kernel("rope", Device::CPU, DType::F32, "gather_free"));
  set_substitutions({{"rope", "gather_free", "layers.*.attention"}});

  EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), plain);  // outside any module
  {
    ModuleScope layer("layers.3");
    EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), plain);
    {
      ModuleScope attn("attention");
      EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), "gather_free");
      EXPECT_EQ(select_variant("rope", Device::CPU, DType::BF16), "gather_free");
      // Other ops are not affected.
      EXPECT_EQ(select_variant("swiglu", Device::CPU, DType::F32),
                has_kernel("swiglu", Device::CPU, DType::F32, "default") ? "default" : "reference");
      // ForceVariant (tests, parity) wins over a substitution.
      ForceVariant force("rope", "reference");
      EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), "reference");
    }
    ModuleScope ff("feed_forward");
    EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), plain);
  }
  ModuleScope out("output");
  EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), plain);
}

TEST(SelectVariant, LastMatchingRuleWins) {
  RulesGuard guard;
  set_substitutions({{"rope", "gather_free", "layers.*"}, {"rope", "reference", "layers.[0-1].attention"}});
  {
    ModuleScope m("layers.1.attention");
    EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), "reference");
  }
  ModuleScope m("layers.2.attention");
  EXPECT_EQ(select_variant("rope", Device::CPU, DType::F32), "gather_free");
}

TEST(SetSubstitutions, RejectsUnknownOpOrVariantAndKeepsOldRules) {
  RulesGuard guard;
  set_substitutions({{"rope", "gather_free", "*"}});
  std::string m = error_of([] { set_substitutions({{"roope", "gather_free", "*"}}); });
  EXPECT_NE(m.find("kernels.roope: unknown op 'roope'"), std::string::npos) << m;
  EXPECT_NE(m.find("rope", m.find("(ops:")), std::string::npos) << "lists the known ops: " << m;
  m = error_of([] { set_substitutions({{"rope", "gather_fre", "*"}}); });
  EXPECT_NE(m.find("kernels.rope: op 'rope' has no variant 'gather_fre'"), std::string::npos) << m;
  EXPECT_NE(m.find("gather_free"), std::string::npos) << "lists the variants: " << m;
  ASSERT_EQ(substitutions().size(), 1u);
  EXPECT_EQ(substitutions()[0].variant, "gather_free");
}

// The modules of a 4-layer model whose layers 2 and 3 are MoE, with their ops (as
// qwen3::module_ops lists them).
const std::vector<ModuleOps> kModules = {
    {"tok_embeddings", {"embedding", "index", "cast"}},
    {"norm", {"rms_norm", "cast"}},
    {"output", {"linear_cross_entropy", "linear", "index", "sum", "cast"}},
    {"layers.0", {"rms_norm", "add", "cast"}},
    {"layers.0.attention", {"linear", "rms_norm", "rope", "attention", "cast"}},
    {"layers.0.feed_forward", {"linear", "swiglu", "cast"}},
    {"layers.1", {"rms_norm", "add", "cast"}},
    {"layers.1.attention", {"linear", "rms_norm", "rope", "attention", "cast"}},
    {"layers.1.feed_forward", {"linear", "swiglu", "cast"}},
    {"layers.2", {"rms_norm", "add", "cast"}},
    {"layers.2.attention", {"linear", "rms_norm", "rope", "attention", "cast"}},
    {"layers.2.moe", {"linear", "router_topk", "moe_experts", "cast"}},
    {"layers.3", {"rms_norm", "add", "cast"}},
    {"layers.3.attention", {"linear", "rms_norm", "rope", "attention", "cast"}},
    {"layers.3.moe", {"linear", "router_topk", "moe_experts", "cast"}}};

TEST(PlanSubstitutions, LogsOneLinePerSubstitutedModule) {
  auto lines = plan_substitutions({{"rope", "gather_free", "layers.*.attention"},
                                   {"moe_experts", "reference", "layers.[0-2].moe"},
                                   {"rope", "reference", "layers.3.attention"}},
                                  kModules, Device::CPU, DType::BF16);
  std::vector<std::string> want = {
      "layers.0.attention rope -> gather_free", "layers.1.attention rope -> gather_free",
      "layers.2.attention rope -> gather_free", "layers.2.moe moe_experts -> reference",
      "layers.3.attention rope -> reference"};
  ASSERT_EQ(lines.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    std::string squeezed;  // the log pads module names into a column
    for (char c : lines[i])
      if (!(c == ' ' && !squeezed.empty() && squeezed.back() == ' ')) squeezed += c;
    EXPECT_EQ(squeezed, "kernels: " + want[i]) << lines[i];
  }
  EXPECT_TRUE(substitutions().empty()) << "planning installs nothing";
}

// A rule every module that runs the op follows (a cuda job's default attention rule over "*") is
// one line, whatever the depth; the ops substituted in some modules only keep their lines.
TEST(PlanSubstitutions, AnOpSubstitutedEverywhereIsOneLine) {
  const auto lines =
      plan_substitutions({{"attention", "reference", "*"}, {"rope", "gather_free", "layers.0.attention"}},
                         kModules, Device::CPU, DType::BF16);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "kernels: attention -> reference in all 4 modules that run it");
  EXPECT_NE(lines[1].find("layers.0.attention"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("rope -> gather_free"), std::string::npos) << lines[1];
}

TEST(PlanSubstitutions, ErrorsBeforeAnyCompute) {
  auto plan = [](Substitution s, DType dt = DType::F32) {
    return error_of([&] { plan_substitutions({s}, kModules, Device::CPU, dt); });
  };
  std::string m = plan({"rope", "gather_free", "layers.*.atention"});
  EXPECT_NE(m.find("kernels.rope: modules pattern 'layers.*.atention' matches no module"), std::string::npos)
      << m;
  m = plan({"rope", "fast", "layers.*.attention"});
  EXPECT_NE(m.find("has no variant 'fast'"), std::string::npos) << m;
  m = plan({"linear", "gather_free", "*"});
  EXPECT_NE(m.find("has no variant 'gather_free'"), std::string::npos) << m;
  // The optimizer runs outside the model's modules, whatever the compute dtype: the rule says so
  // rather than asking for a bf16 AdamW (it runs on the f32 master weights).
  m = plan({"adamw", "portable", "*"}, DType::BF16);
  EXPECT_NE(m.find("kernels.adamw: modules pattern '*' matches no module that runs adamw"), std::string::npos)
      << m;
  // A real dtype-bound variant: attention's bf16_probs rounds P to bf16 and exists for bf16 only.
  m = plan({"attention", "bf16_probs", "layers.*.attention"});
  EXPECT_NE(m.find("kernels.attention: variant 'bf16_probs' has no cpu/f32 kernel"), std::string::npos) << m;
  m = plan({"swiglu", "test_needs_isa", "*"});
  EXPECT_NE(m.find("kernels.swiglu: variant 'test_needs_isa' cannot run here: no AMX"), std::string::npos)
      << m;
  m = plan({"sdpa", "flash", "*"});
  EXPECT_NE(m.find("unknown op 'sdpa'"), std::string::npos) << m;
  // A rule whose modules never run its op could never apply: rope in the output head, the experts
  // of a dense model (no module runs them), adamw (no module at all).
  m = plan({"rope", "gather_free", "output"});
  EXPECT_NE(m.find("kernels.rope: modules pattern 'output' matches no module that runs rope, so the rule "
                   "would never apply (rope runs in: layers.0.attention, layers.1.attention, "),
            std::string::npos)
      << m;
  const std::vector<ModuleOps> dense(kModules.begin(), kModules.begin() + 9);  // layers 0 and 1 only
  m = error_of([&] {
    plan_substitutions({{"moe_experts", "reference", "*"}}, dense, Device::CPU, DType::F32);
  });
  EXPECT_NE(m.find("(no module of this model runs moe_experts)"), std::string::npos) << m;
  m = plan({"adamw", "portable", "*"});
  EXPECT_NE(m.find("no module of this model runs adamw"), std::string::npos) << m;
  // A pattern over modules of which some run the op applies to those only.
  EXPECT_EQ(
      plan_substitutions({{"rms_norm", "reference", "layers.0*"}}, kModules, Device::CPU, DType::F32).size(),
      2u);  // layers.0 and layers.0.attention, not layers.0.feed_forward
}

TEST(JobConfigKernels, TableAndArrayOfTablesParseAndAreChecked) {
  auto cfg = train::parse_job_config(R"(
[kernels]
rope = { impl = "gather_free", modules = "layers.*.attention" }
[[kernels.moe_experts]]
impl = "reference"
modules = "layers.[0-2].moe"
[[kernels.moe_experts]]
impl = "default"
modules = "layers.3.moe"
)",
                                     "kernels.toml", {});
  ASSERT_EQ(cfg.kernels.size(), 3u);
  auto has = [&](const std::string& op, const std::string& v, const std::string& mods) {
    for (auto& s : cfg.kernels)
      if (s.op == op && s.variant == v && s.modules == mods) return true;
    return false;
  };
  EXPECT_TRUE(has("rope", "gather_free", "layers.*.attention"));
  EXPECT_TRUE(has("moe_experts", "reference", "layers.[0-2].moe"));
  EXPECT_TRUE(has("moe_experts", "default", "layers.3.moe"));
  // rope on every attention module (one line for the four), moe_experts on layers.2.moe and
  // layers.3.moe (a line each: two variants).
  EXPECT_EQ(plan_substitutions(cfg.kernels, kModules, Device::CPU, DType::F32).size(), 1u + 2u);

  auto bad_variant = train::parse_job_config(
      "[kernels]\nrope = { impl = \"gather_freee\", modules = \"*\" }\n", "bad.toml", {});
  std::string m =
      error_of([&] { plan_substitutions(bad_variant.kernels, kModules, Device::CPU, DType::F32); });
  EXPECT_NE(m.find("has no variant 'gather_freee'"), std::string::npos) << m;
  auto no_match = train::parse_job_config(
      "[kernels]\nmoe_experts = { impl = \"default\", modules = \"layers.[4-7].moe\" }\n", "bad.toml", {});
  m = error_of([&] { plan_substitutions(no_match.kernels, kModules, Device::CPU, DType::F32); });
  EXPECT_NE(m.find("matches no module"), std::string::npos) << m;
  // No modules key means every module; an empty or non-string one, or an empty list, is an error.
  auto all = train::parse_job_config("[kernels]\nrope = { impl = \"gather_free\" }\n", "all.toml", {});
  ASSERT_EQ(all.kernels.size(), 1u);
  EXPECT_EQ(all.kernels[0].modules, "*");
  for (const auto& [text, message] :
       {std::pair{"rope = { impl = \"gather_free\", modules = \"\" }",
                  "kernels.rope.modules must be a non-empty glob string"},
        std::pair{"rope = { impl = \"gather_free\", modules = 3 }",
                  "kernels.rope.modules must be a non-empty glob string"},
        std::pair{"rope = []", "kernels.rope = []: an empty list substitutes nothing"}}) {
    m = error_of([&] { train::parse_job_config(std::string("[kernels]\n") + text + "\n", "bad.toml", {}); });
    EXPECT_NE(m.find(message), std::string::npos) << text << ": " << m;
  }
}

// Through `titan train`: a bad [kernels] rule stops the run with the rule named, before the model
// is built or a step runs.
TEST(JobConfigKernels, TrainerRejectsBadRuleBeforeCompute) {
  namespace fs = std::filesystem;
  const fs::path dir = titan::testing::temp_dir("kernels_bad_rule");
  std::ifstream base(titan::testing::source_dir() / "configs" / "debugmodel.toml");
  ASSERT_TRUE(base.good());
  std::string text((std::istreambuf_iterator<char>(base)), std::istreambuf_iterator<char>());
  for (const char* rule : {"rope = { impl = \"gather_free\", modules = \"layers.*.atention\" }",
                           "rope = { impl = \"no_such_variant\", modules = \"layers.*.attention\" }"}) {
    SCOPED_TRACE(rule);
    std::ofstream(dir / "job.toml") << text << "\n[kernels]\n" << rule << "\n";
    std::string out;
    int rc = titan::testing::run_command(titan::testing::titan_binary().string() + " train --config " +
                                             (dir / "job.toml").string() + " --job.dump_folder " +
                                             (dir / "out").string() + " --checkpoint.enable false 2>&1",
                                         &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("kernels.rope"), std::string::npos) << out;
    EXPECT_EQ(out.find("config in effect"), std::string::npos) << "failed after the start-up checks:\n"
                                                               << out;
    EXPECT_EQ(out.find("loss"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace titan::kernels
