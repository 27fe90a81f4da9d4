// [validation]: the held-out loss equals an independent no-grad forward on the same batches, leaves
// the model and the training untouched, reads a stream that shares no document with training, and
// shows up in the log, metrics.jsonl and TensorBoard.
#include "titan/train/validation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/chat.h"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/job_config.h"
#include "titan/train/train_state.h"
#include "train_test_util.h"

using namespace titan;
using namespace titan::train;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

fs::path train_file() { return data::assets_dir() / "datasets" / "nlp-corpus" / "train.jsonl"; }
fs::path val_file() { return data::assets_dir() / "datasets" / "nlp-corpus-validation" / "val.jsonl"; }

std::vector<std::string> texts_of(const fs::path& jsonl) {
  std::vector<std::string> texts;
  std::ifstream f(jsonl);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

using tt::tiny_config;
using tt::error_of;
using tt::read_metrics;

qwen3::ModelArgs model_args(const JobConfig& c) {
  qwen3::ModelArgs a = qwen3::flavor(c.model.flavor);
  for (auto& [k, v] : c.model.overrides) qwen3::apply_override(a, k, v);
  return a;
}

// `n` short held-out conversations ("Name a number near ...") written to `path` as JSONL.
std::vector<nlohmann::ordered_json> write_number_conversations(const fs::path& path, int n) {
  std::vector<nlohmann::ordered_json> chats;
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    nlohmann::ordered_json record = {
        {"messages",
         {{{"role", "user"}, {"content", "Name a number near " + std::to_string(i * 13) + "."}},
          {{"role", "assistant"},
           {"content", std::string(i % 2 ? "Perhaps " : "") + std::to_string(i * 13 + 1)}}}}};
    out << record.dump() << "\n";
    chats.push_back(record);
  }
  return chats;
}

// Adds the cross-entropy of the trained tokens of conversation `t`, scored alone in a row of its own
// (f32 logits, the loss in f64 here), to `ce_sum`, and their number to `n`.
void score_alone(qwen3::Qwen3Model& model, const data::ChatTokens& t, double& ce_sum, int64_t& n) {
  autograd::NoGradGuard no_grad;
  const int64_t len = int64_t(t.ids.size());
  const Tensor logits =
      model.forward_logits(Tensor::from_vector(std::vector<int64_t>(t.ids.begin(), t.ids.end()), {1, len}));
  const int64_t V = logits.shape().back();
  const float* l = logits.data<float>();
  for (int64_t p = 0; p + 1 < len; ++p) {
    if (!t.trained[size_t(p + 1)]) continue;
    double mx = -1e300, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[p * V + v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[p * V + v]) - mx);
    ce_sum += mx + std::log(sum) - double(l[p * V + t.ids[size_t(p + 1)]]);
    ++n;
  }
}

}  // namespace

