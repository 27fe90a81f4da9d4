// Native checkpoints of a Qwen3-MoE whose experts are split over ranks (qwen3::ExpertSplit). Each
// simulated rank of a run (shard k of dp_shard, slice k / ep of run k % ep of the experts) is a model
// built as the trainer builds it, initialised from a seed (a value is a pure function of the seed, the
// parameter and the element, so every rank holds the values a one-process model of that seed holds there),
// its moments the values of two other seeds; its shard files are written through the functions
// Checkpointer::save uses and committed by CheckpointManager. Read back by parameter, every reading
// model (unsplit in one process, another split, another sharding) holds bit for bit what a model of
// its own split and sharding initialised from those seeds holds: values and both moments, padding
// zero. A checkpoint holds every expert once, in equal slices over the shard files; the errors of
// the reader name the parameter and rule.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/checkpoint_layout.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpoint_blocks.h"
#include "titan/train/native_model.h"

using namespace titan;
using namespace titan::train;
namespace fs = std::filesystem;
using titan::testing::error_of;
using titan::testing::temp_dir;

namespace {

constexpr int64_t kStep = 7;
constexpr uint64_t kSeed = 11;  // the values; kSeed + 1 and + 2: exp_avg and exp_avg_sq
const char* const kPrefixes[3] = {"", "exp_avg.", "exp_avg_sq."};

// Three layers (the middle one dense), 8 experts; a dim of 30 leaves alignment gaps between the
// parameters and padding at the blocks' ends.
qwen3::ModelArgs moe_args() {
  qwen3::ModelArgs a;
  a.vocab_size = 101, a.dim = 30, a.n_layers = 3, a.n_heads = 2, a.n_kv_heads = 1, a.head_dim = 8;
  a.hidden_dim = 20, a.max_seq_len = 16, a.tie_embeddings = false;
  a.num_experts = 8, a.top_k = 2, a.moe_hidden_dim = 6, a.mlp_only_layers = {1};
  return a;
}

// Rank `shard` of a run of `dp_shard` sharded ranks whose experts are split over `ep`, as the trainer
// builds it (train_state.cpp: born sharded, its slice of its run of experts, the blocks not born
// sharded padded to a multiple of dp_shard as ParallelPlan::shard_blocks pads them), initialised
// from `seed` (0: left zero).
std::unique_ptr<qwen3::Qwen3Model> rank_model(const qwen3::ModelArgs& a, int64_t shard, int64_t dp_shard,
                                              int64_t ep, uint64_t seed) {
  auto m = std::make_unique<qwen3::Qwen3Model>(
      a, DType::F32, Device::CPU, nn::BlockShard{shard, dp_shard}, qwen3::Purpose::Training,
      qwen3::ExpertSplit{shard % ep, ep,
                         ep > 1 ? nn::BlockShard{shard / ep, dp_shard / ep} : nn::BlockShard{}});
  for (nn::ParamBlock& b : m->blocks())
    if (!b.sharded()) b.pad_to_multiple(dp_shard);
  if (seed) m->initialize(seed);
  return m;
}

// What a test changes in a save: the values of a rank before they are written, the layout before
// the commit.
struct Tampering {
  std::function<void(int64_t shard, qwen3::Qwen3Model& values)> values = {};
  std::function<void(nlohmann::json& layout)> layout = {};
};

// The checkpoint of a run of dp_shard ranks (one replica) with experts split over ep, each rank's
// files written as Checkpointer::save writes them.
fs::path save(const std::string& name, const qwen3::ModelArgs& a, int64_t dp_shard, int64_t ep,
              const Tampering& tampering = {}) {
  CheckpointManager manager(temp_dir(name), 0);
  const fs::path tmp = manager.begin_save(kStep);
  std::vector<CheckpointFile> files;
  nlohmann::json layout;
  for (int64_t k = 0; k < dp_shard; ++k) {
    std::unique_ptr<qwen3::Qwen3Model> state[3];
    std::vector<Tensor> slices[3];
    for (int i = 0; i < 3; ++i) state[i] = rank_model(a, k, dp_shard, ep, kSeed + uint64_t(i));
    if (tampering.values) tampering.values(k, *state[0]);
    for (size_t b = 0; b < state[0]->blocks().size(); ++b)
      for (int i = 0; i < 3; ++i) slices[i].push_back(state[i]->blocks()[b].shard());
    std::vector<io::TensorWrite> writes[3];
    for (int i = 0; i < 3; ++i)
      writes[i] = dp_shard > 1 ? block_slice_tensors(*state[0], k, slices[i], kPrefixes[i])
                               : qwen3::layout_tensors(*state[0], slices[i], kPrefixes[i]);
    for (const io::TensorWrite& t : writes[2]) writes[1].push_back(t);
    for (const CheckpointFile& f : write_shard_files(tmp, k, writes[0], writes[1], "")) files.push_back(f);
    if (k == 0) layout = checkpoint_layout(*state[0], dp_shard);
  }
  if (tampering.layout) tampering.layout(layout);
  manager.commit_save(kStep, files,
                      {{"step", kStep},
                       {"model_config", qwen3::hf_config_from_args(a, "float32")},
                       {"world_size", dp_shard},
                       {"mesh", {{"dp_replicate", 1}, {"dp_shard", dp_shard}, {"ep", ep}}},
                       {"layout", layout}});
  return manager.step_dir(kStep);
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const float *g = got.data<float>(), *w = want.data<float>();
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i)
    if (std::memcmp(g + i, w + i, sizeof(float)) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << got.numel() << " elements differ, the first at "
                       << first;
}

// Every rank of a run of dp_shard ranks with experts split over ep reads `step`: its slice of every
// block (its slice of its run of experts), values through restore_whole_parameters and the moments
// through CheckpointBlocks, as the seeds' models of the same split and sharding hold them.
void expect_every_rank_reads(const fs::path& step, const qwen3::ModelArgs& a, int64_t dp_shard, int64_t ep) {
  const LoadedCheckpoint c = load_checkpoint_dir(step);
  for (int64_t k = 0; k < dp_shard; ++k) {
    SCOPED_TRACE("reading as shard " + std::to_string(k) + " of " + std::to_string(dp_shard) + ", run " +
                 std::to_string(k % ep) + " of " + std::to_string(ep));
    std::unique_ptr<qwen3::Qwen3Model> reader = rank_model(a, k, dp_shard, ep, 0);
    restore_whole_parameters(c, *reader);
    const CheckpointBlocks saved(c, *reader);
    for (int i = 0; i < 3; ++i) {
      std::unique_ptr<qwen3::Qwen3Model> want = rank_model(a, k, dp_shard, ep, kSeed + uint64_t(i));
      for (size_t b = 0; b < reader->blocks().size(); ++b) {
        Tensor got = reader->blocks()[b].shard();
        if (i > 0) {
          got = Tensor::empty(got.shape(), DType::F32);
          saved.read(b, kPrefixes[i], reader->blocks()[b].shard_begin(), got);
        }
        expect_same_bits(got, want->blocks()[b].shard(), kPrefixes[i] + reader->blocks()[b].name());
      }
    }
  }
}

// `titan export`'s and generation's reader: one process, every expert, the weights alone.
void expect_one_process_reads(const fs::path& step, const qwen3::ModelArgs& a) {
  const NativeModel native = load_native_model(step, DType::F32);
  std::unique_ptr<qwen3::Qwen3Model> want = rank_model(a, 0, 1, 1, kSeed);
  ASSERT_EQ(native.model->blocks().size(), want->blocks().size());
  for (size_t b = 0; b < want->blocks().size(); ++b)
    expect_same_bits(native.model->blocks()[b].data(), want->blocks()[b].data(), want->blocks()[b].name());
}

}  // namespace

