// The model against transformers 5.17 (tests/fixtures/oracles, copied from shared/oracles):
// logits, loss, aux loss and the gradient of every parameter, in f32, within 1e-5 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/reference_pass.h"
#include "titan/models/qwen3/state_dict.h"

using namespace titan;
using namespace titan::testing;

namespace {

std::filesystem::path oracle_dir(const std::string& name) {
  return fixtures_dir() / "oracles" / "hf-transformers-5.17" / name;
}

Tensor load_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& t = f.at(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  std::memcpy(out.raw_data(), t.data, t.nbytes());
  return out;
}

nlohmann::json load_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

void check_against_oracle(const std::string& name) {
  auto dir = oracle_dir(name);
  auto ref = io::SafetensorsFile::open(dir / "reference.safetensors");
  auto expected = load_json(dir / "reference.json");
  auto model = qwen3::load_hf_model(dir, DType::F32);
  Tensor ids = load_tensor(ref, "input_ids");
  qwen3::ReferencePass r = qwen3::run_reference_pass(*model, ids);

  EXPECT_LE(max_abs_diff(r.logits, load_tensor(ref, "logits")), 1e-5) << name << " logits";
  EXPECT_NEAR(r.loss.item(), expected["loss"].get<double>(), 1e-5) << name << " loss";
  if (expected.contains("aux_loss")) {
    ASSERT_TRUE(r.aux_loss.defined());
    EXPECT_NEAR(r.aux_loss.item(), expected["aux_loss"].get<double>(), 1e-5) << name << " aux_loss";
  }
  int checked = 0;
  double worst = 0;
  std::string worst_key;
  for (auto& t : qwen3::hf_tensors(*model)) {
    const io::TensorInfo* g = ref.find("grad." + t.key);
    ASSERT_NE(g, nullptr) << "oracle has no gradient for " << t.key;
    double d = max_abs_diff(t.grad(), load_tensor(ref, "grad." + t.key));
    EXPECT_LE(d, 1e-5) << name << " gradient of " << t.key;
    if (d > worst) { worst = d; worst_key = t.key; }
    ++checked;
  }
  // Every gradient in the oracle corresponds to one of ours (no parameter left unchecked).
  int oracle_grads = 0;
  for (auto& t : ref.tensors()) oracle_grads += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(checked, oracle_grads);
  std::printf("%s: %d gradients checked, worst %.3g (%s)\n", name.c_str(), checked, worst, worst_key.c_str());
}

}  // namespace

TEST(Qwen3Oracle, DenseTiedMatchesTransformers) { check_against_oracle("tiny_dense"); }

TEST(Qwen3Oracle, MoeWithAuxLossMatchesTransformers) { check_against_oracle("tiny_moe"); }

TEST(Qwen3Oracle, DebugDumpCommandWritesTheSameNumbers) {
  auto dir = oracle_dir("tiny_moe");
  auto out = temp_dir("debug_dump") / "dump.safetensors";
  std::string log;
  int rc = run_command(titan_binary().string() + " debug dump --model-path " + dir.string() + " --tokens " +
                           (dir / "reference.safetensors").string() + " --out " + out.string(), &log);
  ASSERT_EQ(rc, 0) << log;
  auto dump = io::SafetensorsFile::open(out);
  auto ref = io::SafetensorsFile::open(dir / "reference.safetensors");
  auto expected = load_json(dir / "reference.json");
  EXPECT_NEAR(load_tensor(dump, "loss").item(), expected["loss"].get<double>(), 1e-5);
  EXPECT_NEAR(load_tensor(dump, "aux_loss").item(), expected["aux_loss"].get<double>(), 1e-5);
  EXPECT_LE(max_abs_diff(load_tensor(dump, "logits"), load_tensor(ref, "logits")), 1e-5);
  EXPECT_LE(max_abs_diff(load_tensor(dump, "grad.model.layers.1.mlp.experts.3.down_proj.weight"),
                         load_tensor(ref, "grad.model.layers.1.mlp.experts.3.down_proj.weight")),
            1e-5);
}

TEST(Qwen3Oracle, ExportRoundTripIsByteIdentical) {
  for (const char* name : {"tiny_dense", "tiny_moe"}) {
    auto src = oracle_dir(name);
    auto model = qwen3::load_hf_model(src, DType::F32);
    auto out = temp_dir(std::string("export_") + name) / "ckpt";
    qwen3::export_hf_model(*model, out, DType::F32);
    auto a = io::SafetensorsFile::open(src / "model.safetensors");
    auto b = io::SafetensorsFile::open(out / "model.safetensors");
    EXPECT_EQ(a.tensors().size(), b.tensors().size()) << name;
    for (auto& t : a.tensors()) {
      const io::TensorInfo* u = b.find(t.name);
      ASSERT_NE(u, nullptr) << name << ": export lacks " << t.name;
      EXPECT_EQ(t.shape, u->shape) << t.name;
      EXPECT_EQ(t.dtype, u->dtype) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, u->data, t.nbytes())) << name << ": bytes differ for " << t.name;
    }
    // The export reloads through the HF route with the same config.
    auto again = qwen3::load_hf_model(out, DType::F32);
    EXPECT_EQ(again->num_params(), model->num_params());
    EXPECT_EQ(again->args().tie_embeddings, model->args().tie_embeddings);
  }
}