TEST(Validation, HeldOutLossEqualsAnIndependentNoGradForwardOnTheSameBatches) {
  const int64_t B = 2, S = 32, steps = 3;
  JobConfig cfg = tiny_config(tt::temp_dir("validation_equal"),
                              {{"validation.enable", "true"},
                               {"validation.steps", std::to_string(steps)},
                               {"validation.local_batch_size", std::to_string(B)},
                               {"validation.seq_len", std::to_string(S)}});
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  qwen3::Qwen3Model model(model_args(cfg), DType::F32);
  model.initialize(7);
  const dist::ParallelPlan one_process;
  dist::ShardedBlocks whole(one_process, model.blocks(), block_roles(model), dist::Reshard::AfterForward);
  Validator validator(cfg, tok, data::list_dataset_files({train_file().parent_path()}), one_process);
  EXPECT_TRUE(validator.due(1));
  EXPECT_FALSE(validator.due(2));
  EXPECT_TRUE(validator.due(cfg.validation.freq));

  const std::vector<double> before = model.blocks()[1].data().to_vector();
  const ValidationResult r = validator.run(model, whole);

  // Nothing moved and no gradient was accumulated.
  EXPECT_EQ(model.blocks()[1].data().to_vector(), before);
  for (auto& b : model.blocks())
    for (double g : b.grad().to_vector()) ASSERT_EQ(g, 0.0);

  // The same batches, packed here from the held-out file: each document's tokens + the separator,
  // concatenated, cut into windows of S + 1 tokens, B windows per batch.
  std::vector<int64_t> stream;
  for (auto& text : texts_of(val_file())) {
    if (int64_t(stream.size()) >= steps * B * (S + 1)) break;
    for (int32_t id : tok.encode(text)) stream.push_back(id);
    stream.push_back(tok.document_separator_id());
  }
  double ce_sum = 0;
  int64_t n = 0;
  autograd::NoGradGuard no_grad;
  for (int64_t b = 0; b < steps; ++b) {
    std::vector<int64_t> ids(B * S), labels(B * S);
    for (int64_t row = 0; row < B; ++row)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t w = (b * B + row) * (S + 1);
        ids[row * S + t] = stream[w + t];
        labels[row * S + t] = stream[w + t + 1];
      }
    Tensor logits = model.forward_logits(Tensor::from_vector(ids, {B, S}));  // f32 [B, S, V]
    const int64_t V = logits.shape().back();
    const float* l = logits.data<float>();
    for (int64_t i = 0; i < B * S; ++i) {
      double mx = -1e300, sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[i * V + v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[i * V + v]) - mx);
      ce_sum += mx + std::log(sum) - double(l[i * V + labels[i]]);
      ++n;
    }
  }
  const double expected = ce_sum / double(n);
  EXPECT_EQ(r.batches, steps);
  EXPECT_EQ(r.tokens, n);
  EXPECT_NEAR(r.loss, expected, 1e-5 * expected);
  EXPECT_DOUBLE_EQ(r.perplexity, std::exp(r.loss));

  // Every evaluation reads the same batches: the figures of different steps compare.
  EXPECT_EQ(validator.run(model, whole).loss, r.loss);
}

// With conversations (training.chat_field) the held-out loss is the mean over the answers' tokens only:
// rows of one conversation each, as training reads them; the built-in held-out set (text) is refused.
TEST(Validation, HeldOutConversationsAreScoredOnTheirAnswersOnly) {
  const int64_t B = 2, S = 40, steps = 2;
  const fs::path held_out = tt::temp_dir("validation_chat_" + std::to_string(getpid())) / "held_out.jsonl";
  const std::vector<nlohmann::ordered_json> chats = write_number_conversations(held_out, 5);
  JobConfig cfg = tiny_config(tt::temp_dir("validation_chat_run_" + std::to_string(getpid())),
                              {{"training.chat_field", "messages"},
                               {"validation.enable", "true"},
                               {"validation.dataset_path", held_out.string()},
                               {"validation.steps", std::to_string(steps)},
                               {"validation.local_batch_size", std::to_string(B)},
                               {"validation.seq_len", std::to_string(S)}});
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  qwen3::Qwen3Model model(model_args(cfg), DType::F32);
  model.initialize(7);
  const dist::ParallelPlan one_process;
  dist::ShardedBlocks whole(one_process, model.blocks(), block_roles(model), dist::Reshard::AfterForward);
  Validator validator(cfg, tok, data::list_dataset_files({train_file().parent_path()}), one_process);
  const ValidationResult r = validator.run(model, whole);

  // Causal attention keeps a row's padding out of its conversation: each scores as it scores alone.
  double ce_sum = 0;
  int64_t n = 0;
  for (int64_t row = 0; row < steps * B; ++row) {
    const data::ChatTokens t =
        data::tokenize_chat(tok, data::render_qwen3_chat(chats[size_t(row)].at("messages")));
    ASSERT_LE(int64_t(t.ids.size()), S) << "each conversation fits its row here";
    score_alone(model, t, ce_sum, n);
  }
  ASSERT_GT(n, 0);
  EXPECT_EQ(r.batches, steps);
  EXPECT_EQ(r.tokens, n);
  EXPECT_NEAR(r.loss, ce_sum / double(n), 1e-5 * ce_sum / double(n));

  JobConfig builtin = tiny_config(tt::temp_dir("validation_chat_builtin_" + std::to_string(getpid())),
                                  {{"training.chat_field", "messages"}, {"validation.enable", "true"}});
  EXPECT_NE(error_of([&] { Validator(builtin, tok, {}, one_process); })
                .find("validation.dataset = \"nlp-corpus-validation\" is text, but training.chat_field = "
                      "\"messages\" trains on conversations"),
            std::string::npos);
}