TEST(CheckpointExperts, ASplitSaveHoldsEveryExpertOnceAndLoadsIntoAnySplitAndSharding) {
  const qwen3::ModelArgs a = moe_args();
  const fs::path step = save("ckpt_experts_ep2_dp4", a, /*dp_shard=*/4, /*ep=*/2);
  const nlohmann::json layout = load_checkpoint_dir(step).train_state.at("layout");
  ASSERT_EQ(layout.at("expert_blocks").size(), 2u);
  // Each run of each MoE layer (0 and 2) is cut in two slices, held by the ranks of shard index
  // k = run + 2 x slice: every file holds as much of the experts as any other, and its slice of the
  // other blocks.
  const int64_t padded = layout["expert_blocks"][0].at("padded").get<int64_t>();
  EXPECT_EQ(
      layout["expert_blocks"][0].at("runs"),
      nlohmann::json(
          {{{{"file", 0}, {"range", {0, padded / 2}}}, {{"file", 2}, {"range", {padded / 2, padded}}}},
           {{{"file", 1}, {"range", {0, padded / 2}}}, {{"file", 3}, {"range", {padded / 2, padded}}}}}));
  std::vector<uintmax_t> sizes;
  for (int64_t k = 0; k < 4; ++k)
    for (const char* kind : {"model", "optimizer"}) {
      const io::SafetensorsFile f = io::SafetensorsFile::open(step / shard_file_name(kind, k));
      const std::string prefix = std::string(kind) == "model" ? "" : "exp_avg.";
      for (const char* block : {"layers.0.experts", "layers.2.experts"}) {
        const io::TensorInfo* t = f.find(prefix + block);
        ASSERT_NE(t, nullptr) << f.path() << ": " << block;
        EXPECT_EQ(t->shape, Shape({padded / 2})) << f.path() << ": " << block;
      }
      EXPECT_NE(f.find(prefix + "layers.1"), nullptr) << f.path();
      if (std::string(kind) == "model") sizes.push_back(fs::file_size(f.path()));
    }
  for (uintmax_t size : sizes) EXPECT_EQ(size, sizes[0]) << "the shard files hold equal parts";
  const nlohmann::json& w1 = layout["expert_blocks"][0]["params"][0];
  EXPECT_EQ(w1.at("name"), "layers.0.moe.experts.w1");
  EXPECT_EQ(w1.at("shape"), nlohmann::json({8, 6, 30})) << "the whole parameter's shape";
  EXPECT_EQ(w1.at("elements"), nlohmann::json({{0, 720}, {720, 1440}}))
      << "runs 0 and 1: 4 experts of 6 x 30";

  expect_one_process_reads(step, a);
  expect_every_rank_reads(step, a, /*dp_shard=*/1, /*ep=*/1);
  expect_every_rank_reads(step, a, 2, 1);
  expect_every_rank_reads(step, a, 4, 4);
  expect_every_rank_reads(step, a, 4, 2);
  expect_every_rank_reads(step, a, 8, 8);  // one expert a rank, more ranks than files
}

