// The model against transformers 5.17 (tests/fixtures/oracles, copied from shared/oracles):
// logits, loss, aux loss and the gradient of every parameter, in f32, within 1e-5 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/oracle_check.h"
#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/reference_pass.h"
#include "titan/models/qwen3/state_dict.h"

using namespace titan;
using namespace titan::testing;

TEST(Qwen3Oracle, DenseTiedMatchesTransformers) { check_against_oracle("tiny_dense", Device::CPU, 1e-5); }

TEST(Qwen3Oracle, MoeWithAuxLossMatchesTransformers) { check_against_oracle("tiny_moe", Device::CPU, 1e-5); }

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
