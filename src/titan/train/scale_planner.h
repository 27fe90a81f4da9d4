#pragma once
// The pieces of `titan plan` (src/titan/cli/plan_cmd.cpp): will a job fit one rank's memory on a
// given data-parallel mesh, how large a local batch would, and how long a step would take.
//   memory    the meta device's profile of one rank's step (step_profile.h): exact, not a formula;
//   batch     the largest training.local_batch_size whose profile fits, searched with meta profiles;
//   time      compute = the rank's step FLOPs (counted on meta) / a measured GEMM rate; the
//             collectives the plan made in the meta step under a ring bandwidth / latency model
//             (docs/planning.md has the formulas); the step between full overlap and none.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/core/dtype.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/step_profile.h"

namespace titan::train {

// "96GiB", "1.5 TiB", "80GB", "512MiB", "4096" (bytes): binary (KiB, MiB, GiB, TiB) and decimal
// (KB, MB, GB, TB) units, case-insensitive, optional space; nullopt when it is not such a size or
// not positive.
std::optional<int64_t> parse_byte_size(const std::string& text);

// What a step needs free on its device: the segments its caching allocator reserves by the end of
// the step (at least the peak of its tensors; titan info prints both), plus the checkpoint copy a
// background save writes from. Every device's tensors come from core/caching_allocator.h, so the
// reservation, not the peak, is what the device must hold.
int64_t memory_need(const StepProfile& p);

// Whether the step of `shape` fits `available` per rank: its need, or, when the cache would outgrow
// `available` and `cache_returns_at_bound` (a GPU: its allocator returns its cached segments when
// cudaMalloc refuses one, and retries), the step replayed within `available` (MetaMemoryBound)
// fits if every request is served; `need` is then that replay's, and `unbounded_need` what the
// unbounded cache would have held. A CPU process's cache returns its segments when the host has
// less available than a new segment (core/device_services.cpp), which ranks sharing a host reach
// together, not at each one's share of it: its jobs are judged unbounded.
struct MemoryFit {
  bool fits = false;
  int64_t need = 0;
  bool by_returning_cache = false;  // fits only because the bounded cache returned segments
  int64_t unbounded_need = 0;
};
MemoryFit fit_step(const qwen3::ModelArgs& args, const StepShape& shape, int64_t available,
                   bool cache_returns_at_bound);

// The largest local batch whose step fits `available` per rank (fit_step), all
// else of `shape` kept (the micro-batch count included). Doubling, then bisection: about
// 2 log2(batch) profiles. `largest` is 0 when even batch 1 does not fit; batches are searched up to
// `bound` (local_batch x seq_len <= 2^31 tokens per micro-batch), which `at_bound` says was reached.
struct BatchSearch {
  int64_t largest = 0;
  int64_t largest_need = 0;  // bytes needed per rank at `largest` (0 when none fits)
  int64_t next_need = 0;     // bytes needed per rank at largest + 1 (0 when at_bound)
  int64_t bound = 0;
  bool at_bound = false;
  int profiles = 0;  // meta steps run
};
BatchSearch largest_fitting_batch(const qwen3::ModelArgs& args, StepShape shape, int64_t available,
                                  bool cache_returns_at_bound);

// A GEMM rate of this machine: y = x @ w^T (ops::linear, the model's kernel) in `dtype` on
// `device`, x [M, K], w [N, K], repeated for about `seconds` (at least 3 calls) after one warm-up
// call; the rate of the fastest call.
struct GemmRate {
  double tflops = 0;
  // "measured: bf16 GEMM 1024 x 4096 x 256 (M x N x K) with ops::linear on cpu, 2 threads, the
  // fastest of 40 calls in 0.21 s"
  std::string source;
};
GemmRate measure_gemm_rate(Device device, DType dtype, int64_t M, int64_t N, int64_t K, double seconds);

// The GEMM rate of the model's own projections at `M` rows (a micro-batch's tokens): each distinct
// shape (attention's q, k, v and output, the MLP's, or an MoE layer's router and its experts at their
// share of the rows, M x top_k / experts, and the lm_head, its N capped at 16384: wider runs at the rate the
// cap measures) measured as measure_gemm_rate measures one, in `seconds` over them all, combined by the FLOPs
// each does in a forward (the FLOPs over the time they take at their rates). A model's GEMMs run at rates far
// apart (a 256-wide projection several times below a 151936-wide lm_head on a CPU): one shape measured stands
// for none of them.
GemmRate measure_model_gemm_rate(Device device, DType dtype, const qwen3::ModelArgs& args, int64_t M,
                                 double seconds);

// The model's GEMM shapes at `M` rows, as measure_model_gemm_rate measures them: each distinct
// (M, N, K) (N capped at 16384; an expert's rows at least 1) with the forward FLOPs the model does
// at it (all of them: the lm_head's full vocabulary, an expert's exact share of the rows).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  double flops = 0;
};
std::vector<GemmShape> model_gemm_shapes(const qwen3::ModelArgs& args, int64_t M);

// A link between the ranks: bandwidth per rank (Gbit/s) and the latency of one ring step (us).
struct Link {
  double gbps = 0;
  double latency_us = 0;
};

// The collectives of one rank's step, as the plan's sharding counted them on the meta step
// (StepProfile::comm: the bytes a ring algorithm sends per rank, and its ring steps), on `link`:
// bytes / bandwidth + ring steps x latency. `formula` names the mode as the mesh line does ("FSDP +
// EP") and the counts, the experts' all-to-alls (bytes and count) among them.
struct CommEstimate {
  double bytes = 0;
  double seconds = 0;
  std::string formula;
};
CommEstimate estimate_communication(const StepProfile& profile, const StepShape& shape, const Link& link);

}  // namespace titan::train