TEST(CheckpointExperts, ACheckpointOfWholeRunsInTheEarlierLayoutLoadsIntoAnySplit) {
  const qwen3::ModelArgs a = moe_args();
  // With ep = dp_shard each rank holds its run whole: the earlier layout listed one file per run
  // ("files") where this one gives each run its one slice ("runs").
  const fs::path step = save("ckpt_experts_files_layout", a, 2, 2, {.layout = [](nlohmann::json& layout) {
                               for (nlohmann::json& block : layout["expert_blocks"]) {
                                 ASSERT_EQ(block["runs"].size(), 2u);
                                 block.erase("runs");
                                 block["files"] = {0, 1};
                               }
                             }});
  expect_one_process_reads(step, a);
  expect_every_rank_reads(step, a, 2, 2);
  expect_every_rank_reads(step, a, 4, 2);
  expect_every_rank_reads(step, a, 8, 4);
}

TEST(CheckpointExperts, AnUnsplitSaveLoadsIntoSplitModels) {
  const qwen3::ModelArgs a = moe_args();
  const fs::path step = save("ckpt_experts_ep1_dp2", a, 2, 1);
  EXPECT_FALSE(load_checkpoint_dir(step).train_state.at("layout").contains("expert_blocks"))
      << "an unsplit model's checkpoint is laid out as before expert parallelism";
  expect_every_rank_reads(step, a, 2, 2);
  expect_every_rank_reads(step, a, 4, 4);
  expect_every_rank_reads(step, a, 3, 1);  // and resharded unsplit, across the slices' boundaries
  expect_one_process_reads(step, a);
}

