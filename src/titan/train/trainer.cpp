#include "titan/train/trainer.h"

#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "titan/autograd/autograd.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/data/data_identity.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/parallel_plan.h"
#include "titan/io/atomic_file.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/path_guard.h"
#include "titan/train/checkpointer.h"
#include "titan/train/log.h"
#include "titan/train/metrics.h"
#include "titan/train/mfu_peak.h"
#include "titan/train/profiler.h"
#include "titan/train/run_lock.h"
#include "titan/train/startup.h"
#include "titan/train/step_profile.h"
#include "titan/train/train_state.h"
#include "titan/train/train_step.h"
#include "titan/train/validation.h"
#include "titan/train/versions.h"

namespace titan::train {

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_announce_stop{false};  // this rank prints the run's console lines

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a stop signal";
  }
}

// Stop requests a run ignores once it has one: a hang-up (one dropped ssh session sends two: bash
// passes its own on to its jobs, then the kernel hangs up the terminal's foreground group when bash
// exits) and SIGUSR1 (the polite request of schedulers and launchers, which may repeat it).
bool repeats_are_ignored(int sig) {
  return sig == SIGHUP || sig == SIGUSR1;
}

// Open MPI's launcher, when a rank was started by one: a SIGINT or SIGTERM it sends is its answer
// to a Ctrl-C or a SIGTERM of its own, and SIGKILL follows. 0: none (set before the handlers are).
std::atomic<int> g_launcher_pid{0};
// What the acknowledgement says of such a signal, prepared outside the handler (which may not format).
std::array<char, 512> g_launcher_stop_line{};

// The first SIGINT/SIGTERM/SIGHUP/SIGUSR1 asks for a clean stop; the handler then steps aside so
// that a second SIGINT/SIGTERM (an impatient Ctrl-C during the final save) terminates the process
// the default way, while a second SIGHUP or SIGUSR1 is ignored and must not kill the save the first
// one asked for. It says so at once, whatever the run is doing (a long step, the final save or
// export): write(2) is async-signal-safe, stdio is not.
extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
  g_stop_signal.store(sig);
  std::signal(sig, repeats_are_ignored(sig) ? SIG_IGN : SIG_DFL);
  if (!g_announce_stop.load()) return;
  console_clear_unfinished_line_from_signal_handler();  // a progress line, drawn without a newline
  // mpirun's SIGTERM promises no clean stop: Open MPI kills the ranks a second later.
  const int launcher = g_launcher_pid.load();
  if (launcher != 0 && info != nullptr && info->si_pid == launcher && sig == SIGTERM) {
    console_write_from_signal_handler(g_launcher_stop_line.data());
    return;
  }
  char line[192] = "received ";
  std::strncat(line, stop_signal_name(sig), sizeof line - std::strlen(line) - 1);
  std::strncat(
      line, ": stopping cleanly once this step is done (or the final save and export, when the steps are); ",
      sizeof line - std::strlen(line) - 1);
  std::strncat(line,
               sig == SIGHUP    ? "further hang-ups are ignored\n"
               : sig == SIGUSR1 ? "further SIGUSR1s are ignored\n"
                                : "a second one ends the process now\n",
               sizeof line - std::strlen(line) - 1);
  console_write_from_signal_handler(line);
}

// While alive, SIGINT/SIGTERM ask for a clean stop (a checkpoint at the next step boundary), and so
// do SIGHUP (the terminal of an ssh session that dropped), unless the run was started ignoring it
// (nohup), and SIGUSR1: what Open MPI's mpirun forwards to every rank at once (a Ctrl-C or SIGTERM
// to mpirun reaches the ranks as SIGTERM followed by SIGKILL after odls_base_sigkill_timeout, 1 s
// by default: too soon for a save) and what Slurm's `--signal=USR1@<seconds>` sends before a time
// limit. SIGPIPE is ignored: a console whose pipe reader exited (`| tee` after a Ctrl-C) is
// no reason to lose the run, and its lines go to standard error (console_write).
//
// No thread that computes may take these signals. oneDNN's JIT f32 GEMM kernels (oneDNN 2.x, as
// Debian ships it; fixed upstream by oneDNN PR #4855, issue #4845) point rsp into a heap workspace
// while they run: a signal handled on that thread pushes its frame onto the heap and corrupts the
// allocator's metadata ("corrupted size vs. prev_size" in a later free()). So the signals are
// blocked in this thread and in the OpenMP workers (every thread started from here on, OpenMP's
// and the data loader's, inherits the mask) and are taken by a thread that only waits; threads
// that existed before (MPI's progress threads) may take them too, and do not compute.
class StopSignals {
  static constexpr std::array kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

