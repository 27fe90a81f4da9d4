#pragma once
// The job config of `titan train`: a TOML file with torchtitan's sections, plus
// `--section.key=value` overrides from the command line. Unknown sections/keys and
// invalid values are errors naming the key (and suggesting the near miss). torchtitan's own
// job files are accepted as they are: every torchtitan key is either one of titan's, an older
// spelling of one, a key whose value cannot change the result (a note says it is ignored), or
// an error naming the key and why (train/torchtitan_keys.h).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "titan/kernels/substitution.h"

namespace titan::dist {
struct CommTimeout;
}

namespace titan::train {

// The bound on batch sizes (local and global, in sequences) and seq_len: a step's tokens then fit in
// 64 bits with room for the products the planner forms.
inline constexpr int64_t kMaxBatchOrSeq = int64_t(1) << 31;

struct JobSection {
  std::string dump_folder = "./outputs";
  std::string description = "";
  std::string device = "cpu";  // cpu | cuda: where parameters, gradients, optimizer state and activations live
};

struct ModelSection {
  std::string name = "qwen3";      // "qwen3" (native flavor) | "hf" (config.json in hf_assets_path)
  std::string flavor = "debugmodel";
  std::string hf_assets_path = "";  // tokenizer files (+ config.json and weights for the hf route)
  std::string init = "huggingface";  // huggingface | torchtitan
  // "causal": attention spans each whole packed row. "block_causal" (torchtitan's): a query attends
  // only to its own document, the tokens since the last training.document_separator.
  std::string attn_mask_type = "causal";
  std::map<std::string, std::string> overrides;  // ModelArgs fields: n_layers, num_experts, top_k, ...
};

struct TrainingSection {
  std::string dataset = "nlp-corpus";  // built-in dataset name
  std::string dataset_path = "";       // user data: file or folder (JSON, JSONL, text)
  std::string text_field = "text";
  // Non-empty: the dataset's records are conversations for supervised fine-tuning, each an object
  // whose field of this name holds its messages ("messages"), rendered with Qwen3's chat template;
  // the loss trains on the assistant turns only, one conversation per row, or several with
  // pack_conversations (data/chat.h, docs/data.md).
  std::string chat_field = "";
  // Conversations: each row holds as many whole ones as fit, in order, then padding (needs
  // model.attn_mask_type = "block_causal", so that each attends to itself only).
  bool pack_conversations = false;
  // How conversations are packed: "next_fit" (each row takes the next ones while they fit, in dataset
  // order) or "best_fit" (best-fit decreasing over pack_window conversations read together).
  std::string pack_strategy = "next_fit";
  int64_t pack_window = 256;
  // Plain-text files (.txt, .md, ...): "paragraph" (documents separated by blank lines), "line"
  // (one document per line) or "file" (one document per file).
  std::string text_split = "paragraph";
  // The token that ends every document when packing: "" (the tokenizer's document separator:
  // <|endoftext|> when the vocabulary has it, else its eos_token), "eos_token" (the tokenizer
  // config's, as torchtitan does), or any text that is exactly one token ("<|im_end|>").
  std::string document_separator = "";
  int64_t local_batch_size = 2;
  int64_t global_batch_size = -1;  // -1: local_batch_size * data-parallel ranks (no accumulation)
  int64_t seq_len = 512;
  int64_t steps = 10;
  double max_norm = 1.0;
  std::string mixed_precision_param = "bfloat16";  // bfloat16 | float32: the compute dtype
  // float32 | bfloat16: the dtype sharded gradients are reduced in (FSDP2's reduce_dtype; as in
  // torchtitan, it takes effect only when parallelism.data_parallel_shard_degree > 1)
  std::string mixed_precision_reduce = "float32";
  // float32 | bfloat16: the dtype of the gradients of bf16 activations (a bf16 autograd's, as torch
  // autocast's; ops/activation_grads.h). Parameters' gradients are f32 either way.
  std::string activation_grad_dtype = "float32";
  int64_t seed = 42;
  bool deterministic = false;
  std::string load_balance = "aux_loss";  // aux_loss | expert_bias (MoE)
  double load_balance_coeff = 1e-3;       // expert_bias update step
};

struct OptimizerSection {
  std::string name = "AdamW";  // AdamW (decoupled weight decay) | Adam (weight decay as an L2 term)
  double lr = 8e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

struct LrSchedulerSection {
  int64_t warmup_steps = 2;
  double decay_ratio = -1;  // -1: decay over all steps after warmup
  std::string decay_type = "linear";  // linear | cosine | sqrt
  double min_lr_factor = 0.0;
  int64_t total_steps = -1;  // steps the schedule spans; -1: training.steps (torchtitan's early-stop runs)
};

struct CheckpointSection {
  bool enable = false;
  std::string folder = "checkpoint";  // under dump_folder
  int64_t interval = 500;
  // What `interval` counts: "steps" (a save after every interval-th step) or "seconds" (a save at the
  // first step boundary at least interval seconds after the run's start or the previous save
  // returned to training; the ranks agree on the step, each by its own clock: torchtitan's early
  // interval_type).
  std::string interval_type = "steps";
  bool enable_first_step_checkpoint = false;  // also save after step 1 (a quick check that saving works)
  int64_t keep_latest_k = 3;
  // Resume from this committed step instead of the newest (-1); the later checkpoints are set
  // aside (renamed step-N.rolled-back), never deleted.
  int64_t load_step = -1;
  std::string initial_load_path = "";
  // false: initial_load_path (a native step-N folder) is a whole training state to go on from (step,
  // moments, schedule, data position), torchtitan's fork of a run into this job's folder.
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool last_save_in_hf = false;
  std::string export_dtype = "float32";  // float32 | bfloat16 (float16: accepted only without an export)
  bool restart_data_stream = false;      // on resume, start the data from its beginning (e.g. a new dataset)
  // torchtitan's parts of a checkpoint a resume leaves fresh: "optimizer" (AdamW's moments and step
  // count start over), "lr_scheduler" (the schedule starts over at the resumed step), "dataloader"
  // (applied as restart_data_stream = true). "model" and "train_state" are errors.
  std::vector<std::string> exclude_from_loading;
  // Write the starting weights as the checkpoint of step 0 and exit without training: every later run
  // of the job starts from them (a step-0 checkpoint resumes as weights only, as in torchtitan).
  bool create_seed_checkpoint = false;
  // Resume (or load) as usual but save no checkpoint: not every `interval` steps, not at the end, not
  // at a stop by signal (verification and debugging runs that must leave the folder as it is).
  bool load_only = false;
  // "disabled": a save returns once its files are written and committed. "async": it returns once
  // this rank's weights and moments are copied aside in host memory; a background thread writes the
  // files while training goes on, and the checkpoint is committed at the first step boundary where
  // every rank's writer has finished (Checkpointer). "async_with_pinned_mem" (torchtitan's) is
  // applied as "async": a GPU job's state always crosses through pinned staging buffers.
  std::string async_mode = "disabled";
  bool async() const { return async_mode != "disabled"; }
  bool excludes(std::string_view part) const;
};

struct ActivationCheckpointSection {
  std::string mode = "none";  // none | selective | full
  // selective: recompute one layer in n ("2", torchtitan's default; "0", as in torchtitan, every
  // layer); "op" (torchtitan's per-op policy, which titan does not have) recomputes one layer in
  // 2, with a note.
  std::string selective_ac_option = "2";
};

// The n of "one layer in n" that activation_checkpoint.selective_ac_option asks for ("op" -> 2,
// "0" -> 1); anything else is an error naming the key (after `where`, the config's name).
int64_t selective_ac_every(const std::string& option, const std::string& where = "");

// The largest local batch, at most `local`, whose product with `dp` data-parallel ranks divides a
// global batch of `global` sequences (the rest is gradient accumulation); 0 when `dp` does not
// divide it (no local batch can: the mesh cannot take that global batch).
int64_t local_batch_for_global(int64_t global, int64_t local, int64_t dp);

struct MetricsSection {
  int64_t log_freq = 1;
  bool enable_tensorboard = false;
  std::string save_tb_folder = "tb";  // the TensorBoard events' folder, under job.dump_folder (torchtitan's)
  // Every rank writes its own metrics (metrics-rank<r>.jsonl; TensorBoard under <tb>/rank_<r>), not
  // only the logging rank (train/metrics.h, MetricsOutputs)
  bool save_for_all_ranks = false;
  double peak_tflops = 0;  // 0: the device's own (the CPU's measured clock x FLOP/cycle; a GPU's service)
};

// torchtitan's [validation]: the loss on held-out documents, without gradients, at step 1 and every
// `freq` steps (train/validation.h).
struct ValidationSection {
  bool enable = false;
  std::string dataset = "nlp-corpus-validation";  // built-in held-out set (documents not in nlp-corpus)
  std::string dataset_path = "";  // user data: file or folder (JSON, JSONL, text); never the training data
  int64_t freq = 10;
  int64_t steps = -1;             // batches per evaluation; -1: the whole held-out set
  int64_t local_batch_size = -1;  // -1: training.local_batch_size
  int64_t seq_len = -1;           // -1: training.seq_len
};

struct ParallelismSection {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;  // -1: all remaining ranks
  int64_t tensor_parallel_degree = 1;
  int64_t expert_parallel_degree = 1;
  // FSDP: free a layer's gathered parameters after its forward ("default", "always") or keep them
  // until its backward ("never": ZeRO-2, one gather per step instead of two).
  std::string fsdp_reshard_after_forward = "default";
  // data_parallel_shard_degree with -1 resolved: the ranks left after replicate.
  int64_t shard_degree(int world_size) const;
};

// torchtitan's [profiling]: the op-level timeline of the last profiler_active steps of every
// profile_freq steps, written as Chrome traces (train/profiler.h).
struct ProfilingSection {
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_traces";  // under job.dump_folder
  int64_t profile_freq = 10;
  int64_t profiler_active = 1;
};

struct CommSection {
  double timeout_seconds = 300;  // a collective waiting longer is an error (a rank died or hangs)
  // torchtitan's pair, each -1 for timeout_seconds: the bound during start-up (MPI_Init included),
  // the checkpoint load and the first step, and the bound during every step after it.
  double init_timeout_seconds = -1;
  double train_timeout_seconds = -1;
  // The bound in effect in each phase, with the key that set it (the timeout error names it).
  dist::CommTimeout init_timeout() const;
  dist::CommTimeout train_timeout() const;
};

struct JobConfig {
  JobSection job;
  ModelSection model;
  TrainingSection training;
  OptimizerSection optimizer;
  LrSchedulerSection lr_scheduler;
  CheckpointSection checkpoint;
  ActivationCheckpointSection activation_checkpoint;
  MetricsSection metrics;
  ValidationSection validation;
  ParallelismSection parallelism;
  CommSection comm;
  ProfilingSection profiling;
  std::vector<kernels::Substitution> kernels;
  // One line per torchtitan key accepted without effect or under an older name, for the start-up log.
  std::vector<std::string> notes;
  // Keys the file leaves out whose titan default differs from torchtitan's and shapes the run (its
  // length, batch, warmup, seed, the checkpoints kept): a torchtitan job file would otherwise train
  // another run than torchtitan does without a word. left_out_note() says them in one line.
  struct LeftOutDefault {
    std::string key, ours, theirs;
    bool initial_weights_only;  // the seed: moot where the weights come from a checkpoint
  };
  std::vector<LeftOutDefault> left_out_defaults;
  // Where each key given a value got it ("file:line:col", "command line", or a command's flag that
  // sets it, "--mesh dp_shard=4" of titan plan): a validation error names the place to change.
  std::map<std::string, std::string> set_at;
  // Where `key` got its value as a message says it: "set at job.toml:4:1", "set on the command line",
  // "set by --mesh dp_shard=4"; "" when nothing set it.
  std::string where_set(const std::string& key) const;