TEST(CheckpointExperts, AOneProcessSaveOfNamedParametersLoadsIntoSplitModels) {
  const qwen3::ModelArgs a = moe_args();
  const fs::path step = save("ckpt_experts_one_process", a, 1, 1);
  EXPECT_EQ(load_checkpoint_dir(step).train_state["layout"]["format"], "named-parameters");
  expect_every_rank_reads(step, a, 2, 2);
  expect_every_rank_reads(step, a, 8, 4);
}

TEST(CheckpointExperts, AParameterTheCheckpointLacksIsNamed) {
  const qwen3::ModelArgs a = moe_args();
  // A layout that no longer lists w3 of layer 0's experts (its runs are still in the files).
  const fs::path step = save("ckpt_experts_missing", a, 4, 2, {.layout = [](nlohmann::json& layout) {
                               nlohmann::json& params = layout["expert_blocks"][0]["params"];
                               ASSERT_EQ(params[2]["name"], "layers.0.moe.experts.w3");
                               params.erase(2);
                             }});
  for (int64_t ep : {1, 2}) {
    const std::string e = error_of([&] { expect_every_rank_reads(step, a, 2, ep); });
    EXPECT_NE(
        e.find("checkpoint '" + step.string() + "' lacks parameter 'layers.0.moe.experts.w3' of this model"),
        std::string::npos)
        << "ep " << ep << ": " << e;
  }
}

TEST(CheckpointExperts, AWholeShapeOtherThanTheModelsIsNamed) {
  qwen3::ModelArgs a = moe_args();
  const fs::path step = save("ckpt_experts_shape", a, 4, 2);
  // Experts of another width: every run's shape follows, so the whole shapes differ.
  a.moe_hidden_dim = 7;
  for (int64_t ep : {1, 4}) {
    const std::string e = error_of([&] { expect_every_rank_reads(step, a, 4, ep); });
    EXPECT_NE(e.find("parameter 'layers.0.moe.experts.w1' is [8, 6, 30] there, [8, 7, 30] in this model"),
              std::string::npos)
        << "ep " << ep << ": " << e;
  }
  // A model of fewer layers: the checkpoint holds parameters it does not have.
  a = moe_args();
  a.n_layers = 2;
  const std::string e = error_of([&] { expect_every_rank_reads(step, a, 2, 2); });
  EXPECT_NE(e.find("holds 12 parameter(s) this model does not have: 'layers.2.attention.k_norm.weight'"),
            std::string::npos)
      << e;
}

TEST(CheckpointExperts, ALayoutLeavingElementsInNoFileIsRefused) {
  const qwen3::ModelArgs a = moe_args();
  // Run 1 of layer 2's w2 said to hold one element fewer: the last one would be read as zero.
  const fs::path step = save("ckpt_experts_gap", a, 4, 2, {.layout = [](nlohmann::json& layout) {
                               nlohmann::json& run1 = layout["expert_blocks"][1]["params"][1]["elements"][1];
                               run1[1] = run1[1].get<int64_t>() - 1;
                             }});
  const std::string e = error_of([&] { expect_one_process_reads(step, a); });
  EXPECT_NE(e.find("holds elements [1439, 1440) of 'layers.2.moe.experts.w2' in no file"), std::string::npos)
      << e;
}