 public:
  // `launcher`: the pid of the mpirun that started this rank, if one did.
  explicit StopSignals(std::optional<int> launcher) {
    g_stop_signal = 0;
    g_announce_stop = console_output();
    g_launcher_pid = launcher.value_or(0);
    if (launcher) {
      // Open MPI's SIGKILL follows after odls_base_sigkill_timeout seconds (1 by default; an
      // --mca setting reaches the ranks as this variable).
      const char* timeout = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
      std::snprintf(
          g_launcher_stop_line.data(), g_launcher_stop_line.size(),
          "received SIGTERM from mpirun (what it sends on a Ctrl-C, a SIGTERM of its own, or when another "
          "rank has died): Open MPI kills the ranks %s s later (odls_base_sigkill_timeout): a step or save "
          "not done by then is lost, and the job resumes from the last checkpoint committed; to stop the "
          "job yourself, `kill -USR1 %d` stops it with a checkpoint\n",
          timeout && *timeout ? timeout : "1", *launcher);
    }
    sigemptyset(&stop_set_);
    for (const int sig : kStopSignals) sigaddset(&stop_set_, sig);
    pthread_sigmask(SIG_BLOCK, &stop_set_, &previous_mask_);
    mask_openmp_threads(SIG_BLOCK, &stop_set_);
    for (const int sig : kStopSignals) {
      struct sigaction& before = previous_[sig];
      sigaction(sig, nullptr, &before);
      if (sig == SIGHUP && before.sa_handler == SIG_IGN) continue;  // nohup: the user wants it ignored
      struct sigaction handler {};
      handler.sa_sigaction = on_stop_signal;  // with the sender's pid (siginfo_t::si_pid)
      // SA_RESTART as std::signal sets it: a thread that existed before (MPI's, NCCL's) may take the
      // signal, and its blocking reads and writes go on rather than fail with EINTR.
      handler.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&handler.sa_mask);
      sigaction(sig, &handler, nullptr);
    }
    sigaction(SIGPIPE, nullptr, &previous_[SIGPIPE]);
    std::signal(SIGPIPE, SIG_IGN);
    receiver_ = std::thread([this] {
      pthread_sigmask(SIG_UNBLOCK, &stop_set_, nullptr);
      std::unique_lock lock(mu_);
      done_cv_.wait(lock, [this] { return done_; });
      pthread_sigmask(SIG_BLOCK, &stop_set_, nullptr);
    });
  }
  ~StopSignals() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    receiver_.join();
    // A signal that came meanwhile is pending: it is delivered here, to the handler, when the
    // mask is restored; only then do the previous handlers return.
    mask_openmp_threads(SIG_SETMASK, &previous_mask_);
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
    for (const int sig : kStopSignals) sigaction(sig, &previous_[sig], nullptr);
    sigaction(SIGPIPE, &previous_[SIGPIPE], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int received() const { return g_stop_signal.load(); }

 private:
  // pthread_sigmask(how, set) on every thread of OpenMP's pool: a parallel region as wide as the
  // pool (not narrowed by dynamic adjustment).
  static void mask_openmp_threads(int how, const sigset_t* set) {
    const int dynamic = omp_get_dynamic();
    omp_set_dynamic(0);
#pragma omp parallel num_threads(omp_get_max_threads())
    pthread_sigmask(how, set, nullptr);
    omp_set_dynamic(dynamic);
  }
  sigset_t stop_set_, previous_mask_;
  std::array<struct sigaction, NSIG> previous_{};  // by signal number
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread receiver_;
};

// run_info.json's "runs": where each stretch of the run's steps ran, so `titan report` can say a
// run trained on 2 ranks up to step 4 and on one process after. A resume on other ranks or another
// device adds a stretch; a resume from an earlier checkpoint drops those of the steps it retrains.
// `device` is shown; `key` says whether two runs ran on the same kind of device (a CPU's summary
// carries its measured clock, which another start may measure a little differently).
nlohmann::json run_stretches(const std::filesystem::path& run_info, int64_t resumed_step,
                             const std::string& ranks, const std::string& device, const std::string& key) {
  nlohmann::json before = nlohmann::json::array();
  if (resumed_step > 0) {
    std::ifstream in(run_info);
    // An unreadable record (another program's file, a torn write of old) is replaced, not trusted.
    const nlohmann::json old = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
    if (old.is_object() && old.contains("runs") && old["runs"].is_array())
      before = old["runs"];
    else if (old.is_object() && old.contains("ranks") && old["ranks"].is_string())  // older runs: one stretch
      before.push_back(
          {{"from_step", 1},
           {"ranks", old["ranks"]},
           {"device", old.contains("device") && old["device"].is_string() ? old["device"] : ""}});
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : before)
    if (r.is_object() && r.contains("from_step") && r["from_step"].is_number_integer() &&
        r["from_step"].get<int64_t>() >= 1 && r["from_step"].get<int64_t>() <= resumed_step &&
        r.value("ranks", nlohmann::json()).is_string() && r.value("device", nlohmann::json()).is_string())
      runs.push_back(r);
  const bool same_device =
      !runs.empty() && (runs.back().contains("device_key") ? runs.back()["device_key"] == key
                                                           : runs.back()["device"] == device);
  if (runs.empty() || runs.back()["ranks"] != ranks || !same_device)
    runs.push_back(
        {{"from_step", resumed_step + 1}, {"ranks", ranks}, {"device", device}, {"device_key", key}});
  return runs;
}

// The kind of device a run used, without what a start measures (a CPU's clock, its peak).
std::string device_key(Device device) {
  if (device != Device::CPU) return device_services(device).description();
  const cpu::CpuInfo& c = cpu::cpu_info();
  return (c.brand.empty() ? c.vendor : c.brand) + ", " + std::to_string(c.cores) + " cores, " + c.isa();
}

}  // namespace

