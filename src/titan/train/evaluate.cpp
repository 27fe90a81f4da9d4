#include "titan/train/evaluate.h"

#include <optional>

#include "titan/core/check.h"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/parallel_plan.h"
#include "titan/io/json_error.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpointer.h"
#include "titan/train/log.h"
#include "titan/train/startup.h"
#include "titan/train/train_state.h"

namespace titan::train {

namespace fs = std::filesystem;

namespace {

// The job's config notes that hold for titan eval, which reads [validation] whether or not training
// would (validation.enable), and says itself which weights it evaluates: the notes about
// validation.enable = false and about the starting weights (those the seed has no effect on
// included) speak of training only (as the
// training defaults left out do: JobConfig::left_out_note, which eval does not print).
std::vector<std::string> notes_for_eval(const std::vector<std::string>& notes) {
  std::vector<std::string> kept;
  for (const std::string& note : notes) {
    const bool starting_weights = note.rfind("checkpoint.initial_load_path = ", 0) == 0 ||
                                  note.rfind("checkpoint.initial_load_in_hf = ", 0) == 0 ||
                                  note.find("the job starts from loaded weights") != std::string::npos;
    const bool validation_off = note.rfind("validation.", 0) == 0 &&
                                note.find("no effect, validation.enable = false") != std::string::npos;
    if (!starting_weights && !validation_off) kept.push_back(note);
  }
  return kept;
}

}  // namespace

EvalSummary evaluate(const JobConfig& cfg, dist::Communicator& world, const fs::path& checkpoint) {
  cfg.validate(world.size());
  dist::check_same_on_every_rank(world, cfg.describe(), "configs",
                                 "every rank must get the same config file and overrides");
  const dist::ParallelPlan plan(world, cfg.parallelism.data_parallel_replicate_degree,
                                cfg.parallelism.shard_degree(world.size()),
                                cfg.parallelism.expert_parallel_degree);
  ConsoleOfRank console(plan.is_logging_rank());
  // The weights are loaded as a fresh run loads its initial weights (the same checks: the folder is
  // a committed checkpoint or holds Hugging Face weights, of this job's model).
  JobConfig source = cfg;
  std::string weights;
  ResolvedJob job;
  std::optional<data::Tokenizer> tokenizer;
  std::optional<Validator> validator;
  std::optional<int64_t> run_rows;  // a native checkpoint's run: the rows of each held-out batch it scored
  std::optional<int64_t> run_seq_len;  // and their length
  // Agreed, as training's start-up: an error every rank finds alike (a missing folder, a model that
  // is not the job's) is said once, and one rank's own stops every rank with its reason.
  plan.agree_on_success([&] {
    // What errors about the weights name: what chose them.
    std::string origin = checkpoint.empty() ? "checkpoint.initial_load_path" : "titan eval --checkpoint";
    fs::path folder = checkpoint;
    if (folder.empty() && cfg.checkpoint.enable) {
      // titan train's own choice of the step it would resume, with its refusals (a damaged newest
      // step, a load_step not committed) and its words about the folders it passes over.
      const Checkpointer own(cfg, plan);
      own.say_ignored_step_dirs(/*trains=*/false, /*saves=*/false);
      if (const std::optional<int64_t> step = own.resume_step()) {
        folder = own.step_dir(*step);
        origin = cfg.checkpoint.load_step == -1 ? "the job's newest checkpoint" : "checkpoint.load_step";
      }
    }
    if (folder.empty() && !cfg.checkpoint.enable) {
      // The job's folder holds what it trained, which checkpointing off leaves unread: scoring the
      // starting weights in its place would report an untrained model's loss as the run's (titan train
      // refuses the same folder).
      const fs::path own = checkpoint_folder_of(cfg);
      const std::vector<int64_t> committed = CheckpointManager(own, 0).committed_steps();
      if (!committed.empty()) {
        TITAN_FAIL("checkpoint.enable = false, but '", own.string(), "' holds committed checkpoints (steps ",
                   listed_steps(committed),
                   "): titan eval would score the job's starting weights, not what it trained; set "
                   "checkpoint.enable = true to score step ",
                   committed.back(),
                   " (the newest), --checkpoint to score a step or folder of your choice, or give the job "
                   "another job.dump_folder to score its starting weights");
      }
    }
    if (!folder.empty()) {
      TITAN_CHECK(fs::is_directory(folder), "titan eval: '", folder.string(), "' is not a folder");
      source.checkpoint.initial_load_path = folder.string();
      // A Hugging Face folder has a config.json and no manifest; a native checkpoint the reverse.
      source.checkpoint.initial_load_in_hf = !fs::exists(folder / "manifest.json");
      weights = folder.string() + (source.checkpoint.initial_load_in_hf ? " (Hugging Face weights)" : "");
      if (const nlohmann::json ts = source.checkpoint.initial_load_in_hf
                                        ? nlohmann::json()
                                        : io::read_json_file(folder / "train_state.json", "train_state.json");
          ts.is_object()) {
        if (ts.contains("validation_rows") && ts["validation_rows"].is_number_integer())
          run_rows = ts["validation_rows"].get<int64_t>();
        if (ts.contains("validation_seq_len") && ts["validation_seq_len"].is_number_integer())
          run_seq_len = ts["validation_seq_len"].get<int64_t>();
      }
    } else {
      weights = !cfg.checkpoint.initial_load_path.empty() ? cfg.checkpoint.initial_load_path
                : cfg.checkpoint.initial_load_in_hf
                    ? cfg.model.hf_assets_path
                    : "initialized from seed " + std::to_string(cfg.training.seed);
    }
    job = resolve_job(source, plan);
    resolve_initial_weights(source, job, origin);
    tokenizer.emplace(load_tokenizer(source, job));
    validator.emplace(cfg, *tokenizer, job.dataset_files, plan);
  });
  // Each rank chose its weights from its own view of the folders (the job's newest checkpoint): they
  // must be the same, or the ranks would score different models as one.
  dist::check_same_on_every_rank(world, weights, "weights to evaluate",
                                 "every rank must see the same checkpoint folder: on several hosts, one "
                                 "shared folder, or --checkpoint");
  JobConfig shown = cfg;
  shown.notes = notes_for_eval(cfg.notes);
  start_up_report(shown, job, plan, *tokenizer, "titan eval");
  say("eval: %s", validator->describe_data().c_str());  // the held-out data (the data line is training's)
  // No gradients and no optimizer moments: the weights' memory alone (a 4B model's eval needs its
  // 16 GB of f32 weights, where its training state needs 64 GB).
  TrainState state(cfg, job, *tokenizer, plan, qwen3::Purpose::Inference);
  start_weights(state, source, job, plan);
  state.distribute();
  // The run's val_loss scored validation.steps global batches of its rows: other rows per batch (another
  // number of data-parallel ranks, another validation.local_batch_size) score other tokens in as many
  // batches (the whole held-out set, steps = -1, does not).
  const int64_t rows = validator->rank_rows() * plan.dp_size();
  if (run_rows && *run_rows != rows && validator->steps() != -1)
    say("note: the checkpoint's run validated %ld sequences per held-out batch, this eval %ld (%ld per rank "
        "on "
        "%s), so its validation.steps = %ld batches hold other tokens than the val_loss that run logged%s",
        long(*run_rows), long(rows), long(validator->rank_rows()),
        counted(plan.dp_size(), "data-parallel rank").c_str(), long(validator->steps()),
        *run_rows % plan.dp_size() == 0 ? (": validation.local_batch_size = " +
                                           std::to_string(*run_rows / plan.dp_size()) + " scores those")
                                              .c_str()
                                        : "");
  // Rows of another length score each token with another context (and cut conversations elsewhere),
  // whatever validation.steps.
  if (run_seq_len && *run_seq_len != validator->seq_len())
    say("note: the checkpoint's run validated rows of %ld tokens, this eval rows of %ld, so its tokens are "
        "scored with other contexts than the val_loss that run logged: validation.seq_len = %ld scores those",
        long(*run_seq_len), long(validator->seq_len()), long(*run_seq_len));
  EvalSummary summary{validator->run(state.model, state.sharding), weights};
  say("eval: loss %.4f  perplexity %.2f over %s (%s); weights: %s", summary.result.loss,
      summary.result.perplexity, counted(summary.result.tokens, "token").c_str(),
      counted(summary.result.batches, "batch", "batches").c_str(), weights.c_str());
  if (const ValidationResult& r = summary.result; r.cut_conversations > 0)
    say("eval: %ld of the %ld held-out conversations %s longer than seq_len + 1 = %ld tokens and cut "
        "there: %s not scored",
        long(r.cut_conversations), long(r.conversations), r.cut_conversations == 1 ? "was" : "were",
        long(validator->seq_len() + 1), counted(r.cut_trained_tokens, "answer token").c_str());
  return summary;
}

}  // namespace titan::train
