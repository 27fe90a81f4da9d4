// Sizes are checked before use (src/titan/models/qwen3/size_check.h): absurd configs are errors
// naming the field and the numbers, never an overflow, a bad_alloc or a hang.
#include "titan/models/qwen3/size_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/core/host_memory.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/step_profile.h"

using namespace titan;
using namespace titan::qwen3;
namespace fs = std::filesystem;

namespace {

using titan::testing::error_of;

ModelArgs tiny() {
  ModelArgs a = flavor("debugmodel");
  a.n_layers = 2;
  a.dim = 64;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.head_dim = 32;
  a.hidden_dim = 128;
  return a;
}

// A folder holding config.json of `config` (and nothing else).
fs::path hf_dir(const std::string& name, const nlohmann::json& config) {
  fs::path dir = titan::testing::temp_dir(name);
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

}  // namespace

TEST(SizeCheck, EverySizeFieldIsBoundedNamingTheField) {
  for (const char* field :
       {"vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "max_seq_len",
        "num_experts", "top_k", "moe_hidden_dim", "decoder_sparse_step"}) {
    ModelArgs a = tiny();
    apply_override(a, field, "9223372036854775807");  // 2^63 - 1
    std::string e = error_of([&] { a.validate(); });
    EXPECT_NE(e.find(std::string(field) + " = 9223372036854775807 exceeds the limit"), std::string::npos)
        << e;
  }
}

TEST(SizeCheck, AHundredMillionLayersInConfigJsonIsAnErrorBeforeAnyAllocation) {
  nlohmann::json c = hf_config_from_args(tiny(), "float32");
  c["num_hidden_layers"] = 100000000;
  fs::path dir = hf_dir("size_check_layers", c);
  std::string e = error_of([&] { load_hf_model(dir, DType::F32); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("n_layers = 100000000 exceeds the limit"), std::string::npos) << e;
  c = hf_config_from_args(tiny(), "float32");
  c["intermediate_size"] = INT64_MAX;
  e = error_of([&] { load_hf_model(hf_dir("size_check_intermediate", c), DType::F32); });
  EXPECT_NE(e.find("hidden_dim = 9223372036854775807 exceeds the limit"), std::string::npos) << e;
}

TEST(SizeCheck, ProductsThatOverflowInt64AreErrors) {
  // Every field within its bound, the parameter count past 2^63.
  ModelArgs a = tiny();
  a.n_layers = 1 << 14;
  a.dim = 1 << 17;
  a.num_experts = 1 << 14;
  a.top_k = 1;
  a.moe_hidden_dim = 1 << 20;
  std::string e = error_of([&] {
    a.validate();
    (void)a.num_params();
  });
  EXPECT_NE(e.find("parameter count"), std::string::npos) << e;
  EXPECT_NE(e.find("does not fit in a 64-bit integer"), std::string::npos) << e;
}

train::StepShape shape(int64_t batch, int64_t seq) {
  train::StepShape s;
  s.local_batch = batch;
  s.seq_len = seq;
  s.compute = DType::F32;
  return s;
}

// A need just above what is free: the two figures get as many digits as tell them apart.
TEST(SizeCheck, ANeedJustAboveTheMemoryIsSaidWithDigitsThatTellThemApart) {
  const int64_t available = 23933571072;  // 22.29 GiB
  MemoryNeed need;
  need.weights = available + (int64_t(1) << 20);
  const std::string e =
      error_of([&] { check_memory_fits(need, available, "the job", "MemAvailable", "free memory"); });
  EXPECT_NE(e.find("the job needs an estimated 22.291 GiB (23934619648 bytes: weights 22.3 GiB, "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("but MemAvailable is 22.29 GiB (23933571072 bytes); free memory"), std::string::npos) << e;
  EXPECT_NO_THROW(check_memory_fits(need, need.weights, "the job", "MemAvailable", "free memory"));
}

TEST(SizeCheck, AModelLargerThanTheMachineIsRefusedWithTheNumbers) {
  // 16384 layers of dim 131072: petabytes of weights, a valid shape that no machine holds.
  ModelArgs a = tiny();
  a.n_layers = 1 << 14;
  a.dim = 1 << 17;
  a.hidden_dim = 1 << 17;
  a.validate();
  const int64_t available = host_available_bytes();
  ASSERT_GT(available, 0);
  std::string e = error_of([&] { train::check_training_fits(a, shape(2, 64)); });
  EXPECT_NE(e.find("needs an estimated"), std::string::npos) << e;
  EXPECT_NE(e.find("weights"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(available).substr(0, 3)), std::string::npos) << e;
  EXPECT_NE(e.find("but this machine's MemAvailable is "), std::string::npos) << e;
  // The same check passes the tiny model (its exact need comes from the meta device's step profile).
  EXPECT_NO_THROW(train::check_training_fits(tiny(), shape(2, 64)));
  const train::StepProfile m = train::profile_training_step(tiny(), shape(2, 64), Device::Meta);
  EXPECT_EQ(m.weights, tiny().num_params() * 4);
  // A sequence length past the bound names the config key.
  e = error_of([&] { train::check_training_fits(tiny(), shape(2, 99999999999)); });
  EXPECT_NE(e.find("training.seq_len = 99999999999 exceeds the limit"), std::string::npos) << e;
}

// A step whose tensors together pass 2^63 bytes (each one within it) is an error saying so, not a
// counter that wraps to a negative peak: the meta device counts what `titan info` prints.
TEST(SizeCheck, AStepHoldingMoreThan2To63BytesIsAnErrorNotAWrappedCounter) {
  ModelArgs a = tiny();
  a.dim = 1 << 14;
  a.hidden_dim = 1 << 14;
  a.max_seq_len = 1 << 15;
  a.validate();
  const std::string e =
      error_of([&] { train::profile_training_step(a, shape(int64_t(1) << 31, int64_t(1) << 15), Device::Meta); });
  EXPECT_NE(e.find("meta memory: the tensors held at once exceed 2^63 bytes"), std::string::npos) << e;
}

// Selective checkpointing covers one layer in N, counted as torchtitan counts (layers N-1, 2N-1,
// ...); the step (on the meta device) holds less at its peak the more layers it covers.
TEST(SizeCheck, CheckpointingCoversOneLayerInNAndTheStepsPeakFollows) {
  std::vector<int64_t> covered;
  for (int64_t i = 0; i < 7; ++i)
    if (Checkpointing::every_nth(3).covers(i)) covered.push_back(i);
  EXPECT_EQ(covered, (std::vector<int64_t>{2, 5}));
  EXPECT_FALSE(Checkpointing::none().covers(0));
  EXPECT_TRUE(Checkpointing::full().covers(0));
  ModelArgs six = tiny();
  six.n_layers = 6;
  auto activations = [&](Checkpointing c) {
    train::StepShape s = shape(2, 64);
    s.checkpointing = c;
    return train::profile_training_step(six, s, Device::Meta).activations();
  };
  EXPECT_GT(activations(Checkpointing::none()),
            activations(Checkpointing::every_nth(3)));  // 2 layers covered
  EXPECT_GT(activations(Checkpointing::every_nth(3)), activations(Checkpointing::every_nth(2)));  // 3
  EXPECT_GT(activations(Checkpointing::every_nth(2)), activations(Checkpointing::full()));        // 6
  EXPECT_EQ(activations(Checkpointing::every_nth(1)), activations(Checkpointing::full()));
  EXPECT_EQ(activations(Checkpointing::every_nth(7)), activations(Checkpointing::none()));  // no layer 6
}

TEST(SizeCheck, AFifoNamedModelSafetensorsIsRefusedNotWaitedOn) {
  fs::path dir = hf_dir("size_check_fifo", hf_config_from_args(tiny(), "float32"));
  ASSERT_EQ(::mkfifo((dir / "model.safetensors").c_str(), 0644), 0);
  std::string e = error_of([&] { load_hf_model(dir, DType::F32); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  // config.json itself as a FIFO.
  fs::path dir2 = titan::testing::temp_dir("size_check_fifo_config");
  ASSERT_EQ(::mkfifo((dir2 / "config.json").c_str(), 0644), 0);
  e = error_of([&] { load_hf_model(dir2, DType::F32); });
  EXPECT_NE(e.find("is a FIFO"), std::string::npos) << e;
}