TEST(CheckpointExperts, ANonFiniteValueInARunIsNamedByTheRanksThatReadIt) {
  const qwen3::ModelArgs a = moe_args();
  // The rank holding run 1 of 2 saves a NaN in its second expert of layer 2 (expert 5 of 8).
  const fs::path step =
      save("ckpt_experts_nan", a, 2, 2, {.values = [](int64_t shard, qwen3::Qwen3Model& m) {
             if (shard == 1)
               m.find_param("layers.2.moe.experts.w1")->value.narrow(0, 1, 1).fill(std::nan(""));
           }});
  const LoadedCheckpoint c = load_checkpoint_dir(step);
  // The ranks whose experts do not include expert 5 read nothing of it.
  for (const auto& [shard, dp_shard, ep] :
       {std::array<int64_t, 3>{0, 2, 2}, {0, 4, 4}, {1, 4, 4}, {3, 4, 4}}) {
    std::unique_ptr<qwen3::Qwen3Model> reader = rank_model(a, shard, dp_shard, ep, 0);
    EXPECT_EQ(error_of([&] { restore_whole_parameters(c, *reader); }), "")
        << "shard " << shard << " of " << dp_shard << ", run " << shard % ep << " of " << ep;
  }
  for (const auto& [shard, dp_shard, ep] : {std::array<int64_t, 3>{1, 2, 2}, {2, 4, 4}, {0, 1, 1}}) {
    std::unique_ptr<qwen3::Qwen3Model> reader = rank_model(a, shard, dp_shard, ep, 0);
    const std::string e = error_of([&] { restore_whole_parameters(c, *reader); });
    EXPECT_NE(e.find("'layers.2.moe.experts.w1' holds a non-finite value (nan)"), std::string::npos)
        << "shard " << shard << " of " << dp_shard << ", run " << shard % ep << " of " << ep << ": " << e;
  }
}

// An untied model reading a tied run's checkpoint (a new run from its weights, model.tie_embeddings =
// false on purpose): the head is a copy of the embedding, said by the reader, in one process and in
// every rank's slice. The tied run's moments are the shared tensor's, no untied head's: reading them
// for the head is refused (startup refuses a resume into an untied model before this reader is
// reached; this guards the reader on its own).
TEST(CheckpointExperts, AnUntiedModelReadsATiedCheckpointsHeadAsItsEmbeddingButNotItsMoments) {
  qwen3::ModelArgs tied = moe_args();
  tied.tie_embeddings = true;
  const fs::path step = save("ckpt_untie", tied, /*dp_shard=*/2, /*ep=*/1);
  const LoadedCheckpoint c = load_checkpoint_dir(step);
  qwen3::ModelArgs untied = tied;
  untied.tie_embeddings = false;
  std::unique_ptr<qwen3::Qwen3Model> whole = rank_model(untied, 0, 1, 1, 0);
  EXPECT_EQ(restore_whole_parameters(c, *whole),
            "lm_head untied: the checkpoint ties it to the embedding, so the head starts as a copy of the "
            "embedding");
  const Tensor embedding = whole->find_param("tok_embeddings.weight")->value;
  expect_same_bits(whole->find_param("output.weight")->value, embedding, "output.weight");
  for (int64_t dp_shard : {1, 2}) {
    std::unique_ptr<qwen3::Qwen3Model> reader = rank_model(untied, dp_shard - 1, dp_shard, 1, 0);
    const CheckpointBlocks saved(c, *reader);
    size_t head_block = reader->blocks().size();
    for (size_t b = 0; b < reader->blocks().size(); ++b)
      for (const nn::Param& p : reader->blocks()[b].params())
        if (p.name == "output.weight") head_block = b;
    ASSERT_LT(head_block, reader->blocks().size());
    Tensor moments = Tensor::empty(reader->blocks()[head_block].shard().shape(), DType::F32);
    const std::string e = error_of(
        [&] { saved.read(head_block, "exp_avg.", reader->blocks()[head_block].shard_begin(), moments); });
    EXPECT_NE(e.find("ties lm_head to the embedding and this model does not (model.tie_embeddings = false): "
                     "its optimizer state has no moments for the untied head"),
              std::string::npos)
        << "dp_shard " << dp_shard << ": " << e;
  }
}