// One pass scores the whole held-out set: the batch it ends in is scored with its missing rows as
// padding (no targets), so 7 conversations give every answer token and the same loss at 1, 2 or 4
// rows a batch, one per row or packed (they were 4 of 7 at 4 rows: the last batch was dropped).
TEST(Validation, TheWholeHeldOutSetIsScoredWhateverTheBatchSize) {
  const fs::path held_out = tt::temp_dir("validation_all_" + std::to_string(getpid())) / "held_out.jsonl";
  const std::vector<nlohmann::ordered_json> chats = write_number_conversations(held_out, 7);
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  double ce_sum = 0;
  int64_t n = 0;
  std::unique_ptr<qwen3::Qwen3Model> model;
  for (const bool packed : {false, true})
    for (const int64_t B : {1, 2, 4}) {
      SCOPED_TRACE(std::string(packed ? "packed" : "one per row") + ", " + std::to_string(B) +
                   " rows a batch");
      JobConfig cfg = tiny_config(tt::temp_dir("validation_all_run_" + std::to_string(getpid())),
                                  {{"training.chat_field", "messages"},
                                   {"training.pack_conversations", packed ? "true" : "false"},
                                   {"model.attn_mask_type", packed ? "block_causal" : "causal"},
                                   {"validation.enable", "true"},
                                   {"validation.dataset_path", held_out.string()},
                                   {"validation.steps", "-1"},
                                   {"validation.local_batch_size", std::to_string(B)},
                                   {"validation.seq_len", "48"}});
      if (!model) {
        model = std::make_unique<qwen3::Qwen3Model>(model_args(cfg), DType::F32);
        model->initialize(7);
        for (const nlohmann::ordered_json& chat : chats)
          score_alone(*model, data::tokenize_chat(tok, data::render_qwen3_chat(chat.at("messages"))), ce_sum,
                      n);
      }
      const dist::ParallelPlan one_process;
      dist::ShardedBlocks whole(one_process, model->blocks(), block_roles(*model),
                                dist::Reshard::AfterForward);
      const ValidationResult r =
          Validator(cfg, tok, data::list_dataset_files({train_file().parent_path()}), one_process)
              .run(*model, whole);
      EXPECT_EQ(r.tokens, n) << "every answer token of the 7 conversations";
      EXPECT_EQ(r.conversations, 7) << "each counted once, in the batch that holds it";
      EXPECT_EQ(r.cut_conversations, 0);
      EXPECT_NEAR(r.loss, ce_sum / double(n), 1e-5 * ce_sum / double(n));
      if (!packed) {
        EXPECT_EQ(r.batches, (7 + B - 1) / B);
      }
    }
}

