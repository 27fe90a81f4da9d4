#include "titan/train/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/data_identity.h"
#include "titan/data/dataset.h"
#include "titan/train/log.h"
#include "titan/train/startup.h"
#include "titan/train/train_step.h"

namespace titan::train {

int64_t validation_seq_len(const JobConfig& cfg) {
  return cfg.validation.seq_len == -1 ? cfg.training.seq_len : cfg.validation.seq_len;
}

int64_t validation_rank_rows(const JobConfig& cfg) {
  return cfg.validation.local_batch_size == -1 ? cfg.training.local_batch_size
                                               : cfg.validation.local_batch_size;
}

namespace fs = std::filesystem;

namespace {

fs::path resolve_held_out(const ValidationSection& v) {
  // A file, a folder or a glob, as training.dataset_path: the listing below (list_dataset_files)
  // expands a glob and reports a missing path or an empty match under the key.
  if (!v.dataset_path.empty()) return v.dataset_path;
  try {
    return data::builtin_dataset_path(v.dataset, "validation");
  } catch (const Error& e) {
    TITAN_FAIL("validation.dataset: ", e.what());
  }
}

fs::path canonical_or_self(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c;
}

}  // namespace

Validator::Validator(const JobConfig& cfg, const data::Tokenizer& tokenizer,
                     const std::vector<fs::path>& training_files, const dist::ParallelPlan& plan)
    : tokenizer_(tokenizer),
      plan_(plan),
      freq_(cfg.validation.freq),
      steps_(cfg.validation.steps),
      block_causal_(cfg.model.attn_mask_type == "block_causal") {
  const ValidationSection& v = cfg.validation;
  const char* key = v.dataset_path.empty() ? "validation.dataset" : "validation.dataset_path";
  // The built-in held-out sets are text; a fine-tuning job's held-out loss is one over conversations.
  TITAN_CHECK(
      cfg.training.chat_field.empty() || !v.dataset_path.empty(), "validation.dataset = \"", v.dataset,
      "\" is text, but training.chat_field = \"", cfg.training.chat_field,
      "\" trains on conversations: set validation.dataset_path to held-out conversations (read with the "
      "same chat_field); or, for titan train, validation.enable = false");
  loader_config_.paths = {resolve_held_out(v)};
  check_run_writes_outside(cfg, loader_config_.paths[0], key);
  loader_config_.text_field = cfg.training.text_field;
  loader_config_.chat_field = cfg.training.chat_field;
  loader_config_.pack_conversations = cfg.training.pack_conversations;
  loader_config_.best_fit_window = best_fit_window(cfg.training);
  loader_config_.text_split = cfg.training.text_split;
  loader_config_.eos_id = document_separator(cfg.training, tokenizer);
  loader_config_.seq_len = validation_seq_len(cfg);
  rank_rows_ = validation_rank_rows(cfg);
  loader_config_.local_batch_size = rank_rows_ * plan.dp_size();
  loader_config_.infinite = false;  // one pass: the held-out set is never repeated within an evaluation
  // ... over all of it: the batch it ends in is scored too (its missing rows padding), so that the
  // loss of a small set does not depend on the batch size.
  loader_config_.pad_last_batch = true;

  // A held-out loss on documents the model trains on measures memorisation, not generalisation.
  std::vector<fs::path> held_out;
  try {
    held_out = data::list_dataset_files(loader_config_.paths);
  } catch (const Error& e) {
    TITAN_FAIL(key, ": ", e.what());
  }
  TITAN_CHECK(!held_out.empty(), key, ": '", loader_config_.paths[0].string(), "' holds no dataset file");
  files_ = held_out.size();
  // One row at least, found before any step rather than at the first evaluation (step 1, after
  // the model is built), under the key that named the data.
  try {
    TITAN_CHECK(!data::TokenLoader(loader_config_, tokenizer).next().empty(), "'",
                loader_config_.paths[0].string(), "' holds ", too_little());
  } catch (const Error& e) {
    TITAN_FAIL(key, ": ", e.what());
  }
  // The same file under another name (a hard link) or the same bytes (a copy) is training data too:
  // compared by inode, then, for files of one size, by the fingerprint a checkpoint records of a
  // dataset file (its size, first and last MiB).
  std::multimap<uintmax_t, fs::path> training_by_size;
  for (const fs::path& t : training_files) training_by_size.emplace(fs::file_size(t), t);
  auto fingerprint = [](const fs::path& f) { return data::dataset_identity({f})[0].at("fingerprint"); };
  for (const fs::path& h : held_out) {
    for (const fs::path& t : training_files) {
      std::error_code ec;
      TITAN_CHECK(canonical_or_self(h) != canonical_or_self(t) && !fs::equivalent(h, t, ec), key, ": '",
                  h.string(), "' is also training data; the validation stream must be held out of training");
    }
    const auto [first, last] = training_by_size.equal_range(fs::file_size(h));
    for (auto it = first; it != last; ++it)
      TITAN_CHECK(fingerprint(h) != fingerprint(it->second), key, ": '", h.string(),
                  "' holds the same bytes as the training file '", it->second.string(),
                  "'; the validation stream must be held out of training");
  }
}

ValidationResult Validator::run(qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding) const {
  autograd::NoGradGuard no_grad;
  // Under FSDP the model's hooks gather each block as the training forward does (not the whole
  // model at once: a model that fits only sharded evaluates as it trains).
  // A fresh loader: every evaluation reads the same batches from the start of the held-out stream.
  data::TokenLoader loader(loader_config_, tokenizer_);
  const int64_t B = rank_rows_, S = loader_config_.seq_len;
  // This rank's rows of a global batch (on the host).
  auto my_rows = [&](const std::vector<int64_t>& global) {
    const auto first = global.begin() + plan_.dp_rank() * B * S;
    return Tensor::from_vector(std::vector<int64_t>(first, first + B * S), {B, S});
  };
  double ce_sum = 0;  // cross-entropy summed over target tokens
  int64_t tokens = 0, batches = 0;
  ValidationResult r;
  for (; steps_ == -1 || batches < steps_; ++batches) {
    data::Batch batch = loader.next();
    if (batch.empty()) break;
    r.conversations += batch.conversations;  // every rank reads the global batch: the job's counts
    r.cut_conversations += batch.cut_conversations;
    r.cut_trained_tokens += batch.cut_trained_tokens;
    qwen3::RowContents rows = row_contents(batch, plan_.dp_rank() * B, B, block_causal_);
    // The last batch's rows past the held-out data are padding (pad_last_batch); a rank holding
    // only such rows still runs the forward (its gathers and the experts' exchanges are collectives),
    // as rows of whole length whose labels are all ignored: no target, nothing added below.
    if (std::all_of(rows.lengths.begin(), rows.lengths.end(), [](int64_t n) { return n == 0; }))
      rows.lengths.clear();
    qwen3::LossOutput out = model.forward_loss(my_rows(batch.inputs).to(model.device()),
                                               my_rows(batch.labels).to(model.device()), 1, 1, rows);
    if (out.num_targets > 0)
      ce_sum += out.ce_loss.item() * double(out.num_targets);  // (padding rows only: none)
    tokens += out.num_targets;
  }
  TITAN_CHECK(batches > 0, "validation: '", loader_config_.paths[0].string(), "' holds ", too_little());
  // Asked for more batches than the held-out set holds: every evaluation uses them all; said once, as
  // a figure over fewer batches than the config says is not comparable with one over more.
  if (steps_ != -1 && batches < steps_ && !said_short_)
    say("validation: '%s' holds %s, fewer than validation.steps = %ld: every evaluation uses those",
        loader_config_.paths[0].string().c_str(), counted(batches, "batch", "batches").c_str(), long(steps_));
  said_short_ = true;
  // The mean over every rank's rows: the sum of the cross-entropies over the sum of the target counts.
  sharding.end_forward_only();
  double sums[2] = {ce_sum, double(tokens)};
  plan_.all_reduce_sum(sums);
  TITAN_CHECK(
      sums[1] > 0, "validation: '", loader_config_.paths[0].string(), "': no token of its first ",
      counted(batches, "batch", "batches"),
      " is one to score (every conversation's answer lies past seq_len + 1 tokens, where rows are cut)");
  r.loss = sums[0] / sums[1];
  r.perplexity = std::exp(r.loss);
  r.batches = batches;
  r.tokens = int64_t(sums[1]);
  return r;
}

std::string Validator::too_little() const {
  return loader_config_.chat_field.empty()
             ? "fewer tokens than one row of seq_len " + std::to_string(loader_config_.seq_len) + " (+1)"
             : "no conversation to begin a row";
}

std::string Validator::describe_data() const {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s of %ld x %ld tokens per rank (global %ld x %ld) from ",
                steps_ == -1 ? "all batches" : counted(steps_, "batch", "batches").c_str(), long(rank_rows_),
                long(loader_config_.seq_len), long(loader_config_.local_batch_size),
                long(loader_config_.seq_len));
  return buf + describe_dataset_path(loader_config_.paths[0], files_, console_output());
}

std::string Validator::describe() const {
  return "validation: at step 1 and every " + (freq_ == 1 ? std::string("step") : counted(freq_, "step")) +
         ", " + describe_data();
}

}  // namespace titan::train
