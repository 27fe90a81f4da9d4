// A Qwen3-MoE whose experts are split over ranks (qwen3::ExpertSplit) and Hugging Face checkpoints:
// each run loads its own experts (and the dense weights) from a whole checkpoint, the others' expert
// tensors being neither read nor unexpected; a missing tensor of its own run is an error naming it;
// an export, which needs every expert, is refused naming the split without a WholeExperts, and given
// one writes the whole model's export, asking for each expert parameter once, in export_reads'
// order. (The split model's forward and backward over real ranks: tests/dist/expert_parallel_test.cpp;
// its export over real ranks: tests/dist/expert_export_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "models/oracle_check.h"
#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"

using namespace titan;
using namespace titan::testing;

TEST(ExpertSplit, EachRunLoadsItsExpertsFromAWholeCheckpoint) {
  const auto dir = oracle_dir("tiny_moe");
  const auto whole = qwen3::load_hf_model(dir, DType::F32);
  const qwen3::ModelArgs& a = whole->args();
  ASSERT_EQ(a.num_experts, 8);
  for (int64_t runs : {2, 4})
    for (int64_t index = 0; index < runs; ++index) {
      SCOPED_TRACE("run " + std::to_string(index) + " of " + std::to_string(runs));
      qwen3::Qwen3Model split(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {index, runs});
      qwen3::load_hf_weights(split, dir);
      const int64_t local = a.num_experts / runs;
      int experts = 0;
      for (nn::Param* p : split.params()) {
        const nn::Param* w = whole->find_param(p->name);
        ASSERT_TRUE(w) << p->name;
        const bool expert = p->name.find(".moe.experts.") != std::string::npos;
        EXPECT_EQ(max_abs_diff(p->value, expert ? w->value.narrow(0, index * local, local) : w->value), 0.0)
            << p->name;
        experts += expert;
      }
      EXPECT_EQ(experts, 3 * a.n_layers);
      EXPECT_EQ(qwen3::hf_tensors(split).size() + size_t(3 * a.n_layers * (a.num_experts - local)),
                qwen3::hf_tensors(*whole).size());
    }
}

