// titan plan --config FILE.toml [--k=v ...] [--mesh dp_shard=N[,dp_replicate=R]]
//            [--memory-per-rank 96GiB] [--gemm-tflops X] [--link-gbps G] [--link-latency-us L]
//
// The scale planner: one rank's memory on a data-parallel mesh from the meta device (exact, by
// category), whether it fits, the largest local batch that would, and a step-time and tokens/s
// estimate (FLOPs / a measured GEMM rate + the mesh's collectives on a ring bandwidth / latency
// model). docs/planning.md explains each figure and how close it came to real runs.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/host_memory.h"
#include "titan/core/parse.h"
#include "titan/dist/meta_world.h"
#include "titan/dist/parallel_plan.h"
#include "titan/io/atomic_file.h"
#include "titan/io/path_guard.h"
#include "titan/models/qwen3/size_check.h"
#include "titan/train/job_config.h"
#include "titan/train/log.h"
#include "titan/train/scale_planner.h"
#include "titan/train/startup.h"
#include "titan/train/step_profile.h"

namespace titan::cli {
namespace {

// Shared memory between the ranks of one host (Open MPI's single-copy transport): the defaults
// of --link-gbps and --link-latency-us. docs/planning.md compares them with measured runs.
constexpr double kSharedMemoryGbps = 40, kSharedMemoryLatencyUs = 2;

struct Mesh {
  int64_t dp_replicate = 1, dp_shard = 1;
  std::string text;             // as given
  std::set<std::string> given;  // its entries ("dp_shard", "dp_replicate"); one left out is 1
};

// "dp_shard=4", "dp_shard=4,dp_replicate=2", "dp_replicate=8".
Mesh parse_mesh(const std::string& text) {
  Mesh m;
  TITAN_CHECK(text.empty() || text.back() != ',', "titan plan: --mesh '", text,
              "' ends with a comma (expected dp_shard=N[,dp_replicate=R])");
  std::istringstream in(text);
  std::set<std::string> seen;
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    TITAN_CHECK(key == "dp_shard" || key == "dp_replicate", "titan plan: --mesh '", text, "': unknown entry '",
                item, "' (expected dp_shard=N[,dp_replicate=R])");
    TITAN_CHECK(seen.insert(key).second, "titan plan: --mesh '", text, "': ", key, " is given twice");
    const int64_t v = parse_int(value).value_or(0);
    TITAN_CHECK(v >= 1 && v <= (1 << 20), "titan plan: --mesh '", text, "': ", key,
                " must be a whole number of ranks in 1 .. 1048576, got '", value, "'");
    (key == "dp_shard" ? m.dp_shard : m.dp_replicate) = v;
  }
  TITAN_CHECK(!text.empty(), "titan plan: --mesh is empty (expected dp_shard=N[,dp_replicate=R])");
  m.text = text;
  m.given = std::move(seen);
  return m;
}

// A finite number flag above zero; `zero_allowed` admits 0 as well (a link latency of 0 prices the
// bandwidth alone: the bound a what-if plan asks for).
double number_flag(const JobArgs& job, const std::string& flag, double def, bool zero_allowed = false) {
  auto it = job.own.find(flag);
  if (it == job.own.end()) return def;
  const std::optional<double> v = parse_number(it->second);
  TITAN_CHECK(v && std::isfinite(*v) && (*v > 0 || (zero_allowed && *v == 0)), "titan plan: --", flag,
              " must be a ", zero_allowed ? "finite number >= 0" : "positive finite number", ", got '",
              it->second, "'");
  return *v;
}

int plan_main(int argc, char** argv) {
  const JobArgs job = parse_job_args(
      "plan", argc, argv, {"mesh", "memory-per-rank", "gemm-tflops", "link-gbps", "link-latency-us", "json"});
  if (job.help) {
    std::printf(
        "usage: titan plan --config FILE.toml [--section.key=value ...] [--mesh "
        "dp_shard=N[,dp_replicate=R]]\n"
        "                  [--memory-per-rank 96GiB] [--gemm-tflops X] [--link-gbps G] [--link-latency-us "
        "L]\n"
        "                  [--json FILE]\n"
        "One rank's memory on the data-parallel mesh (default: the config's [parallelism], one rank when "
        "its\n"
        "shard degree is -1) from a training step run on the meta device, whether it fits --memory-per-rank\n"
        "(default: this machine's MemAvailable, or the GPU's memory), the largest local batch that fits, "
        "and\n"
        "a step time: FLOPs / a GEMM rate measured here (--gemm-tflops overrides it) + the collectives on a\n"
        "ring of --link-gbps (default %g) and --link-latency-us (default %g: shared memory on one host).\n"
        "--json: also write the figures to FILE (bytes, seconds, FLOPs; docs/planning.md lists the "
        "fields).\n",
        kSharedMemoryGbps, kSharedMemoryLatencyUs);
    return 0;
  }
  // Everything the user typed is checked before anything runs.
  std::optional<Mesh> mesh;
  if (auto it = job.own.find("mesh"); it != job.own.end()) mesh = parse_mesh(it->second);
  std::optional<int64_t> memory_flag;
  if (auto it = job.own.find("memory-per-rank"); it != job.own.end()) {
    memory_flag = train::parse_byte_size(it->second);
    TITAN_CHECK(memory_flag.has_value(), "titan plan: --memory-per-rank '", it->second,
                "' is not a positive size (e.g. 96GiB, 80GB, 512MiB, or bytes)");
    // A bare number this small is a unit left out ("96" meant 96GiB), not a rank's memory.
    const bool bare = !std::isalpha(static_cast<unsigned char>(it->second.back()));
    TITAN_CHECK(!bare || *memory_flag >= (int64_t(1) << 20), "titan plan: --memory-per-rank '", it->second,
                "' is ", *memory_flag,
                " bytes, too few for a rank's memory: give a unit (KiB, MiB, GiB, TiB or KB, MB, GB, TB, "
                "e.g. 96GiB); a bare number is bytes from 1048576 (1 MiB) on");
  }
  std::optional<std::string> json_path;
  if (auto it = job.own.find("json"); it != job.own.end()) {  // checked before the profile, not after it
    io::check_output_file(it->second, {job.config}, "titan plan --json");
    json_path = it->second;
  }
  const double gemm_tflops_flag = number_flag(job, "gemm-tflops", 0);
  const train::Link link{number_flag(job, "link-gbps", kSharedMemoryGbps),
                         number_flag(job, "link-latency-us", kSharedMemoryLatencyUs, /*zero_allowed=*/true)};

  train::JobConfig cfg = train::load_job_config(job.config, job.overrides);
  if (mesh) {
    // --mesh sets both degrees: the same keys on the command line as well would leave one of the
    // two silently unused.
    for (const auto& [key, value] : job.overrides)
      TITAN_CHECK(key != "parallelism.data_parallel_replicate_degree" &&
                      key != "parallelism.data_parallel_shard_degree",
                  "titan plan: --mesh and --", key, "=", value,
                  " both set the mesh; give one (--mesh dp_shard=N[,dp_replicate=R] sets both degrees)");
    cfg.parallelism.data_parallel_replicate_degree = mesh->dp_replicate;
    cfg.parallelism.data_parallel_shard_degree = mesh->dp_shard;
    // The errors that name a degree say --mesh set it, not the config or the default (a degree the
    // mesh leaves out is 1 by --mesh too).
    for (const auto& [key, entry] : {std::pair{"parallelism.data_parallel_replicate_degree", "dp_replicate"},
                                     std::pair{"parallelism.data_parallel_shard_degree", "dp_shard"}})
      cfg.set_at[key] = "--mesh " + mesh->text +
                        (mesh->given.count(entry) ? "" : std::string(" (no ") + entry + " entry: 1)");
  } else if (cfg.parallelism.data_parallel_shard_degree == -1) {
    cfg.parallelism.data_parallel_shard_degree = 1;  // "the ranks left": none without a launcher
  }
  const int64_t replicate = cfg.parallelism.data_parallel_replicate_degree;
  const int64_t shard = cfg.parallelism.data_parallel_shard_degree;
  TITAN_CHECK(replicate >= 1 && shard >= 1 && replicate <= (1 << 20) && shard <= (1 << 20) / replicate,
              "titan plan: the mesh parallelism.data_parallel_replicate_degree ", replicate,
              " x parallelism.data_parallel_shard_degree ", shard, " must be 1 .. 1048576 ranks");
  cfg.validate(int(replicate * shard));
  const auto [args, shape] =
      train::planned_step(cfg, replicate, shard, cfg.parallelism.expert_parallel_degree);
  const std::string kernels_note = train::check_kernels_for_planning(cfg);  // a rule train refuses fails here
  const std::unique_ptr<dist::Communicator> world = dist::meta_world_communicator(int(replicate * shard));
  const dist::ParallelPlan plan(*world, replicate, shard, cfg.parallelism.expert_parallel_degree);
  // The device is needed only for what the flags do not give (its memory, its GEMM rate): a GPU job
  // is planned on a machine without its GPU by giving both.
  Device device = Device::Meta;
  if (!memory_flag || gemm_tflops_flag <= 0) {
    try {
      device = train::resolve_device(cfg);
    } catch (const Error& e) {
      if (cfg.job.device != "cuda") throw;
      const std::string missing =
          std::string(memory_flag ? "" : "--memory-per-rank (the GPU's memory, e.g. 80GiB)") +
          (memory_flag || gemm_tflops_flag > 0 ? "" : " and ") +
          (gemm_tflops_flag > 0 ? "" : "--gemm-tflops (its GEMM rate in TFLOP/s)");
      TITAN_FAIL("titan plan: ", e.what(), "; to plan a cuda job on a machine without its GPU, give ",
                 missing, ", which the plan would otherwise read from the GPU");
    }
  }

  // ---- memory
  train::check_step_bounds(args, shape);
  const train::StepProfile p = train::profile_training_step(args, shape, Device::Meta);
  std::printf("job: %s (%s, %ld parameters)\n", job.config.c_str(), args.is_moe() ? "Qwen3-MoE" : "Qwen3 dense",
              long(args.num_params()));
  std::printf("mesh: %s\n", plan.describe().c_str());
  std::printf("data: %s\n", error_for_the_user(train::data_line_for_planning(cfg)).c_str());
  for (const auto& note : cfg.notes) std::printf("config: %s\n", note.c_str());  // as titan train says them
  if (const std::string note = cfg.left_out_note(false); !note.empty())          // (a fresh run's)
    std::printf("config: %s\n", note.c_str());
  if (const std::string note = train::reduce_dtype_note(cfg, plan); !note.empty())
    std::printf("config: %s\n", note.c_str());
  if (!kernels_note.empty()) std::printf("config: %s\n", kernels_note.c_str());
  std::printf(
      "one rank's training step on the meta device (%.0f ms): batch %ld x seq %ld x %ld micro-batches, %s "
      "compute, activation checkpointing %s\n",
      p.seconds * 1e3, long(shape.local_batch), long(shape.seq_len), long(shape.grad_accumulation),
      std::string(dtype_name(shape.compute)).c_str(), shape.checkpointing.describe().c_str());
  std::printf(
      "memory per rank:\n  weights (f32)        %s\n  gradients (f32)      %s\n  AdamW state (f32)    %s\n",
      memory_text(p.weights).c_str(), memory_text(p.grads).c_str(), memory_text(p.optimizer).c_str());
  std::printf("%s", compute_weights_line(p).c_str());
  if (p.other) std::printf("  other state          %s\n", memory_text(p.other).c_str());
  std::printf("  activations + temps  %s\n  peak per rank        %s\n", memory_text(p.activations()).c_str(),
              memory_text(p.peak).c_str());
  std::printf("%s", after_step_peak_line(p, shape).c_str());
  if (p.checkpoint_copy)
    std::printf(
        "  checkpoint copy      %s (checkpoint.async_mode: the weights and moments a save in the background "
        "writes from, held beside the steps after it)\n",
        memory_text(p.checkpoint_copy).c_str());
  // Every device's tensors live in its caching allocator's segments (split and reused): a job must
  // fit what the allocator reserves, not only the tensors' peak.
  const int64_t need = train::memory_need(p);
  std::printf("  reserved             %s (the caching allocator's segments after the step, unbounded)\n",
              memory_text(std::max(p.reserved, p.peak)).c_str());
  const std::string need_name = std::string("reserved") + (p.checkpoint_copy ? " + checkpoint copy" : "");

  const int64_t available = memory_flag ? *memory_flag : train::available_memory_per_rank(device);
  const std::string available_source =
      memory_flag ? "--memory-per-rank"
      : device == Device::CPU
          ? host_available_name() + "; ranks sharing a host share it: pass --memory-per-rank"
          : "the " + std::string(device_name(device)) + " device's memory";
  // Past the bound the GPU's allocator returns its cached segments and retries: the step is
  // replayed within it (train::fit_step) before it is judged too large. A CPU process returns its
  // cache when the host has less available than a new segment, which ranks sharing a host reach
  // together, not at each one's share: a cpu job is judged by its unbounded need.
  const bool cuda_job = cfg.job.device == "cuda";
  const train::MemoryFit fit = need <= available ? train::MemoryFit{true, need, false, need}
                                                 : train::fit_step(args, shape, available, cuda_job);
  const bool fits = fit.fits;
  if (fit.by_returning_cache)
    std::printf(
        "fits: yes, %s %s of %s per rank (%s), the caching allocator returning its free segments when "
        "the GPU refuses one, as CUDA's does (it would reserve %s unbounded)\n",
        need_name.c_str(), memory_text(fit.need).c_str(), memory_text(available).c_str(),
        available_source.c_str(), memory_text(need).c_str());
  else if (fits)
    std::printf("fits: yes, %s %s of %s per rank (%s)\n", need_name.c_str(), memory_text(need).c_str(),
                memory_text(available).c_str(), available_source.c_str());
  else if (cuda_job)
    std::printf(
        "fits: NO, %s %s > %s per rank (%s), and within it some request is refused even after the caching "
        "allocator returned its free segments\n",
        need_name.c_str(), memory_text(need).c_str(), memory_text(available).c_str(),
        available_source.c_str());
  else
    std::printf("fits: NO, %s %s > %s per rank (%s)\n", need_name.c_str(), memory_text(need).c_str(),
                memory_text(available).c_str(), available_source.c_str());
  // The figures are titan's tensors (its allocator's segments). A CPU process also holds its code,
  // the tokenizer, the data loader and the math libraries' buffers, and while the final export is
  // written its file's mapped pages: measured beyond the reservation on the runs in docs/planning.md.
  if (!cuda_job)
    std::printf(
        "  (titan's tensors: the process adds its code, tokenizer, data loader and library buffers, "
        "0.05-0.3 GiB in the CPU runs measured (docs/planning.md), and the final export's file pages "
        "while it is written; leave that beside the reservation)\n");
  const train::BatchSearch batch = train::largest_fitting_batch(args, shape, available, cuda_job);
  if (batch.largest == 0)
    std::printf("largest local batch that fits: none (batch 1 needs %s)\n",
                memory_text(batch.next_need).c_str());
  else if (batch.at_bound)
    std::printf(
        "largest local batch that fits: at least %ld (the search's bound: %ld x seq %ld = 2^31 tokens; "
        "%s %s)\n",
        long(batch.largest), long(batch.bound), long(shape.seq_len), need_name.c_str(),
        memory_text(batch.largest_need).c_str());
  else
    std::printf("largest local batch that fits: %ld (%s %s; batch %ld needs %s), %d meta steps\n",
                long(batch.largest), need_name.c_str(), memory_text(batch.largest_need).c_str(),
                long(batch.largest + 1), memory_text(batch.next_need).c_str(), batch.profiles);
  // Each rank was given all of MemAvailable: what holds when every rank of the mesh shares this host
  // (a one-host mpirun) is said too, or the batch above would be the mesh's size times too large.
  nlohmann::json shared_host;  // the same, when the mesh's ranks share this host
  if (!memory_flag && device == Device::CPU && plan.world_size() > 1) {
    const int ranks = plan.world_size();
    const int64_t share = available / ranks;
    const train::BatchSearch shared = train::largest_fitting_batch(args, shape, share, cuda_job);
    const std::string largest = shared.largest == 0 ? std::string("none")
                                : shared.at_bound   ? "at least " + std::to_string(shared.largest)
                                                    : std::to_string(shared.largest);
    std::printf(
        "if the %d ranks share this host: %d x %s = %s of %s: %s; the largest local batch that fits "
        "each rank's %s: %s\n",
        ranks, ranks, memory_text(need).c_str(), memory_text(need * ranks).c_str(),
        memory_text(available).c_str(), need * ranks <= available ? "fits" : "does NOT fit",
        memory_text(share).c_str(), largest.c_str());
    shared_host = {{"ranks", ranks},
                   {"bytes_per_rank", share},
                   {"fits", need * ranks <= available},
                   {"largest_local_batch", shared.largest},
                   {"largest_at_search_bound", shared.at_bound}};
  }

  // ---- time
  train::GemmRate gemm{gemm_tflops_flag, "--gemm-tflops"};
  if (gemm_tflops_flag <= 0)
    gemm = train::measure_model_gemm_rate(device, shape.compute, args,
                                          std::min<int64_t>(shape.local_batch * shape.seq_len, 4096), 0.3);
  const double compute_s = p.flops / (gemm.tflops * 1e12);
  const train::CommEstimate comm = train::estimate_communication(p, shape, link);
  // The sharding overlaps collectives with compute (prefetched gathers, reduce-scatters during the
  // backward): the step lies between full overlap and none.
  const double step_fast = std::max(compute_s, comm.seconds), step_slow = compute_s + comm.seconds;
  std::printf("step time estimate (every rank in parallel):\n");
  std::printf("  GEMM rate       %.3g TFLOP/s (%s)\n", gemm.tflops, gemm.source.c_str());
  if (plan.world_size() > 1 && device == Device::CPU && gemm_tflops_flag <= 0)
    std::printf(
        "                  (with the cores this process may use: ranks sharing a host split its cores, so "
        "run "
        "plan with one rank's OMP_NUM_THREADS)\n");
  std::printf("  compute         %.4g FLOPs per rank / %.3g TFLOP/s = %.4g s\n", p.flops, gemm.tflops, compute_s);
  if (plan.world_size() > 1)
    std::printf("  communication   %.4g MB sent per rank (%s; Psi = %ld padded parameters in %ld blocks) at %g "
                "Gbit/s + %g us per ring step = %.4g s\n",
                comm.bytes / 1e6, comm.formula.c_str(), long(p.block_elements), long(p.blocks), link.gbps,
                link.latency_us, comm.seconds);
  else
    std::printf("  communication   none (one rank)\n");
  std::printf("  step            %.4g s (communication hidden) .. %.4g s (not hidden)\n", step_fast, step_slow);
  const double rank_tokens = double(shape.local_batch * shape.seq_len * shape.grad_accumulation);
  std::printf(
      "tokens/s estimate: %.4g per rank, %.4g for the job (%s); %.4g per rank if communication "
      "is not hidden\n",
      rank_tokens / step_fast, rank_tokens * double(plan.dp_size()) / step_fast,
      train::counted(plan.dp_size(), "rank").c_str(), rank_tokens / step_slow);
  if (json_path) {
    // The printed figures, as numbers a launcher script reads (bytes, seconds, FLOPs, tokens/s).
    nlohmann::json j = {
        {"config", job.config},
        {"model", {{"kind", args.is_moe() ? "Qwen3-MoE" : "Qwen3 dense"}, {"parameters", args.num_params()}}},
        {"mesh",
         {{"description", plan.describe()},
          {"ranks", plan.world_size()},
          {"dp_replicate", replicate},
          {"dp_shard", shard},
          {"expert_parallel", cfg.parallelism.expert_parallel_degree}}},
        {"step",
         {{"local_batch", shape.local_batch},
          {"seq_len", shape.seq_len},
          {"micro_batches", shape.grad_accumulation},
          {"compute_dtype", std::string(dtype_name(shape.compute))},
          {"activation_checkpointing", shape.checkpointing.describe()}}},
        {"memory_per_rank",
         {{"weights", p.weights},
          {"gradients", p.grads},
          {"optimizer", p.optimizer},
          {"compute_weights", p.compute_weights},
          {"other", p.other},
          {"activations", p.activations()},
          {"peak", p.peak},
          {"after_step_peak", p.after_step_peak},
          {"checkpoint_copy", p.checkpoint_copy},
          {"reserved", std::max(p.reserved, p.peak)},
          {"need", need},
          {"fit_need", fit.need}}},
        {"available_per_rank", {{"bytes", available}, {"source", available_source}}},
        {"fits", fits},
        {"fits_by_returning_cache", fit.by_returning_cache},
        {"largest_local_batch",
         {{"value", batch.largest},
          {"at_search_bound", batch.at_bound},
          {"need", batch.largest_need},
          {"next_need", batch.next_need}}},
        {"time",
         {{"flops_per_rank", p.flops},
          {"gemm_tflops", gemm.tflops},
          {"gemm_source", gemm.source},
          {"compute_seconds", compute_s},
          {"comm_bytes_per_rank", plan.world_size() > 1 ? comm.bytes : 0.0},
          {"comm_seconds", plan.world_size() > 1 ? comm.seconds : 0.0},
          {"link_gbps", link.gbps},
          {"link_latency_us", link.latency_us},
          {"step_seconds_hidden", step_fast},
          {"step_seconds_not_hidden", step_slow}}},
        {"tokens_per_second",
         {{"per_rank", rank_tokens / step_fast},
          {"job", rank_tokens * double(plan.dp_size()) / step_fast},
          {"per_rank_not_hidden", rank_tokens / step_slow}}}};
    if (!shared_host.is_null()) j["shared_host"] = shared_host;
    io::write_file_atomic(*json_path, j.dump(2) + "\n");
  }
  // A script can branch on the answer (`titan plan ... && sbatch ...`): 3 (not 1, an error) when the job
  // does not fit; the figures print either way.
  return fits ? 0 : 3;
}

TITAN_COMMAND("plan", "will a job fit a data-parallel mesh: memory per rank (meta device), largest batch, step time",
              plan_main);

}  // namespace
}  // namespace titan::cli
