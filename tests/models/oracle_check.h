#pragma once
// The model against transformers 5.17 (tests/fixtures/oracles, copied from shared/oracles): one
// forward + backward of a tiny checkpoint on a device, and its logits, loss, aux loss and the
// gradient of every parameter against the oracle's, in f32. Shared by the CPU oracle test and the
// CUDA one (tests/backend/cuda_oracle_test.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/reference_pass.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan::testing {

inline std::filesystem::path oracle_dir(const std::string& name) {
  return fixtures_dir() / "oracles" / "hf-transformers-5.17" / name;
}

inline Tensor load_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& t = f.at(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  std::memcpy(out.raw_data(), t.data, t.nbytes());
  return out;
}

inline nlohmann::json load_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// The oracle `name` (tiny_dense, tiny_moe) loaded into an f32 model on `device`: every difference
// from transformers within `tol` (absolute).
inline void check_against_oracle(const std::string& name, Device device, double tol) {
  auto dir = oracle_dir(name);
  auto ref = io::SafetensorsFile::open(dir / "reference.safetensors");
  auto expected = load_json(dir / "reference.json");
  auto model = std::make_unique<qwen3::Qwen3Model>(
      qwen3::args_from_hf_config_file((dir / "config.json").string()), DType::F32, device);
  qwen3::load_hf_weights(*model, dir);
  qwen3::ReferencePass r = qwen3::run_reference_pass(*model, load_tensor(ref, "input_ids"));
  EXPECT_EQ(r.logits.device(), device) << name << ": the logits left the model's device";

  EXPECT_LE(max_abs_diff(r.logits.to(Device::CPU), load_tensor(ref, "logits")), tol) << name << " logits";
  EXPECT_NEAR(r.loss.item(), expected["loss"].get<double>(), tol) << name << " loss";
  if (expected.contains("aux_loss")) {
    ASSERT_TRUE(r.aux_loss.defined());
    EXPECT_NEAR(r.aux_loss.item(), expected["aux_loss"].get<double>(), tol) << name << " aux_loss";
  }
  int checked = 0;
  double worst = 0;
  std::string worst_key;
  for (auto& t : qwen3::hf_tensors(*model)) {
    const io::TensorInfo* g = ref.find("grad." + t.key);
    ASSERT_NE(g, nullptr) << "oracle has no gradient for " << t.key;
    double d = max_abs_diff(t.grad().to(Device::CPU), load_tensor(ref, "grad." + t.key));
    EXPECT_LE(d, tol) << name << " gradient of " << t.key;
    if (d > worst) {
      worst = d;
      worst_key = t.key;
    }
    ++checked;
  }
  // Every gradient in the oracle corresponds to one of ours (no parameter left unchecked).
  int oracle_grads = 0;
  for (auto& t : ref.tensors()) oracle_grads += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(checked, oracle_grads);
  std::printf("%s on %s: %d gradients checked, worst %.3g (%s)\n", name.c_str(), std::string(device_name(device)).c_str(), checked,
              worst, worst_key.c_str());
}

}  // namespace titan::testing