  // Every key and its value in effect, "section.key = value" lines (the start-up log).
  std::string describe() const;
  // The start-up line naming left_out_defaults, "" when none is left; a run that resumes leaves the
  // seed out (its weights are the checkpoint's).
  std::string left_out_note(bool resumes) const;
  // Cross-field validation (world size known): errors name the key, and where it was set.
  void validate(int world_size) const;

 private:
  void validate_values(int world_size) const;
};

// Parses `path` (TOML) then applies `overrides` ("--section.key=value" or "--section.key value"
// already split into key, value pairs, keys without the leading dashes).
JobConfig load_job_config(const std::string& path, const std::vector<std::pair<std::string, std::string>>& overrides);
JobConfig parse_job_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::pair<std::string, std::string>>& overrides);
// Every key titan's job config has ("training.steps", "model.dim", ...), for suggestions.
std::vector<std::string> job_config_keys();
// Whether `key` takes true or false: one of titan's boolean keys, or a boolean key of torchtitan's
// job config (its aliases and the ones titan accepts with a note): a command line may give it bare
// (`--checkpoint.enable`), as torchtitan's does.
bool is_boolean_key(const std::string& key);
// Fails as an unknown key of the command line fails ("unknown config key ...; did you mean ..."),
// unless `key` is one of titan's or torchtitan's keys, or a [kernels] entry.
void check_known_key(const std::string& key);

}  // namespace titan::train
