#pragma once
// The start of a training job: everything that can fail on bad input (model architecture,
// tokenizer, dataset, weights to start from) is resolved and checked here, before any compute,
// and the start-up report says what the run is about to do.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/parallel_plan.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config.h"

namespace titan::train {

struct ResolvedJob {
  qwen3::ModelArgs args;
  Device device = Device::CPU;  // job.device, checked to be usable
  DType compute_dtype = DType::F32;
  // The dtype sharded gradients are reduced in: bf16 when training.mixed_precision_reduce asks for
  // it and the blocks are sharded (parallelism.data_parallel_shard_degree > 1), else f32.
  DType reduce_dtype = DType::F32;
  // training.activation_grad_dtype = "bfloat16" (checked to go with bf16 compute).
  bool bf16_activation_grads = false;
  std::filesystem::path tokenizer_path;        // folder holding tokenizer.json
  std::vector<std::filesystem::path> dataset;  // the file, folder or glob the loader reads
  std::vector<std::filesystem::path> dataset_files;  // what `dataset` lists to at start-up
  // Where the weights of a fresh (not resumed) run come from: a Hugging Face folder, else a
  // committed native checkpoint (checkpoint.initial_load_path), else the seeded initialisation.
  std::filesystem::path initial_hf;
  std::filesystem::path initial_native;
  int64_t local_batch_size = 0, seq_len = 0;
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step
};

// The architecture the config describes (flavor or config.json, with [model] overrides), validated.
qwen3::ModelArgs resolve_model_args(const JobConfig& config);
// job.device, checked to be present in this build and on this machine.
Device resolve_device(const JobConfig& config);
// The compute dtype: training.mixed_precision_param (bf16 on every CPU; where it has no bf16
// arithmetic the GEMMs widen to f32, and start_up_report says so).
DType resolve_compute_dtype(const JobConfig& config);

// The dtype of the sharded gradients' reductions (ResolvedJob::reduce_dtype) on a mesh with
// `dp_shard` shards.
DType resolve_reduce_dtype(const JobConfig& config, int64_t dp_shard);
// The start-up note of a reduce dtype the mesh leaves without effect (bfloat16 with whole blocks:
// DDP, one process); empty otherwise. `titan train` and `titan plan` say it.
std::string reduce_dtype_note(const JobConfig& config, const dist::ParallelPlan& plan);

// Micro-batches per optimizer step: training.global_batch_size over local_batch_size x the
// data-parallel ranks (1 when global_batch_size = -1).
int64_t accumulation_steps(const JobConfig& config, int64_t dp_size);

// The token id that ends every document when packing (training.document_separator, resolved
// against the run's tokenizer); errors name the key.
int32_t document_separator(const TrainingSection& training, const data::Tokenizer& tokenizer);

// The loader's best_fit_window (data::LoaderConfig): training.pack_window under
// training.pack_strategy = "best_fit", else 0 (next-fit).
int64_t best_fit_window(const TrainingSection& training);

// How the run's documents are cut and separated, for the start-up `data:` line: the separator token
// (id and text) and, when the dataset's `files` include plain text, how training.text_split cuts them.
std::string document_description(const JobConfig& config, const data::Tokenizer& tokenizer,
                                 const std::vector<std::filesystem::path>& files);

// A dataset path as the start-up lines name it (the training `data:` line, the validation line): the
// path alone for one file; for a folder or a glob, how many data files it named and, when
// `name_passed_over` (the printing rank: it walks the folders again), the files of other types the
// listing passed over, the first three by name.
std::string describe_dataset_path(const std::filesystem::path& given, size_t files, bool name_passed_over);

// A note for ranks that share a host's cores (more ranks x cores each than the host has): each rank's
// MFU peak counts its cores whole, so MFU and tokens/s read low; "" when they fit.
std::string cpu_oversubscription_note(int ranks_on_host, int cores_per_rank, int host_cores);

// What `titan train` would check of the data side before compute (tokenizer, dataset, document
// separator), for `titan plan` and `titan info --config`: an error for a value train refuses, or a
// line naming the tokenizer and the separator. A tokenizer or dataset missing on this machine (a job
// planned for another) is not an error: the line says it was not checked.
std::string data_line_for_planning(const JobConfig& config);

// What `titan train` would check of the job's [kernels] table before compute (every rule's op,
// variant, dtype and modules against the model and job.device's kernels; not whether the variant
// can run on this machine), for `titan plan` and `titan info --config`: an error for a rule train
// refuses. Returns a note when job.device's kernels cannot be listed here (a build without its
// backend), empty otherwise.
std::string check_kernels_for_planning(const JobConfig& config);

// An error naming `key` when the folder `data` holds job.dump_folder: the run's metrics, checkpoints
// and exports would be read as data.
void check_run_writes_outside(const JobConfig& config, const std::filesystem::path& data,
                              const std::string& key);

// The model, device, tokenizer, dataset and batch shape, checked; errors name the key and the path.
// Reads no run folder: it runs before the run's folders are locked.
ResolvedJob resolve_job(const JobConfig& config, const dist::ParallelPlan& plan);

// The job's tokenizer (job.tokenizer_path), loaded; its ids must fit the model's vocabulary (the error
// names the keys that chose each).
data::Tokenizer load_tokenizer(const JobConfig& config, const ResolvedJob& job);

// Where a fresh (not resumed) run's weights come from (job.initial_hf / initial_native), checked:
// the folder exists, holds weights, and its model config describes the run's model. Errors name
// `source`: what set checkpoint.initial_load_path (the key itself, or e.g. titan eval's --checkpoint).
void resolve_initial_weights(const JobConfig& config, ResolvedJob& job,
                             const std::string& source = "checkpoint.initial_load_path");

// Prints the run's description, model, ranks, device, data (with the document separator), kernels and the
// config in effect, and installs the [kernels] substitutions (each checked against the model's modules
// first).
// `command` opens the report ("titan train", "titan eval").
void start_up_report(const JobConfig& config, const ResolvedJob& job, const dist::ParallelPlan& plan,
                     const data::Tokenizer& tokenizer, const char* command = "titan train");

}  // namespace titan::train
