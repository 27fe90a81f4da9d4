// Loading Hugging Face checkpoints into the model: every mismatch is reported by name.
#include "titan/models/qwen3/state_dict.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/safetensors.h"

using namespace titan;
using namespace titan::testing;
namespace fs = std::filesystem;

namespace {

fs::path oracle(const std::string& name) { return fixtures_dir() / "oracles" / "hf-transformers-5.17" / name; }

// Copies the oracle checkpoint with its tensors edited by `edit` (name -> keep?, may add).
fs::path edited_copy(const std::string& name, const std::string& tag,
                     const std::function<void(std::vector<io::TensorWrite>&)>& edit) {
  fs::path dir = temp_dir("state_dict_" + tag);
  fs::copy_file(oracle(name) / "config.json", dir / "config.json");
  auto f = io::SafetensorsFile::open(oracle(name) / "model.safetensors");
  std::vector<io::TensorWrite> w;
  for (auto& t : f.tensors()) w.push_back({t.name, t.dtype, t.shape, t.data});
  edit(w);
  io::write_safetensors(dir / "model.safetensors", w);
  return dir;
}

std::string load_error(const fs::path& dir) {
  try {
    qwen3::load_hf_model(dir, DType::F32);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StateDict, MissingUnexpectedAndMismatchedKeysAreAllNamed) {
  static float extra[4] = {1, 2, 3, 4};
  auto dir = edited_copy("tiny_moe", "mismatch", [](std::vector<io::TensorWrite>& w) {
    std::erase_if(w, [](auto& t) { return t.name == "model.layers.1.mlp.experts.5.up_proj.weight"; });
    for (auto& t : w)
      if (t.name == "model.norm.weight") t.shape = {32}, t.data = t.data;  // wrong shape (same bytes prefix)
    w.push_back({"model.layers.0.mlp.shared_expert.weight", DType::F32, {4}, extra});
  });
  std::string m = load_error(dir);
  EXPECT_NE(m.find("missing keys (1)"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.1.mlp.experts.5.up_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("unexpected keys (1)"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.0.mlp.shared_expert.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("model.norm.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[32]"), std::string::npos) << m;
  EXPECT_NE(m.find("titan reads f32, bf16 and f16 tensors"), std::string::npos) << m;
}

TEST(StateDict, TiedCheckpointMayCarryLmHead) {
  // The Hub's tied Qwen3-0.6B stores lm_head.weight; save_pretrained omits it. Both load the same.
  auto f = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  const io::TensorInfo& embed = f.at("model.embed_tokens.weight");
  auto dir = edited_copy("tiny_dense", "tied_head", [&](std::vector<io::TensorWrite>& w) {
    w.push_back({"lm_head.weight", embed.dtype, embed.shape, embed.data});
  });
  auto with_head = qwen3::load_hf_model(dir, DType::F32);
  auto without = qwen3::load_hf_model(oracle("tiny_dense"), DType::F32);
  auto a = with_head->find_param("tok_embeddings.weight")->value.to_vector();
  auto b = without->find_param("tok_embeddings.weight")->value.to_vector();
  EXPECT_EQ(a, b);
  // The load says what it read, and that the stored head is not.
  const std::string tensors =
      std::to_string(qwen3::hf_tensors(*without).size()) + " tensors (f32) from 1 file";
  EXPECT_EQ(qwen3::load_hf_weights(*without, oracle("tiny_dense")),
            tensors + "; lm_head tied to model.embed_tokens");
  EXPECT_EQ(qwen3::load_hf_weights(*with_head, dir),
            tensors +
                "; lm_head tied to model.embed_tokens (the stored lm_head.weight, equal to it, is not read; "
                "exports leave it out, as transformers writes a tied model)");
}

TEST(StateDict, TiedCheckpointWithADifferentLmHeadIsRefused) {
  // A tied model would drop a trained head in silence: the load says so and names both ways out.
  auto f = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  const io::TensorInfo& embed = f.at("model.embed_tokens.weight");
  static std::vector<float> head;
  head.assign(size_t(embed.numel()), 0.0f);
  std::memcpy(head.data(), embed.data, embed.nbytes());
  head[17] += 0.25f;
  auto dir = edited_copy("tiny_dense", "tied_other_head", [&](std::vector<io::TensorWrite>& w) {
    w.push_back({"lm_head.weight", DType::F32, embed.shape, head.data()});
  });
  ASSERT_EQ(embed.dtype, DType::F32);
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("lm_head.weight differs from model.embed_tokens.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("tie_word_embeddings to false"), std::string::npos) << err;
}

// A run that unties a tied checkpoint's head (model.tie_embeddings = false on purpose) starts the head
// as a copy of the embedding: the untied model computes what the tied one does. The load says so.
TEST(StateDict, AnUntiedModelOfATiedCheckpointStartsItsHeadAsTheEmbedding) {
  qwen3::ModelArgs args = qwen3::args_from_hf_config_file((oracle("tiny_dense") / "config.json").string());
  ASSERT_TRUE(args.tie_embeddings);
  args.tie_embeddings = false;
  qwen3::Qwen3Model untied(args, DType::F32);
  const std::string said = qwen3::load_hf_weights(untied, oracle("tiny_dense"));
  EXPECT_NE(said.find("; lm_head untied: the checkpoint ties it to model.embed_tokens (tie_word_embeddings = "
                      "true), so the head starts as a copy of the embedding"),
            std::string::npos)
      << said;
  const std::vector<double> head = untied.find_param("output.weight")->value.to_vector();
  EXPECT_EQ(head, untied.find_param("tok_embeddings.weight")->value.to_vector());
  auto f = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  const io::TensorInfo& embed = f.at("model.embed_tokens.weight");
  ASSERT_EQ(embed.dtype, DType::F32);
  const float* stored = reinterpret_cast<const float*>(embed.data);
  EXPECT_EQ(head, std::vector<double>(stored, stored + embed.numel()));
  // An untied checkpoint that lacks its head is still a missing key.
  auto dir = edited_copy("tiny_moe", "untied_no_head", [](std::vector<io::TensorWrite>& w) {
    std::erase_if(w, [](auto& t) { return t.name == "lm_head.weight"; });
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find("missing keys (1):\n    lm_head.weight"), std::string::npos) << err;
}

// A NaN or infinity in a weight is named at load, not found as a non-finite loss at step 1.
TEST(StateDict, NonFiniteWeightIsNamedAtLoad) {
  for (const float bad : {std::nanf(""), -INFINITY}) {
    static std::vector<float> q;
    auto dir = edited_copy("tiny_dense", "non_finite", [&](std::vector<io::TensorWrite>& w) {
      for (auto& t : w)
        if (t.name == "model.layers.1.self_attn.q_proj.weight") {
          q.assign(size_t(shape_numel(t.shape)), 0.0f);
          std::memcpy(q.data(), t.data, q.size() * sizeof(float));
          q[5] = bad;
          t.data = q.data();
        }
    });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("tensor 'model.layers.1.self_attn.q_proj.weight' holds " +
                       std::string(std::isnan(bad) ? "nan" : "-inf") + " at element 5"),
              std::string::npos)
        << err;
  }
}

TEST(StateDict, Bf16ExportReloadsWithinBf16Rounding) {
  auto model = qwen3::load_hf_model(oracle("tiny_moe"), DType::F32);
  fs::path out = temp_dir("state_dict_bf16") / "ckpt";
  qwen3::export_hf_model(*model, out, DType::BF16);
  auto f = io::SafetensorsFile::open(out / "model.safetensors");
  for (auto& t : f.tensors()) EXPECT_EQ(t.dtype, DType::BF16) << t.name;
  auto again = qwen3::load_hf_model(out, DType::F32);
  auto a = model->find_param("layers.1.moe.experts.w2")->value.to_vector();
  auto b = again->find_param("layers.1.moe.experts.w2")->value.to_vector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], std::fabs(a[i]) * (1.0 / 256)) << i;
}

TEST(StateDict, ShardedCheckpointLoadsLikeOneFile) {
  auto model = qwen3::load_hf_model(oracle("tiny_moe"), DType::F32);
  std::vector<Tensor> keep;
  std::vector<io::TensorWrite> w;
  for (auto& r : qwen3::hf_tensors(*model)) {
    keep.push_back(r.value());
    w.push_back({r.key, DType::F32, r.shape, keep.back().raw_data()});
  }
  io::HfWriteOptions opts;
  opts.max_shard_bytes = 512 * 1024;  // several shards + model.safetensors.index.json
  std::ifstream cfg(oracle("tiny_moe") / "config.json");
  opts.extra_files["config.json"] = std::string(std::istreambuf_iterator<char>(cfg), {});
  fs::path dir = temp_dir("state_dict_sharded") / "ckpt";
  auto res = io::write_hf_checkpoint(dir, w, opts);
  EXPECT_GT(res.files.size(), 1u);
  auto again = qwen3::load_hf_model(dir, DType::F32);
  for (auto* p : model->params())
    EXPECT_EQ(p->value.to_vector(), again->find_param(p->name)->value.to_vector()) << p->name;
}