// Packed held-out conversations (training.pack_conversations, block-causal attention) score as each one
// scored alone in a row of its own: 4 conversations in 2 rows of one batch, the last row ended by the
// end of the held-out data.
TEST(Validation, PackedHeldOutConversationsScoreAsEachOneAlone) {
  const int64_t B = 2, S = 64;
  const fs::path held_out = tt::temp_dir("validation_packed_" + std::to_string(getpid())) / "held_out.jsonl";
  const std::vector<nlohmann::ordered_json> chats = write_number_conversations(held_out, 4);
  JobConfig cfg = tiny_config(tt::temp_dir("validation_packed_run_" + std::to_string(getpid())),
                              {{"training.chat_field", "messages"},
                               {"training.pack_conversations", "true"},
                               {"model.attn_mask_type", "block_causal"},
                               {"validation.enable", "true"},
                               {"validation.dataset_path", held_out.string()},
                               {"validation.steps", "-1"},
                               {"validation.local_batch_size", std::to_string(B)},
                               {"validation.seq_len", std::to_string(S)}});
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  qwen3::Qwen3Model model(model_args(cfg), DType::F32);
  model.initialize(7);
  const dist::ParallelPlan one_process;
  dist::ShardedBlocks whole(one_process, model.blocks(), block_roles(model), dist::Reshard::AfterForward);
  Validator validator(cfg, tok, data::list_dataset_files({train_file().parent_path()}), one_process);
  const ValidationResult r = validator.run(model, whole);

  double ce_sum = 0;
  int64_t n = 0, tokens = 0;
  for (const nlohmann::ordered_json& chat : chats) {
    const data::ChatTokens t = data::tokenize_chat(tok, data::render_qwen3_chat(chat.at("messages")));
    tokens += int64_t(t.ids.size());
    score_alone(model, t, ce_sum, n);
  }
  ASSERT_LE(tokens, B * S) << "the conversations should fit one batch";
  ASSERT_GT(tokens, S) << "a row should hold several conversations";
  EXPECT_EQ(r.batches, 1);
  EXPECT_EQ(r.tokens, n);
  // The second conversation of a row sits at positions past the first: rotary attention sees only
  // position differences, so the two agree to rounding.
  EXPECT_NEAR(r.loss, ce_sum / double(n), 1e-5 * ce_sum / double(n));
}

