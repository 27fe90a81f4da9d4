// The model against our own PyTorch reference (tests/models/torch_ref/qwen3_torch.py, written from
// the math, checked against the transformers oracles) across shapes the two oracles don't cover:
// GQA ratios 1/2/4/8, head_dim 64/128, tied and untied, dense, MoE and dense/MoE mixes
// (mlp_only_layers, decoder_sparse_step), norm_topk_prob on and off, aux loss in the loss or not.
//
// Each case is built natively (Qwen3Model + initialize, norm weights perturbed away from 1 so
// their gradients are not degenerate), exported with export_hf_model, then run through
// `titan debug dump` and the torch script on the same directory and token ids, in f32 and bf16.
// Every logit, the loss, the aux loss and every parameter gradient are compared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/state_dict.h"

using namespace titan;
using namespace titan::testing;

namespace {

// f32: both sides compute the same math in f32 with different summation orders; after two
// layers the differences are a few ulps of O(1) values, so 1e-5 absolute (the oracle bar).
constexpr double kF32Tol = 1e-5;

// bf16 keeps 8 significant bits: one rounding is up to u = 2^-9 relative, one ulp 2^-8. titan and
// torch round at the same places (every op's output, see qwen3_torch.py) but accumulate in
// different orders and with different kernels, so an intermediate can land one ulp apart; that
// ulp then propagates through ~10 ops per layer x 2 layers and, for gradients, through sums over
// all B*S tokens, where independent one-ulp differences partly cancel. We therefore compare each
// tensor against its own scale: |titan - torch| <= kBf16Rel * max|torch|, with kBf16Rel = 4 ulps
// (2^-6 = 1.6e-2). The loss (a mean of O(ln V) terms, computed from f32-upcast logits) gets the
// same relative bound on its value.
constexpr double kBf16Rel = 1.0 / 64;

struct Case {
  std::string name;
  int64_t vocab, dim, n_heads, n_kv_heads, head_dim, hidden;
  bool tied;
  int64_t experts = 0, top_k = 0, moe_hidden = 0, sparse_step = 1;
  std::vector<int64_t> mlp_only = {};
  bool norm_topk = true, router_aux_in_loss = false;
  int64_t seq = 24;
  uint64_t seed = 1;
};

// Two layers each; B = 2. GQA ratio = n_heads / n_kv_heads.
std::vector<Case> cases() {
  return {
      {"dense_gqa1_hd64_tied", 512, 64, 2, 2, 64, 160, true, 0, 0, 0, 1, {}, true, false, 17, 11},
      {"dense_gqa2_hd128_untied", 1024, 128, 4, 2, 128, 256, false, 0, 0, 0, 1, {}, true, false, 29, 12},
      {"dense_gqa4_hd64_tied", 768, 96, 4, 1, 64, 192, true, 0, 0, 0, 1, {}, true, false, 40, 13},
      {"dense_gqa8_hd64_untied", 2048, 128, 8, 1, 64, 128, false, 0, 0, 0, 1, {}, true, false, 21, 14},
      {"moe_all_sparse_gqa2_hd64_untied_aux", 1024, 64, 4, 2, 64, 128, false, 8, 2, 32, 1, {}, true, true, 24, 15},
      {"moe_mlp_only0_gqa4_hd128_tied_nonorm", 512, 64, 4, 1, 128, 96, true, 8, 3, 48, 1, {0}, false, true, 19, 16},
      {"moe_sparse_step2_gqa8_hd64_untied", 640, 128, 8, 1, 64, 160, false, 4, 2, 64, 2, {}, true, false, 33, 17},
      {"moe_mlp_only1_gqa1_hd128_tied_aux", 896, 96, 2, 2, 128, 128, true, 6, 1, 40, 1, {1}, false, true, 26, 18},
  };
}

qwen3::ModelArgs args_of(const Case& c) {
  qwen3::ModelArgs a;
  a.vocab_size = c.vocab;
  a.dim = c.dim;
  a.n_layers = 2;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.hidden_dim = c.hidden;
  a.tie_embeddings = c.tied;
  a.max_seq_len = 128;
  a.num_experts = c.experts;
  a.top_k = c.top_k;
  a.moe_hidden_dim = c.moe_hidden;
  a.decoder_sparse_step = c.sparse_step;
  a.mlp_only_layers = c.mlp_only;
  a.norm_topk_prob = c.norm_topk;
  a.output_router_logits = c.router_aux_in_loss;
  return a;
}

// Exports the case's randomly initialized model and its token ids under `dir`.
void prepare(const Case& c, const std::filesystem::path& dir) {
  qwen3::Qwen3Model model(args_of(c), DType::F32);
  model.initialize(c.seed);
  // Norm weights start at 1 (their gradients would then only test the sum); spread them over
  // [0.5, 1.5] so each element's gradient is weighted differently.
  uint64_t k = 0;
  for (nn::Param* p : model.params())
    if (p->init == nn::Init::Ones) p->value.copy_from(random_tensor(p->shape, DType::F32, c.seed * 1000 + ++k, 0.5, 1.5));
  qwen3::export_hf_model(model, dir / "ckpt", DType::F32);

  std::mt19937_64 rng(c.seed);
  std::uniform_int_distribution<int64_t> tok(0, c.vocab - 1);
  std::vector<int64_t> ids(size_t(2 * c.seq));
  for (auto& t : ids) t = tok(rng);
  io::TensorWrite w{"input_ids", DType::I64, {2, c.seq}, ids.data()};
  io::write_safetensors(dir / "tokens.safetensors", std::span<const io::TensorWrite>(&w, 1));
}

Tensor load(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& t = f.at(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  std::memcpy(out.raw_data(), t.data, t.nbytes());
  return out;
}

double max_abs(const Tensor& t) {
  Tensor f = t.to(DType::F64);
  double m = 0;
  for (int64_t i = 0; i < f.numel(); ++i) m = std::max(m, std::fabs(f.data<double>()[i]));
  return m;
}

// A python with torch: Debian's (/usr/bin/python3) first, then whatever python3 is on PATH.
std::string find_torch_python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    std::string out;
    if (run_command(std::string(py) + " -c 'import torch'", &out) == 0) return py;
  }
  return "";
}