// What every rank of a job must start from alike, by content (each file's name, size and
// fingerprint; a copy on each host may lie in another folder): the checkpoint it resumes or forks
// (its manifest holds the checksum of every file) or the weights it loads, and its tokenizer. Each
// rank picks and reads these on its own: a host whose view of a shared folder lags (another newest
// step) or whose copy of a weights folder is another revision would train another model under
// the same step, and FSDP would gather layers of two models.
namespace {
// run_info.json's config notes: the config's, and the left-out defaults' line where there is one.
std::vector<std::string> notes_with(std::vector<std::string> notes, const std::string& left_out_note) {
  if (!left_out_note.empty()) notes.push_back(left_out_note);
  return notes;
}

std::string start_identity(const Checkpointer& checkpointer, const ResolvedJob& job) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::string text = "weights: random\n";
  try {  // a file this rank cannot read is a difference the ranks agree on, not a rank's lone error
    if (const std::optional<fs::path> dir = checkpointer.resume_dir()) {
      text = "checkpoint: " + dir->string() + "\n";
      files = {*dir / "manifest.json"};
    } else if (!job.initial_native.empty()) {
      text = "weights: " + job.initial_native.string() + "\n";
      files = {job.initial_native / "manifest.json"};
    } else if (!job.initial_hf.empty()) {
      text = "weights: " + job.initial_hf.string() + "\n";
      // The files the weights load from (model.safetensors, or the index's shards), and their config.
      for (const fs::path& f : {job.initial_hf / "config.json", job.initial_hf / io::kHfIndexFile})
        if (fs::exists(f)) files.push_back(f);
      const io::HfCheckpoint weights = io::HfCheckpoint::open(job.initial_hf);  // held: files() is its member
      for (const io::SafetensorsFile& f : weights.files()) files.push_back(f.path());
    }
    // The tokenizer, and its config (special tokens, chat template, decoding).
    for (const fs::path& f : data::tokenizer_files(job.tokenizer_path)) files.push_back(f);
    // By name and content: a copy on each host may lie in another folder.
    for (nlohmann::json file : data::dataset_identity(files)) {
      file["path"] = fs::path(file["path"].get<std::string>()).filename().string();
      text += file.dump() + "\n";
    }
  } catch (const std::exception& e) {
    text += std::string("unreadable here: ") + e.what() + "\n";
  }
  return text;
}
}  // namespace

TrainSummary run_training(const JobConfig& cfg) {
  auto world = dist::single_process_communicator();
  return run_training(cfg, *world);
}