TEST(ExpertSplit, AMissingTensorOfItsOwnRunIsAnError) {
  const auto dir = oracle_dir("tiny_moe");
  const auto whole = qwen3::load_hf_model(dir, DType::F32);
  const qwen3::ModelArgs a = whole->args();
  // A checkpoint holding only the first run's experts (of two): run 0 loads it, run 1 names what it lacks.
  qwen3::Qwen3Model first(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {0, 2});
  qwen3::load_hf_weights(first, dir);
  const auto half = temp_dir("expert_split_half") / "ckpt";
  std::vector<io::TensorWrite> writes;
  for (const qwen3::HfTensorRef& r : qwen3::hf_tensors(first))
    writes.push_back(
        {r.key, DType::F32, r.shape, r.value().raw_data(), DType::F32});  // views of `first`'s blocks
  io::HfWriteOptions opts;
  opts.extra_files["config.json"] = qwen3::hf_config_from_args(a, "float32").dump(2) + "\n";
  io::write_hf_checkpoint(half, writes, opts);

  qwen3::Qwen3Model again(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {0, 2});
  qwen3::load_hf_weights(again, half);
  for (nn::Param* p : again.params())
    EXPECT_EQ(max_abs_diff(p->value, first.find_param(p->name)->value), 0.0);

  qwen3::Qwen3Model second(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {1, 2});
  const std::string m = error_of([&] { qwen3::load_hf_weights(second, half); });
  EXPECT_NE(m.find("missing keys"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.0.mlp.experts.4.gate_proj.weight"), std::string::npos) << m;
}

TEST(ExpertSplit, ARunReadsNothingOfTheOtherRunsExperts) {
  // A checkpoint whose expert 5 (run 1 of 2) holds a NaN: run 0 loads, run 1 names it.
  const auto dir = oracle_dir("tiny_moe");
  const auto whole = qwen3::load_hf_model(dir, DType::F32);
  const qwen3::ModelArgs a = whole->args();
  whole->find_param("layers.1.moe.experts.w1")->value.narrow(0, 5, 1).fill(std::nan(""));
  const auto bad = temp_dir("expert_split_nan") / "ckpt";
  std::vector<io::TensorWrite> writes;
  for (const qwen3::HfTensorRef& r : qwen3::hf_tensors(*whole))
    writes.push_back({r.key, DType::F32, r.shape, r.value().raw_data(), DType::F32});
  io::HfWriteOptions opts;
  opts.extra_files["config.json"] = qwen3::hf_config_from_args(a, "float32").dump(2) + "\n";
  io::write_hf_checkpoint(bad, writes, opts);
  qwen3::Qwen3Model run0(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {0, 2});
  qwen3::load_hf_weights(run0, bad);
  qwen3::Qwen3Model run1(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {1, 2});
  const std::string m = error_of([&] { qwen3::load_hf_weights(run1, bad); });
  EXPECT_NE(m.find("model.layers.1.mlp.experts.5.gate_proj.weight' holds nan"), std::string::npos) << m;
}

TEST(ExpertSplit, ARunThatDoesNotExistIsAnError) {
  const qwen3::ModelArgs a = qwen3::load_hf_model(oracle_dir("tiny_moe"), DType::F32)->args();
  for (qwen3::ExpertSplit s :
       {qwen3::ExpertSplit{0, 0}, qwen3::ExpertSplit{2, 2}, qwen3::ExpertSplit{0, 3}}) {
    const std::string m =
        error_of([&] { qwen3::Qwen3Model m(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, s); });
    EXPECT_NE(m.find("Qwen3Model"), std::string::npos) << s.index << " of " << s.count << ": " << m;
  }
}

TEST(ExpertSplit, AnExportNeedsEveryExpert) {
  const auto dir = oracle_dir("tiny_moe");
  const qwen3::ModelArgs a = qwen3::load_hf_model(dir, DType::F32)->args();
  qwen3::Qwen3Model split(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {1, 2});
  const auto out = temp_dir("expert_split_export") / "ckpt";
  const std::string m = error_of([&] { qwen3::export_hf_model(split, out, DType::F32); });
  EXPECT_NE(m.find("run 1 of its experts split over 2 ranks"), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing written";
}

TEST(ExpertSplit, AnExportGivenEveryRunIsTheWholeModelsExport) {
  namespace fs = std::filesystem;
  const auto dir = oracle_dir("tiny_moe");
  const auto whole = qwen3::load_hf_model(dir, DType::F32);
  const qwen3::ModelArgs& a = whole->args();
  const auto out = temp_dir("expert_split_export_whole");
  qwen3::export_hf_model(*whole, out / "whole", DType::BF16);
  qwen3::Qwen3Model split(a, DType::F32, Device::CPU, {}, qwen3::Purpose::Inference, {1, 4});
  qwen3::load_hf_weights(split, dir);
  std::vector<std::string> asked, read;  // of whole_experts; of either, as export_reads lists them
  qwen3::ExportSource every_run;
  every_run.whole_experts = [&](nn::Param& run) {
    asked.push_back(run.name);
    read.push_back("whole " + run.name);
    return whole->find_param(run.name)->value.detach();  // the runs of every rank, as one tensor
  };
  every_run.before_read = [&](const nn::Param& p) { read.push_back(p.name); };
  qwen3::export_hf_model(split, out / "split", DType::BF16, {}, false, every_run);
  std::vector<std::string> expected, expected_reads;
  for (const qwen3::ExportRead& r : qwen3::export_reads(split)) {
    if (r.whole_experts) expected.push_back(r.param->name);
    expected_reads.push_back((r.whole_experts ? "whole " : "") + r.param->name);
  }
  EXPECT_EQ(expected.size(), size_t(3 * a.n_layers));
  EXPECT_EQ(asked, expected) << "each expert parameter asked for once, in export_reads' order";
  EXPECT_EQ(read, expected_reads) << "every read, in export_reads' order";
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(out / "whole")) {
    EXPECT_EQ(file_difference(e.path(), out / "split" / e.path().filename()), "") << e.path().filename();
    ++files;
  }
  EXPECT_EQ(files, 3u) << "model.safetensors, config.json, titan_checksums.json";
  EXPECT_TRUE(
      io::HfCheckpoint::open(out / "split").contains("model.layers.1.mlp.experts.7.down_proj.weight"));

  // What it is handed must be every run's experts: one run's alone is an error naming the parameter.
  qwen3::ExportSource own_run;
  own_run.whole_experts = [](nn::Param& run) { return run.value.detach(); };
  const std::string m =
      error_of([&] { qwen3::export_hf_model(split, out / "bad", DType::F32, {}, false, own_run); });
  EXPECT_NE(m.find("layers.0.moe.experts.w1 made whole is f32[2, "), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(out / "bad")) << "nothing written";
}