// Compares every tensor of titan's dump with the reference's; returns the worst ratio
// |diff| / tolerance seen, for the log.
void compare(const Case& c, const std::string& dtype, const io::SafetensorsFile& titan_out,
             const io::SafetensorsFile& torch_out) {
  SCOPED_TRACE(c.name + " " + dtype);
  const bool f32 = dtype == "float32";
  std::set<std::string> titan_names, torch_names;
  for (auto& t : titan_out.tensors()) titan_names.insert(t.name);
  for (auto& t : torch_out.tensors()) torch_names.insert(t.name);
  EXPECT_EQ(titan_names, torch_names) << "titan and the reference dump different tensors";
  EXPECT_EQ(titan_names.count("aux_loss"), c.experts > 0 ? 1u : 0u);

  double worst = 0, worst_diff = 0;
  std::string worst_name;
  for (const std::string& name : torch_names) {
    if (!titan_names.count(name)) continue;
    Tensor ref = load(torch_out, name), got = load(titan_out, name);
    ASSERT_EQ(ref.shape(), got.shape()) << name;
    double diff = max_abs_diff(got, ref);
    double tol = f32 ? kF32Tol : kBf16Rel * max_abs(ref);
    EXPECT_LE(diff, tol) << name << ": max |titan - torch| = " << diff << ", max |torch| = " << max_abs(ref);
    if (diff / tol > worst) {
      worst = diff / tol;
      worst_diff = diff;
      worst_name = name;
    }
  }
  std::printf("  %-40s %-8s loss %.6f  %zu tensors, worst %.3g (%.2f of tol) at %s\n", c.name.c_str(),
              dtype.c_str(), load(torch_out, "loss").item(), torch_names.size(), worst_diff, worst,
              worst_name.c_str());
}

}  // namespace

TEST(Qwen3TorchParity, MatchesTorchReferenceAcrossShapesInF32AndBf16) {
  std::string python = find_torch_python();
  if (python.empty()) GTEST_SKIP() << "no python3 with torch (Debian: apt install python3-torch)";
  const auto root = temp_dir("qwen3_torch_parity");
  const auto script = source_dir() / "tests" / "models" / "torch_ref" / "qwen3_torch.py";
  const std::vector<std::string> dtypes = {"float32", "bfloat16"};

  // titan runs each case through the CLI; the reference runs every job in one process (torch's
  // import dominates its start-up).
  nlohmann::json jobs = nlohmann::json::array();
  for (const Case& c : cases()) {
    const auto dir = root / c.name;
    std::filesystem::create_directories(dir);
    prepare(c, dir);
    for (const std::string& dt : dtypes) {
      std::string log;
      std::string cmd = titan_binary().string() + " debug dump --model-path " + (dir / "ckpt").string() +
                        " --tokens " + (dir / "tokens.safetensors").string() + " --out " +
                        (dir / ("titan_" + dt + ".safetensors")).string() + " --dtype " + dt;
      ASSERT_EQ(run_command(cmd, &log), 0) << c.name << ": " << cmd << "\n" << log;
      jobs.push_back({{"model_path", (dir / "ckpt").string()},
                      {"tokens", (dir / "tokens.safetensors").string()},
                      {"out", (dir / ("torch_" + dt + ".safetensors")).string()},
                      {"dtype", dt}});
    }
  }
  {
    std::ofstream f(root / "jobs.json");
    f << jobs.dump(1);
  }
  std::string log;
  std::string cmd = python + " " + script.string() + " --jobs " + (root / "jobs.json").string();
  ASSERT_EQ(run_command(cmd, &log), 0) << cmd << "\n" << log;

  for (const Case& c : cases())
    for (const std::string& dt : dtypes) {
      const auto dir = root / c.name;
      auto titan_out = io::SafetensorsFile::open(dir / ("titan_" + dt + ".safetensors"));
      auto torch_out = io::SafetensorsFile::open(dir / ("torch_" + dt + ".safetensors"));
      compare(c, dt, titan_out, torch_out);
    }
}