TrainSummary run_training(const JobConfig& cfg, dist::Communicator& world) {
  const auto t_start = std::chrono::steady_clock::now();
  // The run records into a tape of its own: a step that fails mid-forward or mid-backward (out of
  // memory, a bad batch) leaves nodes holding this run's model, which a later run in the same
  // process (titan check runs several) must not inherit.
  autograd::Tape tape;
  const autograd::TapeScope record_into(&tape);
  cfg.validate(world.size());
  // torchtitan's two bounds: the start-up one until the first step of this run has completed, with
  // its evaluation and checkpoint (the checkpoint load, the first gathers and the kernels' first
  // calls take longest), then the step one. The groups the plan splits share the world's.
  world.set_timeout(cfg.comm.init_timeout());
  // Before the plan splits the world into its groups, which ranks of other meshes would not join.
  dist::check_same_on_every_rank(world, cfg.describe(), "configs",
                                 "every rank must get the same config file and overrides");
  const dist::ParallelPlan plan(world, cfg.parallelism.data_parallel_replicate_degree,
                                cfg.parallelism.shard_degree(world.size()),
                                cfg.parallelism.expert_parallel_degree);
  // The same code on every rank (a host with an older libtitan would compute and shard otherwise);
  // the CPU and GPU may differ between hosts, and with them the kernels OpenBLAS picks (its entry
  // names them after its release: only "OpenBLAS 0.3.21" is compared).
  std::string software;
  for (const VersionEntry& v : collect_versions()) {
    if (v.component == "titan" || v.component == "compiler" || v.component == "oneDNN" ||
        v.component == "MPI")
      software += v.component + ": " + v.version + "\n";
    if (v.component == "OpenBLAS")
      software += "OpenBLAS: " + v.version.substr(0, v.version.find(' ', v.version.find(' ') + 1)) + "\n";
  }
  plan.check_same_on_every_rank(software, "titan builds",
                                "every rank must run the same titan build with the same libraries");
  ConsoleOfRank console(plan.is_logging_rank());
  if (cfg.training.deterministic) omp_set_dynamic(0);
  // Under mpirun: a SIGTERM from it is answered differently from one sent to the ranks themselves.
  StopSignals signals(plan.world_size() > 1 ? dist::open_mpi_launcher_pid() : std::nullopt);

  // ---- everything that can fail on bad input, before any compute
  // The inputs first: a missing dataset or a bad model config stops the run before it touches its
  // folders.
  // Agreed: an error every rank finds alike (an unknown flavor, a missing dataset) is said once by
  // rank 0, and one rank's own (its host lacks the dataset) stops every rank with its reason.
  ResolvedJob job;
  plan.agree_on_success([&] { job = resolve_job(cfg, plan); });
  // Process-wide (ops read it as they record): this run's setting from here on, its memory check
  // included, and the previous one once the run ends.
  const autograd::Bf16ActivationGradientsScope activation_grads(job.bf16_activation_grads);

  // Locked before anything in the folders is read or written. The checkpoint folder has a lock of its
  // own: an absolute checkpoint.folder can be another run's, whatever the dump folders.
  const RunLock run_lock(cfg.job.dump_folder, "job.dump_folder", plan.rank());
  const std::filesystem::path checkpoint_folder = checkpoint_folder_of(cfg);
  std::optional<RunLock> checkpoint_lock;
  if (std::filesystem::weakly_canonical(checkpoint_folder) !=
      std::filesystem::weakly_canonical(cfg.job.dump_folder))
    checkpoint_lock.emplace(checkpoint_folder, "checkpoint.folder", plan.rank());
  if (plan.world_size() > 1) {
    check_every_rank_sees(cfg.job.dump_folder, "job.dump_folder", plan);
    if (checkpoint_lock) check_every_rank_sees(checkpoint_folder, "checkpoint.folder", plan);
  }
  // Its checks of the folder (a damaged or uncommitted checkpoint, checkpoint.load_step) every rank
  // finds alike: said once.
  std::optional<Checkpointer> checkpointer_of_run;
  plan.agree_on_success([&] {
    checkpointer_of_run.emplace(cfg, plan);
    TITAN_CHECK(!cfg.checkpoint.create_seed_checkpoint || !checkpointer_of_run->resume_step(),
                "checkpoint.create_seed_checkpoint = true: '", checkpointer_of_run->folder().string(),
                "' already holds checkpoints (the newest: step ",
                checkpointer_of_run->resume_step().value_or(-1),
                "); a seed is the checkpoint a job starts from: write it into an empty checkpoint folder "
                "(another job.dump_folder or checkpoint.folder)");
  });
  Checkpointer& checkpointer = *checkpointer_of_run;
  const bool trains = checkpointer.resume_step().value_or(0) < cfg.training.steps;
  const bool saves =
      cfg.checkpoint.create_seed_checkpoint || (cfg.checkpoint.enable && !cfg.checkpoint.load_only && trains);
  checkpointer.say_ignored_step_dirs(/*trains=*/true, saves);
  // The folders the run will write in, checked by the ranks that write there before anything is built
  // or trained: one that cannot be written would otherwise stop the run at its first save, the steps
  // since its last checkpoint lost.
  // (A run with nothing left to train that still exports is not probed: it writes at once, and no
  // collective may hang on each rank's own view of the folder before the ranks agree on it.)
  const bool exports = cfg.checkpoint.last_save_in_hf && (trains || !checkpointer.resume_step());
  plan.agree_on_success([&] {
    if (plan.is_logging_rank() || cfg.metrics.save_for_all_ranks)
      io::check_writable_folder(cfg.job.dump_folder, "job.dump_folder",
                                "the run writes its metrics and run_info.json there; make it writable or "
                                "choose another job.dump_folder");
    if ((saves && (plan.is_logging_rank() || plan.replicate_index() == 0)) ||
        (exports && plan.is_logging_rank()))
      io::check_writable_folder(
          checkpoint_folder, "checkpoint.folder",
          std::string(
              saves ? "the run saves its checkpoints there (checkpoint.enable = true)"
                    : "the run writes its Hugging Face export there (checkpoint.last_save_in_hf = true)") +
              "; make it writable or choose another checkpoint.folder (or job.dump_folder)");
  });
  // A resumed run's weights come from its checkpoint; the initial-load settings are for a fresh one.
  // Agreed on every rank whatever its view of the folder (one that sees a checkpoint another does
  // not is named by the check of the starting points below): said once, as resolve_job's.
  plan.agree_on_success([&] {
    if (!checkpointer.resume_dir()) resolve_initial_weights(cfg, job);
  });
  // Said after the start-up report, in place of the config's notes that name the initial load as
  // the reason the seed and init do nothing (a resume is the reason).
  JobConfig reported = cfg;
  std::string initial_load_note;
  if (checkpointer.resume_step() &&
      (!cfg.checkpoint.initial_load_path.empty() || cfg.checkpoint.initial_load_in_hf)) {
    const std::string key =
        cfg.checkpoint.initial_load_path.empty()
            ? std::string("checkpoint.initial_load_in_hf = true (model.hf_assets_path)")
            : "checkpoint.initial_load_path = \"" + cfg.checkpoint.initial_load_path + "\"";
    std::vector<std::string> moot;  // training.seed, model.init: set, and without effect on a resume too
    std::erase_if(reported.notes, [&](const std::string& note) {
      const bool loaded = note.find("the job starts from loaded weights") != std::string::npos;
      if (loaded) moot.push_back(note.substr(0, note.find(": no effect")));
      return loaded;
    });
    std::string also;
    for (const std::string& m : moot) also += (also.empty() ? "; " : ", ") + m;
    initial_load_note = formatted(
        "note: %s: no effect, the run resumes from step %ld in '%s' (the initial load is for a run with "
        "nothing to resume)%s",
        key.c_str(), long(*checkpointer.resume_step()), checkpointer.folder().c_str(),
        also.empty() ? "" : (also + ": no effect either, the resume continues the saved weights").c_str());
  }
  // TensorBoard's events: <dump_folder>/<save_tb_folder> (torchtitan's layout), or none.
  const std::filesystem::path tensorboard =
      cfg.metrics.enable_tensorboard ? std::filesystem::path(cfg.job.dump_folder) / cfg.metrics.save_tb_folder
                                     : std::filesystem::path();
  const MetricsOutputs metrics_out = metrics_outputs(cfg.job.dump_folder, tensorboard, plan.rank(),
                                                     plan.is_logging_rank(), cfg.metrics.save_for_all_ranks);
  MetricsLogger::check_outputs(metrics_out);
  StepShape rank_step = step_shape(cfg, job);  // one rank's step: the memory check is per rank
  rank_step.dp_replicate = plan.dp_replicate();
  rank_step.dp_shard = plan.dp_shard();
  rank_step.ep = plan.ep();
  const std::vector<std::string> hosts = plan.host_names();  // ranks on one host share its memory
  std::optional<data::Tokenizer> tokenizer_of_run;
  std::optional<Validator> validator;  // [validation]: held-out loss at step 1 and every freq steps
  // A host's own findings (its memory, its copy of the tokenizer) and the ones every rank finds alike
  // (a tokenizer too large for the model): said once.
  plan.agree_on_success([&] {
    check_training_fits(job.args, rank_step,
                        std::count(hosts.begin(), hosts.end(), hosts[size_t(plan.rank())]));
    tokenizer_of_run.emplace(load_tokenizer(cfg, job));
    if (cfg.validation.enable) {
      // Checked before any step trains: the validation forward would otherwise refuse it after step 1.
      const int64_t val_seq = cfg.validation.seq_len == -1 ? job.seq_len : cfg.validation.seq_len;
      TITAN_CHECK(val_seq <= job.args.max_seq_len, "validation.seq_len = ", val_seq,
                  " exceeds the model's max_seq_len = ", job.args.max_seq_len);
      validator.emplace(cfg, *tokenizer_of_run, job.dataset_files, plan);
    }
  });
  const data::Tokenizer& tokenizer = *tokenizer_of_run;
  start_up_report(reported, job, plan, tokenizer);
  if (!initial_load_note.empty()) say("%s", initial_load_note.c_str());
  const std::string left_out_note = cfg.left_out_note(checkpointer.resume_dir().has_value());
  if (!left_out_note.empty()) say("config: %s", left_out_note.c_str());
  if (validator) say("%s", validator->describe().c_str());

  // ---- the state: built, then restored from the newest checkpoint or given its first weights
  TrainState state(cfg, job, tokenizer, plan);
  // Every rank reads the global batch and trains its rows: the files must be the same bytes on every
  // rank (a stale copy on another host would train on other data under the same batch hashes).
  if (plan.world_size() > 1) {
    std::string identity;
    for (const nlohmann::json& file : state.dataset_identity) identity += file.dump() + "\n";
    plan.check_same_on_every_rank(
        identity, "datasets",
        "every rank must read the same dataset files, byte for byte: on several hosts, "
        "the same copy at the same path");
  }
  if (plan.world_size() > 1)
    plan.check_same_on_every_rank(start_identity(checkpointer, job), "starting points",
                                  "every rank must start from the same checkpoint or weights, and the same "
                                  "tokenizer: on several hosts, one shared folder or copies with the same "
                                  "content, each up to date");
  if (checkpointer.resume_dir()) {
    checkpointer.restore(state, job);
  } else {
    // A run that meant to resume and finds nothing (a mistyped checkpoint.folder) would otherwise
    // train from scratch with no word of it.
    // (A seed checkpoint's run trains nothing: it writes step 0.)
    if (cfg.checkpoint.enable && !cfg.checkpoint.create_seed_checkpoint && cfg.training.steps > 0)
      say("checkpoint: no committed checkpoint in %s: the run starts at step 1",
          checkpointer.folder().c_str());
    start_weights(state, cfg, job, plan);
    // Weights without stop tokens of their own get those titan generate uses in the run's records and
    // exports, or transformers' generate on the export would never stop: random ones, and a Hugging
    // Face folder with neither a generation_config.json nor an eos_token_id in its config.json (as
    // small test models are written). A loaded model's own stop tokens are kept as they came.
    const bool random = job.initial_hf.empty() && job.initial_native.empty();
    if (random || (!job.initial_hf.empty() && !names_stop_tokens(job.initial_hf))) {
      state.generation_config =
          stop_tokens_generation_config(job.args, tokenizer, document_separator(cfg.training, tokenizer));
      if (!state.generation_config.is_null() && (cfg.checkpoint.enable || cfg.checkpoint.last_save_in_hf))
        say("generation config of the checkpoints and exports: eos_token_id %s (where titan generate stops; "
            "transformers' generate reads it from generation_config.json)%s",
            state.generation_config["eos_token_id"].dump().c_str(),
            random ? "" : ": the loaded model names no stop token of its own");
    }
  }
  if (state.step >= cfg.training.steps) {
    if (checkpointer.resume_dir())
      say("checkpoint: step %ld is already at or past training.steps = %ld: nothing to train (raise "
          "training.steps to go on)",
          long(state.step), long(cfg.training.steps));
    else
      say("training.steps = 0: nothing to train");
  }
  state.distribute();
  say("memory per rank: %s", memory_per_rank(state).c_str());
  if (cfg.checkpoint.create_seed_checkpoint) {
    checkpointer.save(state, job);  // written at once: nothing is left to overlap
    say("checkpoint.create_seed_checkpoint: step 0 holds the starting weights; nothing trained. The job's "
        "next run starts from them (without this key)");
    TrainSummary seeded;
    seeded.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return seeded;
  }

  // ---- the loop
  MetricsLogger logger(metrics_out);
  // What `titan report` shows beside the curves: the run's config in effect and where it ran.
  const std::filesystem::path run_info = std::filesystem::path(cfg.job.dump_folder) / "run_info.json";
  nlohmann::json info;
  bool new_stretch_pending = false;  // written once this run's first step is over (see below)
  if (plan.is_logging_rank()) {
    const std::string device =
        job.device == Device::CPU ? cpu::cpu_info().summary() : device_services(job.device).description();
    info = {{"description", cfg.job.description},
            {"config_in_effect", cfg.describe()},
            {"config_notes", notes_with(reported.notes, left_out_note)},  // as the start-up said them
            {"device", device},
            {"ranks", plan.describe()},
            {"runs", run_stretches(run_info, state.step, plan.describe(), device, device_key(job.device))},
            {"versions", versions_json(collect_versions())}};
    // Until this run's first step, metrics.jsonl's newest records after the checkpoint are still the
    // earlier run's: a stretch of its own is added only then, so a run that dies at start-up does not
    // label them with its mesh.
    nlohmann::json known = info["runs"];
    new_stretch_pending = known.size() > 1 && known.back()["from_step"] == state.step + 1;
    if (new_stretch_pending) known.erase(known.size() - 1);
    nlohmann::json shown = info;
    shown["runs"] = known;
    io::write_file_atomic(run_info, shown.dump(2) + "\n");
  }
  const MfuPeak peak = mfu_peak(cfg.metrics.peak_tflops, job.device, job.compute_dtype);
  const double peak_tflops = peak.tflops;
  const double flops_per_token = job.args.flops_per_token(job.seq_len);
  char peak_text[64] = "peak";
  if (peak_tflops > 0) std::snprintf(peak_text, sizeof peak_text, "peak %.3g TFLOP/s =", peak_tflops);
  say("MFU: FLOPs/token %.4g (6 x active matmul params incl. lm_head + 12 x layers x heads x head_dim x "
      "seq; a position whose target is ignored skips the lm_head's 6 x vocab x dim), "
      "%s %s",
      flops_per_token, peak_text, peak.source.c_str());
  StepMeter meter(logger, cfg.metrics.log_freq, cfg.training.steps, flops_per_token,
                  job.args.lm_head_flops_per_token(), peak_tflops, job.device);
  const TrainStep train_step(cfg, job, plan);
  StepProfiler profiler(cfg.profiling, cfg.job.dump_folder, plan.rank(), job.device);
  if (profiler.enabled())
    say("profiling: the last %ld of every %s, op by op; Chrome traces in %s/iteration_<step>/",
        long(cfg.profiling.profiler_active), counted(cfg.profiling.profile_freq, "step").c_str(),
        (std::filesystem::path(cfg.job.dump_folder) / cfg.profiling.save_traces_folder).c_str());

  TrainSummary summary;
  auto data_epoch = [&] { return state.loader.state().at("epoch").get<uint64_t>(); };
  uint64_t epoch = data_epoch();
  bool epoch_explained = false;  // the first re-read of this invocation is said in full
  bool first_step_done = false;  // of this run: the start-up bound holds until its end
  bool final_saved = false, exported = false;  // by this invocation, after its last step
  while (state.step < cfg.training.steps) {
    // checkpoint.async_mode: a save whose files every rank has written commits here.
    checkpointer.poll_save();
    // A signal reaches the ranks at slightly different times: they agree to stop at one step.
    const int own_signal = signals.received();  // read once: both agreements below see the same
    if (int sig = int(plan.max_over_ranks(own_signal))) {
      // Said by rank 0, of the lowest rank that received it: "rank 1 received SIGTERM" where only
      // rank 1 was sent one (rank 0's own was acknowledged the moment it came).
      const int64_t signalled =
          plan.world_size() - plan.max_over_ranks(own_signal == sig ? plan.world_size() - plan.rank() : 0);
      const std::string received =
          (signalled == plan.rank() ? std::string() : "rank " + std::to_string(signalled) + " ") +
          "received " + stop_signal_name(sig);
      meter.log_unlogged_step();  // the log ends on the step reached, whatever log_freq
      // The step in hand is complete: save it (unless it is already saved, or nothing was
      // trained yet) and stop. A checkpoint is written even with checkpoint.enable = false, so
      // that no work is lost (resuming from it needs checkpoint.enable = true); never with
      // checkpoint.load_only = true, which asked for no saves.
      if (state.step == checkpointer.last_saved_step() && checkpointer.saving()) {
        say("%s at step %ld: its checkpoint is being written in the background; stopping once it "
            "is committed",
            received.c_str(), long(state.step));
      } else if (state.step == checkpointer.last_saved_step() || state.step == 0) {
        say("%s at step %ld: nothing new to save; stopping", received.c_str(), long(state.step));
      } else if (cfg.checkpoint.load_only) {
        say("%s at step %ld: checkpoint.load_only = true, no checkpoint saved; stopping", received.c_str(),
            long(state.step));
      } else {
        say("%s: saving a checkpoint at step %ld and stopping", received.c_str(), long(state.step));
        checkpointer.save(state, job);
      }
      summary.interrupted = true;
      break;
    }
    meter.begin_step();
    profiler.begin_step(state.step + 1);
    state.sharding.reset_stats();
    const StepResult r = [&] {
      try {
        try {
          return train_step.run(state);
        } catch (const DeviceOutOfMemory& e) {
          // This rank's alone (the others wait until the job is ended): what would shrink the step
          // (TrainStep::run counted the step first).
          throw DeviceOutOfMemory(
              std::string(e.what()) + "; step " + std::to_string(state.step) + " of batch " +
              std::to_string(job.local_batch_size) + " x seq " + std::to_string(job.seq_len) +
              " needs more memory than this rank has: titan plan --config <this config> shows what it holds "
              "(docs/planning.md); shrink training.local_batch_size or training.seq_len "
              "(training.global_batch_size "
              "keeps the step's tokens by accumulating)" +
              (cfg.activation_checkpoint.mode != "full" ? ", or set activation_checkpoint.mode = \"full\""
                                                        : ""));
        }
      } catch (const std::exception& e) {
        // A save of an earlier step still in the background is committed before the run stops (a
        // resume starts from it), or its failure said beside, where every rank stops here alike: a
        // step every rank refused, or one process. (After one rank's own error the ranks cannot
        // agree on a commit: that save is dropped, the checkpoint before it stands.)
        if (dynamic_cast<const StepRefused*>(&e) || plan.world_size() == 1) {
          try {
            checkpointer.finish_save();
          } catch (const Error& save_error) {
            say("checkpoint: the save in the background failed too: %s", save_error.what());
          }
        }
        throw;
      }
    }();
    profiler.step_ran();
    if (const uint64_t now = data_epoch(); now > epoch) {
      // The first re-read in full; after it one line at each doubling, so a dataset far smaller than
      // the run does not fill the log (the summary says how many epochs were read in all).
      const uint64_t said = std::bit_floor(now);
      // Counted as whole reads of the dataset (an epoch number is 0- or 1-based by whom you ask).
      if (!epoch_explained)
        say("data: the dataset was read through %s by step %ld: it is read again from its first document "
            "(torchtitan re-loops likewise; from here on the log says when the count reaches a power of two)",
            counted(int64_t(now), "time").c_str(), long(state.step));
      else if (said > epoch)
        say("data: the dataset was read through %s by step %ld", counted(int64_t(said), "time").c_str(),
            long(state.step));
      epoch = now;
      epoch_explained = true;
    }
    meter.set_batch_hash(r.batch_hash);
    meter.set_tokens_seen(state.tokens_seen);
    if (r.global_max_loss >= 0) meter.set_global_max_loss(r.global_max_loss);
    if (!cfg.training.chat_field.empty()) {
      meter.set_padding_pct(100.0 * double(r.padding) / double(r.tokens));
      meter.set_trained_tokens(r.targets);
    }
    summary.padding += r.padding;
    summary.step_tokens += r.tokens;
    summary.conversations += r.conversations;
    summary.cut_conversations += r.cut_conversations;
    summary.cut_trained_tokens += r.cut_trained_tokens;
    if (r.expert_load.max_over_mean >= 0)
      meter.set_expert_load(r.expert_load.max_over_mean, r.expert_load.idle);
    if (state.sharding.active())
      meter.add_communication(state.sharding.stats().bytes_sent, state.sharding.stats().seconds);
    std::function<double()> held_out;  // after the update: the held-out loss of this step's weights
    if (validator && validator->due(state.step)) held_out = [&] { return validator->run(state.model, state.sharding).loss; };
    meter.end_step(state.step, r.loss, r.aux_loss, r.grad_norm, r.lr, r.tokens / plan.dp_size(),
                   double(r.targets) / double(plan.dp_size()), held_out);
    summary.final_loss = r.loss;
    ++summary.steps_run;
    bool periodic = false;
    if (cfg.checkpoint.enable && !cfg.checkpoint.load_only) {
      periodic = periodic_save_due(cfg.checkpoint, state.step, checkpointer.seconds_since_last_save());
      // checkpoint.interval_type = "seconds": every rank's clock says its own; they save at one step.
      if (cfg.checkpoint.interval_type == "seconds") periodic = plan.max_over_ranks(periodic) != 0;
    }
    // The steps are over: their cached activation segments go back to the system, so the final
    // save and export hold no more than the run's state beside their own buffers.
    if (state.step == cfg.training.steps) device_services(job.device).release_cached();
    if (cfg.checkpoint.enable && !cfg.checkpoint.load_only &&
        (periodic || state.step == cfg.training.steps ||
         (state.step == 1 && cfg.checkpoint.enable_first_step_checkpoint))) {
      // checkpoint.async_mode: in the background while steps remain (the last one is waited for).
      checkpointer.save(
          state, job,
          state.step < cfg.training.steps ? Checkpointer::When::InBackground : Checkpointer::When::Now);
      final_saved = state.step == cfg.training.steps;
    }
    profiler.end_step(state.step);
    // As torchtitan: the step bound from the end of the first step of this run, its evaluation
    // and checkpoint included (a resumed run's first step too, where torchtitan's "step == 1"
    // would keep the start-up bound for the whole run).
    if (!first_step_done) {
      world.set_timeout(cfg.comm.train_timeout());
      first_step_done = true;
      if (new_stretch_pending) io::write_file_atomic(run_info, info.dump(2) + "\n");
    }
  }

  checkpointer.finish_save();  // the last save, or one still in the background, is committed
  profiler.end_run(state.step);
  summary.last_step = state.step;
  summary.tokens = state.tokens_seen;
  summary.seconds = seconds_since(t_start);
  summary.sustained_tps = meter.sustained_tps();
  summary.sustained_mfu = meter.sustained_mfu();
  device_services(job.device).release_cached();  // also after an interrupted run (see above)
  // A run that trained nothing keeps an export it already has.
  if (!summary.interrupted && cfg.checkpoint.last_save_in_hf &&
      !(summary.steps_run == 0 && checkpointer.has_hf_export(state.step))) {
    try {
      checkpointer.export_hf(state, job);
      exported = true;
    } catch (const Error& e) {
      // What of the run is on disk: the export was its last output.
      const std::filesystem::path step_dir = checkpointer.step_dir(state.step);
      std::string on_disk;
      if (cfg.checkpoint.enable && checkpointer.last_saved_step() == state.step)  // saved, or resumed from
        on_disk = "its checkpoint " + step_dir.string() + " is committed: titan export --checkpoint " +
                  step_dir.string() + " --out " + checkpointer.hf_export_dir(state.step).string() +
                  (cfg.checkpoint.export_dtype == "bfloat16" ? " --dtype bfloat16" : "") +
                  " writes the export again";
      else if (summary.steps_run == 0)
        on_disk = "this invocation trained no step: its weights are those it started from";
      else
        on_disk = std::string("no checkpoint holds the weights of its ") +
                  counted(summary.steps_run, "step") + " (" +
                  (cfg.checkpoint.load_only ? "checkpoint.load_only = true" : "checkpoint.enable = false") +
                  "): they are not on disk";
      throw Error(std::string(e.what()) +
                  "; the run's final Hugging Face export (checkpoint.last_save_in_hf) of step " +
                  std::to_string(state.step) + " failed: " + on_disk);
    }
  }
  // A signal once the steps were done (during the last one, or the final save or export, which it
  // lets finish: they are the run's end).
  if (!summary.interrupted)
    if (const int sig = signals.received())
      say("received %s as the run ended: %s; stopping", stop_signal_name(sig),
          final_saved && exported ? "its final save and export completed"
          : final_saved           ? "its final save completed"
          : exported              ? "its final export completed"
                                  : "nothing was left to save");
  char sustained[160] = "no step after the warm-up step to measure";
  if (meter.measured_sustained()) {
    // tokens/s is per rank (as in metrics.jsonl); on several ranks the job's rate is said beside it.
    const std::string job_rate =
        plan.dp_size() > 1
            ? " per rank, " + std::to_string(std::lround(summary.sustained_tps * double(plan.dp_size()))) +
                  " for the job"
            : "";
    char mfu[48] = "MFU n/a";  // no peak known for the device
    if (summary.sustained_mfu >= 0) std::snprintf(mfu, sizeof mfu, "MFU %.2f%%", summary.sustained_mfu);
    std::snprintf(sustained, sizeof sustained, "sustained %.0f tokens/s%s, %s (warm-up step excluded)",
                  summary.sustained_tps, job_rate.c_str(), mfu);
  }
  char final_loss[48] = "no final loss";
  if (summary.steps_run > 0)
    std::snprintf(final_loss, sizeof final_loss, "final loss %.4f", summary.final_loss);
  if (epoch > 0)
    say("data: at the end the dataset had been read through %s", counted(int64_t(epoch), "time").c_str());
  // Conversations cut at the row's end: the warnings name the first per file; this counts them all
  // (every rank reads the whole global batch, so the count is the job's on every rank).
  if (summary.cut_conversations > 0)
    say("data: %ld of the %ld conversations in this invocation's steps %s longer than seq_len + 1 = "
        "%ld tokens and cut there: %s not trained on",
        long(summary.cut_conversations), long(summary.conversations),
        summary.cut_conversations == 1 ? "was" : "were", long(job.seq_len + 1),
        counted(summary.cut_trained_tokens, "answer token").c_str());
  // Conversations: how much of this invocation's steps was padding (the tokens/s above count it).
  char padding[64] = "";
  if (!cfg.training.chat_field.empty() && summary.steps_run > 0)
    std::snprintf(padding, sizeof padding, " (this run's steps %.1f%% padding)",
                  100.0 * double(summary.padding) / double(summary.step_tokens));
  say("summary: %s (last step %ld)%s, %s, %s, %ld tokens seen since step 1%s, %.1f s%s",
      counted(summary.steps_run, "step").c_str(), long(summary.last_step),
      summary.interrupted ? ", interrupted" : "", final_loss, sustained, long(summary.tokens), padding,
      summary.seconds, summary.steps_run == 0 ? " (no step taken)" : "");
  if (!logger.write_failure().empty()) say("warning: metrics: %s", logger.write_failure().c_str());
  return summary;
}

}  // namespace titan::train