TEST(Validation, TheHeldOutStreamSharesNoDocumentWithTheTrainingStream) {
  const std::vector<std::string> val = texts_of(val_file());
  ASSERT_GE(val.size(), 500u) << val_file();
  const std::vector<std::string> train = texts_of(train_file());
  ASSERT_GE(train.size(), 10000u);
  const std::set<std::string> train_set(train.begin(), train.end());
  int shared = 0;
  for (auto& t : val) shared += train_set.count(t) ? 1 : 0;
  EXPECT_EQ(shared, 0);

  // The default config validates on the built-in held-out set, which is not the training set.
  JobConfig def = load_job_config(tt::debugmodel_toml().string(), {});
  EXPECT_TRUE(def.validation.enable);
  EXPECT_EQ(data::builtin_dataset_path(def.validation.dataset), val_file().parent_path());
  EXPECT_EQ(data::builtin_dataset_path(def.training.dataset), train_file().parent_path());

  // Held-out data that is also training data is refused, by file or by a folder holding it.
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  const auto training_files = data::list_dataset_files({train_file().parent_path()});
  const dist::ParallelPlan one_process;
  for (const fs::path& p : {train_file(), data::assets_dir() / "datasets"}) {
    JobConfig c = tiny_config(tt::temp_dir("validation_overlap"),
                              {{"validation.enable", "true"}, {"validation.dataset_path", p.string()}});
    std::string err = error_of([&] { Validator(c, tok, training_files, one_process); });
    EXPECT_NE(err.find("validation.dataset_path"), std::string::npos) << err;
    EXPECT_NE(err.find("also training data"), std::string::npos) << err;
  }
  // A hard link to a training file is that file; a copy of one is the same data.
  const fs::path linked = tt::temp_dir("validation_hard_link") / "held_out.jsonl";
  fs::create_hard_link(train_file(), linked);
  const fs::path copied = tt::temp_dir("validation_copy") / "held_out.jsonl";
  fs::copy_file(train_file(), copied);
  for (const auto& [p, message] :
       {std::pair{linked, std::string("also training data")},
        std::pair{copied, "holds the same bytes as the training file '" + train_file().string() + "'"}}) {
    JobConfig c = tiny_config(tt::temp_dir("validation_overlap"),
                              {{"validation.enable", "true"}, {"validation.dataset_path", p.string()}});
    std::string err = error_of([&] { Validator(c, tok, training_files, one_process); });
    EXPECT_NE(err.find("validation.dataset_path: '" + p.string() + "' " + (message[0] == 'a' ? "is " : "")),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
  JobConfig c = tiny_config(tt::temp_dir("validation_bad_name"), {{"validation.dataset", "c4_validation"}});
  std::string err = error_of([&] { Validator(c, tok, training_files, one_process); });
  EXPECT_NE(err.find("validation.dataset"), std::string::npos) << err;
  EXPECT_NE(err.find("c4_validation"), std::string::npos) << err;
}

TEST(Validation, BadValuesAreErrorsNamingTheKey) {
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"validation.freq", "0"}, {"validation.steps", "0"}, {"validation.local_batch_size", "-2"},
           {"validation.seq_len", "0"}}) {
    JobConfig c = tiny_config(tt::temp_dir("validation_bad"), {{key, value}});
    std::string err = error_of([&] { c.validate(1); });
    EXPECT_NE(err.find(key), std::string::npos) << key << ": " << err;
  }
  std::string err = error_of([&] { tiny_config(tt::temp_dir("validation_typo"), {{"validation.frequency", "5"}}); });
  EXPECT_NE(err.find("validation.freq"), std::string::npos) << err;
  // A validation window longer than the model's max_seq_len is refused before any step trains.
  std::string out;
  EXPECT_NE(
      tt::run_command(
          tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
              tt::cli_args(tt::tiny_job(tt::temp_dir("validation_long_" + std::to_string(getpid())),
                                        {{"validation.enable", "true"}, {"validation.seq_len", "50000"}})) +
              " 2>&1",
          &out),
      0);
  EXPECT_NE(out.find("validation.seq_len = 50000 exceeds the model's max_seq_len = 40960"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("step: 1 "), std::string::npos) << out;
  // Held-out data with no document, or too little for one batch: named by its key and file before any step.
  const fs::path data = tt::temp_dir("validation_small_data_" + std::to_string(getpid()));
  std::ofstream(data / "empty.txt") << "";
  std::ofstream(data / "short.txt") << "A few words only.\n";
  for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
           {"empty.txt", "holds no non-empty document"},
           {"short.txt", "holds fewer tokens than one row of seq_len"}}) {
    EXPECT_NE(
        tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                            tt::cli_args(tt::tiny_job(
                                data / "run", {{"validation.enable", "true"},
                                               {"validation.dataset_path", (data / file).string()}})) +
                            " 2>&1",
                        &out),
        0);
    EXPECT_NE(out.find("validation.dataset_path: "), std::string::npos) << out;
    EXPECT_NE(out.find((data / file).string()), std::string::npos) << out;
    EXPECT_NE(out.find(says), std::string::npos) << out;
    EXPECT_EQ(out.find("step: 1 "), std::string::npos) << out;
  }
  // A path that is not there, and a glob that matches nothing, under the key.
  for (const std::string& path : {(data / "absent.jsonl").string(), (data / "none-*.jsonl").string()}) {
    EXPECT_NE(
        tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                            tt::cli_args(tt::tiny_job(data / "run", {{"validation.enable", "true"},
                                                                     {"validation.dataset_path", path}})) +
                            " 2>&1",
                        &out),
        0);
    EXPECT_NE(out.find("validation.dataset_path: "), std::string::npos) << out;
    EXPECT_NE(out.find(path), std::string::npos) << out;
    EXPECT_EQ(out.find("step: 1 "), std::string::npos) << out;
  }
}

// validation.dataset_path takes what training.dataset_path takes: a glob reads every file it
// matches (it was refused as a path that does not exist).
TEST(Validation, AGlobOfHeldOutFilesReadsEveryFileItMatches) {
  const fs::path data = tt::temp_dir("validation_glob_" + std::to_string(getpid()));
  const fs::path corpus = tt::assets_dir() / "datasets" / "nlp-corpus-validation" / "val.jsonl";
  fs::copy_file(corpus, data / "held-a.jsonl");
  fs::copy_file(corpus, data / "held-b.jsonl");
  std::string out;
  ASSERT_EQ(tt::run_command(
                tt::titan_binary().string() + " eval --config " + tt::debugmodel_toml().string() +
                    tt::cli_args(tt::tiny_job(
                        data / "run", {{"validation.dataset_path", (data / "held-*.jsonl").string()}})) +
                    " 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("from " + (data / "held-*.jsonl").string() + " (2 files)"), std::string::npos) << out;
  // titan eval's start-up names no training data, batch or accumulation: it reads the held-out set.
  EXPECT_EQ(out.find("gradient accumulation"), std::string::npos) << out;
  EXPECT_NE(out.find("tokenizer: "), std::string::npos) << out;
}

// The training data line says how many files a folder or a glob named, and names the files of other
// types that the listing passed over in a folder, given or matched (hidden names are not counted); a
// file is named alone. The validation line says the same of the held-out data.
TEST(Validation, TheTrainingDataLineCountsTheFilesOfAFolderOrAGlob) {
  const fs::path data = tt::temp_dir("data_line_files_" + std::to_string(getpid()));
  const fs::path corpus = tt::assets_dir() / "datasets" / "nlp-corpus-validation" / "val.jsonl";
  fs::create_directories(data / "shards");
  fs::copy_file(corpus, data / "shards" / "a.jsonl");
  fs::copy_file(corpus, data / "shards" / "b.jsonl");
  fs::copy_file(corpus, data / "shards" / ".hidden.jsonl");
  std::ofstream(data / "shards" / "notes.yaml") << "not: data\n";
  for (const auto& [path, said] :
       {std::pair{data / "shards", " (2 files; 1 file of other types passed over: notes.yaml), tokenizer "},
        std::pair{data / "shards" / "a*.jsonl", " (1 file), tokenizer "},
        std::pair{data / "shard?",
                  " (2 files; 1 file of other types passed over: shards/notes.yaml), tokenizer "},
        std::pair{data / "shards" / "a.jsonl", ", tokenizer "}}) {
    std::string out;
    ASSERT_EQ(
        tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                            tt::cli_args(tt::tiny_job(data / "run", {{"training.dataset_path", path.string()},
                                                                     {"training.steps", "0"},
                                                                     {"validation.enable", "false"}})) +
                            " 2>&1",
                        &out),
        0)
        << out;
    EXPECT_NE(out.find("data: " + path.string() + said), std::string::npos) << out;
  }
  std::string out;
  ASSERT_EQ(tt::run_command(
                tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                    tt::cli_args(tt::tiny_job(data / "run_held_out",
                                              {{"training.steps", "0"},
                                               {"validation.enable", "true"},
                                               {"validation.steps", "1"},
                                               {"validation.dataset_path", (data / "shards").string()}})) +
                    " 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("from " + (data / "shards").string() +
                     " (2 files; 1 file of other types passed over: notes.yaml)"),
            std::string::npos)
      << out;
}

// A dump folder inside a dataset folder would make the run's own files (metrics.jsonl, checkpoints)
// its training data: refused at start-up, naming the key, for the training and the held-out data.
TEST(Validation, ADumpFolderInsideADatasetFolderIsRefused) {
  const fs::path data = tt::temp_dir("dump_inside_data_" + std::to_string(getpid()));
  {
    std::ofstream f(data / "docs.jsonl");
    for (int i = 0; i < 50; ++i) f << "{\"text\": \"document " << i << " of the dataset\"}\n";
  }
  std::string out;
  for (const char* key : {"training.dataset_path", "validation.dataset_path"}) {
    EXPECT_NE(tt::run_command(
                  tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                      tt::cli_args(tt::tiny_job(data / "outputs" / "run",
                                                {{"validation.enable", "true"}, {key, data.string()}})) +
                      " 2>&1",
                  &out),
              0);
    EXPECT_NE(out.find(std::string(key) + ": the folder '" + data.string() + "' holds job.dump_folder"),
              std::string::npos)
        << out;
    EXPECT_FALSE(fs::exists(data / "outputs" / "run" / "metrics.jsonl")) << key;
  }
}

TEST(Validation, RunLogsItAndLeavesTrainingUnchanged) {
  const tt::Overrides common = {{"training.steps", "4"},       {"training.deterministic", "true"},
                                {"metrics.log_freq", "3"},     {"metrics.enable_tensorboard", "true"},
                                {"validation.freq", "2"},      {"validation.steps", "2"}};
  auto with = [&](const fs::path& dump, const char* enable) {
    tt::Overrides o = common;
    o.push_back({"validation.enable", enable});
    std::string out;
    int rc = tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                                 tt::cli_args(tt::tiny_job(dump, o)),
                             &out);
    EXPECT_EQ(rc, 0) << out;
    return out;
  };
  const fs::path on = tt::temp_dir("validation_on"), off = tt::temp_dir("validation_off");
  const std::string out = with(on, "true");
  with(off, "false");
  EXPECT_EQ(out.find("fewer than validation.steps"), std::string::npos) << out;

  // A held-out set shorter than validation.steps batches: every evaluation uses what there is, and
  // the run says so once (a figure over fewer batches is not comparable with one over more).
  const fs::path small = tt::temp_dir("validation_short") / "held_out.jsonl";
  {
    std::ifstream full(val_file());
    std::ofstream part(small);
    std::string line;
    for (int i = 0; i < 40 && std::getline(full, line); ++i) part << line << "\n";
  }
  tt::Overrides short_set = common;
  short_set.insert(short_set.end(), {{"validation.enable", "true"},
                                     {"validation.steps", "50"},
                                     {"validation.dataset_path", small.string()}});
  std::string short_out;
  ASSERT_EQ(
      tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                          tt::cli_args(tt::tiny_job(tt::temp_dir("validation_short_run"), short_set)),
                      &short_out),
      0)
      << short_out;
  const std::string note = "validation: '" + small.string() + "' holds ";
  const size_t at = short_out.find(note);
  ASSERT_NE(at, std::string::npos) << short_out;
  EXPECT_EQ(short_out.find(note, at + 1), std::string::npos) << "said more than once";
  EXPECT_NE(short_out.find("batches, fewer than validation.steps = 50: every evaluation uses those", at),
            std::string::npos)
      << short_out;

  // "validate step: N  loss: X  perplexity: Y" at step 1 and every freq steps, nowhere else.
  std::map<int64_t, std::string> printed;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("validate step: ", 0) == 0) printed[std::stoll(line.substr(15))] = line;
  ASSERT_EQ(printed.size(), 3u) << out;
  for (int64_t step : {1, 2, 4}) ASSERT_TRUE(printed.count(step)) << out;

  // metrics.jsonl: every validated step is logged (step 2 only because it validated) and carries
  // val_loss (what the line printed) and val_perplexity; the training figures equal those of the
  // same run without validation.
  std::map<int64_t, nlohmann::json> plain;
  for (auto& r : read_metrics(off)) {
    EXPECT_FALSE(r.contains("val_loss"));
    plain[r.at("step").get<int64_t>()] = r;
  }
  EXPECT_EQ(plain.size(), 3u);  // steps 1, 3 (log_freq) and 4 (the last)
  std::set<int64_t> with_val, logged;
  for (const auto& r : read_metrics(on)) {
    const int64_t step = r.at("step");
    logged.insert(step);
    if (plain.count(step)) {
      EXPECT_EQ(r.at("loss").get<double>(), plain[step].at("loss").get<double>()) << "step " << step;
      EXPECT_EQ(r.at("grad_norm").get<double>(), plain[step].at("grad_norm").get<double>()) << "step " << step;
    }
    if (!r.contains("val_loss")) continue;
    with_val.insert(step);
    const double loss = r.at("val_loss"), ppl = r.at("val_perplexity");
    EXPECT_DOUBLE_EQ(ppl, std::exp(loss));
    char expect[128];
    std::snprintf(expect, sizeof expect, "validate step: %ld  loss: %.4f  perplexity: %.2f", long(step), loss, ppl);
    EXPECT_EQ(printed[step], expect);
  }
  EXPECT_EQ(with_val, (std::set<int64_t>{1, 2, 4}));
  EXPECT_EQ(logged, (std::set<int64_t>{1, 2, 3, 4}));

  // TensorBoard holds the scalar under the same tag.
  fs::path tb;
  for (auto& e : fs::directory_iterator(on / "tb")) tb = e.path();
  std::ifstream f(tb, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("val_loss"), std::string::npos) << tb;
}
