// Expert parallelism (nn::expert_parallel_experts over dist::expert_exchange) on real MPI ranks
// (`mpirun -np 2` and `-np 4`, this program again): every rank routes its own tokens (an uneven
// share of one global batch; in two cases none for rank 1, and no row for the last rank's experts)
// and holds E/P of the experts; its output and the gradients of its
// tokens, its routing weights and its experts must be those of ops::moe_experts over the whole batch
// with every expert in one process: the same bits in the forward and the backward (the same rows
// and routing weights reach the same expert kernels in the same order), but for the reference
// kernels' dx, within the reassociation of its sums.
#include "titan/nn/expert_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/dist/communicator.h"
#include "titan/dist/expert_exchange.h"
#include "titan/dist/meta_world.h"
#include "titan/kernels/registry.h"
#include "titan/models/qwen3/model.h"

namespace titan {
namespace {

namespace tt = titan::testing;

// Set by the parent test for the ranks it starts under mpirun.
constexpr const char* kRankEnv = "TITAN_EXPERT_PARALLEL_TEST_RANKS";
constexpr int kRankTests = 8;

// The global problem: rank r routes 9 + 4r tokens (uneven shares), E = 8 experts of which each
// token takes k = 2; D = 24, F = 20. With `empties`, rank 1 routes no token and no token picks the
// last rank's experts (their router logits sit 8 below the others'), so that rank receives no row.
constexpr int64_t kExperts = 8, kTopK = 2, kDim = 24, kHidden = 20;
int64_t tokens_of(int rank, bool empties) {
  return empties && rank == 1 ? 0 : 9 + 4 * rank;
}
int64_t first_token_of(int rank, bool empties) {
  int64_t t = 0;
  for (int r = 0; r < rank; ++r) t += tokens_of(r, empties);
  return t;
}

double largest_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// Runs the layer for this rank's tokens and experts over `group`, and the whole batch with every
// expert in this process, and compares them.
void check_expert_parallel(dist::Communicator& world, DType dt, const char* variant, bool empties = false) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + ", moe_experts " + variant + ", rank " +
               std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
               (empties ? ", a rank without tokens and one whose experts get no row" : ""));
  kernels::ForceVariant force("moe_experts", variant);
  const int P = world.size(), rank = world.rank();
  const int64_t T = first_token_of(P, empties), mine = tokens_of(rank, empties),
                first = first_token_of(rank, empties), local = kExperts / P;
  // The same global data on every rank (fixed seeds).
  ops::RouterOutput routed;
  {
    autograd::NoGradGuard no_grad;
    std::vector<double> logits = tt::random_tensor({T, kExperts}, DType::F64, 11, -2, 2).to_vector();
    if (empties && P > 1)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = kExperts - local; e < kExperts; ++e) logits[size_t(t * kExperts + e)] -= 8;
    routed = ops::router_topk(Tensor::from_vector(logits, {T, kExperts}, DType::F32), kTopK, true);
  }
  const DType gd = grad_dtype(dt);
  const double sd = 1.7 / std::sqrt(double(kDim)), sf = 1.7 / std::sqrt(double(kHidden));
  const Tensor x = tt::random_tensor({T, kDim}, dt, 12), weights = routed.weights.detach().to(gd),
               w_gate = tt::random_tensor({kExperts, kHidden, kDim}, dt, 13, -sd, sd),
               w_up = tt::random_tensor({kExperts, kHidden, kDim}, dt, 14, -sd, sd),
               w_down = tt::random_tensor({kExperts, kDim, kHidden}, dt, 15, -sf, sf),
               dy = tt::random_tensor({T, kDim}, gd, 16);
  auto leaf = [](const Tensor& t) { return t.contiguous().clone().set_requires_grad(true); };

  // One process, every expert.
  std::vector<Tensor> all = {leaf(x), leaf(weights), leaf(w_gate), leaf(w_up), leaf(w_down)};
  const Tensor y_all = ops::moe_experts(all[0], all[1], routed.indices, all[2], all[3], all[4]);
  autograd::backward(autograd::current_tape(), {y_all}, {dy});

  // This rank: its tokens, its experts.
  std::vector<Tensor> ep = {leaf(x.narrow(0, first, mine)), leaf(weights.narrow(0, first, mine)),
                            leaf(w_gate.narrow(0, rank * local, local)),
                            leaf(w_up.narrow(0, rank * local, local)),
                            leaf(w_down.narrow(0, rank * local, local))};
  const ops::ExpertIndices my_routing =
      ops::expert_indices(routed.indices.tensor().narrow(0, first, mine), kExperts, "test");
  const std::unique_ptr<nn::ExpertExchange> group = dist::expert_exchange(world);
  const Tensor y = nn::expert_parallel_experts(ep[0], ep[1], my_routing, ep[2], ep[3], ep[4], *group);
  autograd::backward(autograd::current_tape(), {y}, {dy.narrow(0, first, mine).contiguous()});

  const Tensor y_want = y_all.narrow(0, first, mine);
  // f32's default kernel may fuse its un-permute's multiply-add where moe_combine rounds (an ulp).
  if (dt == DType::F32 && std::string(variant) == "default")
    EXPECT_LE(tt::max_abs_diff(y, y_want), 1e-6 * largest_abs(y_want));
  else
    EXPECT_EQ(tt::max_abs_diff(y, y_want), 0.0) << "the forward must be moe_experts' bits";

  // The experts run each row with its routing weight, as moe_experts does in one process, so its
  // kernels round where they round there and sum an expert's rows in the same order: every gradient
  // has moe_experts' bits, except dx with the reference kernels, which add a token's k rows in slot
  // order (the rows' scatter-add here: in expert order).
  const double tol = dt == DType::F64 ? 1e-13 : 1e-5;
  const Tensor want[] = {all[0].grad().narrow(0, first, mine), all[1].grad().narrow(0, first, mine),
                         all[2].grad().narrow(0, rank * local, local),
                         all[3].grad().narrow(0, rank * local, local),
                         all[4].grad().narrow(0, rank * local, local)};
  const char* names[] = {"dx", "dweights", "dw_gate", "dw_up", "dw_down"};
  for (size_t i = 0; i < 5; ++i) {
    if (want[i].numel() == 0) continue;  // a rank without tokens
    ASSERT_TRUE(ep[i].grad().defined()) << names[i];
    if (i == 0 && std::string(variant) == "reference")
      EXPECT_LE(tt::max_abs_diff(ep[i].grad(), want[i]), tol * largest_abs(want[i])) << names[i];
    else
      EXPECT_EQ(tt::max_abs_diff(ep[i].grad(), want[i]), 0.0) << names[i] << ": moe_experts' bits";
  }
  // Where other ranks' tokens reach this rank's experts (every rank has tokens for every rank's
  // experts without `empties`), their gradients are not what this rank's own tokens give them:
  // the rows really travelled.
  if (!empties && P > 1) {
    std::vector<Tensor> own = {leaf(x.narrow(0, first, mine)), leaf(weights.narrow(0, first, mine)),
                               leaf(w_gate), leaf(w_up), leaf(w_down)};
    const Tensor y_own = ops::moe_experts(own[0], own[1], my_routing, own[2], own[3], own[4]);
    autograd::backward(autograd::current_tape(), {y_own}, {dy.narrow(0, first, mine).contiguous()});
    const Tensor own_gate = own[2].grad().defined() ? own[2].grad().narrow(0, rank * local, local)
                                                    : Tensor::zeros(want[2].shape(), want[2].dtype());
    EXPECT_GT(tt::max_abs_diff(ep[2].grad(), own_gate), 1e-3 * largest_abs(want[2]));
  }
  if (empties && P > 1 && rank == P - 1) {
    EXPECT_EQ(largest_abs(ep[2].grad()), 0.0) << "no row reached the last rank's experts";
  }
}

// A Qwen3-MoE model whose experts are split over the ranks (each holding E/P of every layer's, with
// the values a one-process model of the same seed draws for them), each rank training on its own
// rows: its loss is the one-process model's on those rows, its experts' gradients are the
// one-process gradients of every rank's loss summed, and its other gradients summed over the ranks
// are those too. f64 compute (reference kernels), f32 masters and gradients.
qwen3::ModelArgs small_moe() {
  qwen3::ModelArgs a;
  a.vocab_size = 256, a.dim = 32, a.n_layers = 2, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 8;
  a.hidden_dim = 64, a.max_seq_len = 32, a.num_experts = 8, a.top_k = 2, a.moe_hidden_dim = 16;
  return a;
}

void check_split_model(dist::Communicator& world, bool recomputed) {
  const int P = world.size(), rank = world.rank();
  SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(P) +
               (recomputed ? ", every layer recomputed in backward (its exchanges too)" : ""));
  kernels::ForceVariant force("moe_experts", "reference");
  const qwen3::ModelArgs a = small_moe();
  const int64_t S = 16, rows = 2, local = a.num_experts / P;
  std::vector<int64_t> ids(size_t(rows * P * (S + 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 2654435761u + 17) % uint64_t(a.vocab_size));
  const Tensor all = Tensor::from_vector(ids, {rows * P, S + 1});
  auto inputs_of = [&](int r) { return all.narrow(0, r * rows, rows).narrow(1, 0, S).contiguous(); };
  auto targets_of = [&](int r) { return all.narrow(0, r * rows, rows).narrow(1, 1, S).contiguous(); };

  qwen3::Qwen3Model one(a, DType::F64);
  one.initialize(5, qwen3::InitScheme::Torchtitan);
  std::vector<double> one_loss;
  for (int r = 0; r < P; ++r) {  // every rank's rows, their gradients summed
    const qwen3::LossOutput out = one.forward_loss(inputs_of(r), targets_of(r));
    one_loss.push_back(out.loss.item());
    autograd::backward(out.loss);
  }

  qwen3::Qwen3Model split(a, DType::F64, Device::CPU, {}, qwen3::Purpose::Training, {rank, P});
  split.initialize(5, qwen3::InitScheme::Torchtitan);
  const std::unique_ptr<nn::ExpertExchange> group = dist::expert_exchange(world);
  split.set_expert_exchange(group.get());
  if (recomputed) split.set_checkpointing(qwen3::Checkpointing::full());
  ASSERT_EQ(split.blocks().size(), size_t(a.n_layers + 2 + a.n_layers)) << "one block of experts per layer";
  const qwen3::LossOutput out = split.forward_loss(inputs_of(rank), targets_of(rank));
  EXPECT_NEAR(out.loss.item(), one_loss[size_t(rank)], 1e-12 * std::abs(one_loss[size_t(rank)]));
  autograd::backward(out.loss);

  int experts_checked = 0;
  for (nn::Param* p : split.params()) {
    SCOPED_TRACE(p->name);
    const nn::Param* whole = one.find_param(p->name);
    ASSERT_TRUE(whole);
    const bool expert = p->name.find(".moe.experts.") != std::string::npos;
    const Tensor want_value = expert ? whole->value.narrow(0, rank * local, local) : whole->value;
    EXPECT_EQ(tt::max_abs_diff(p->value, want_value), 0.0) << "initialised as the one-process model";
    const Tensor want = expert ? whole->value.grad().narrow(0, rank * local, local) : whole->value.grad();
    Tensor got = p->value.grad().contiguous().clone();
    if (!expert)  // every rank's share of the dense gradients, summed
      world.all_reduce(got.raw_data(), got.numel(), DType::F32, dist::ReduceOp::Sum, dist::host_context());
    EXPECT_LE(tt::max_abs_diff(got, want), 1e-5 * std::max(1e-6, largest_abs(want)));
    experts_checked += expert;
  }
  EXPECT_EQ(experts_checked, 3 * a.n_layers);
}

// A plan: on the meta device over a meta world of 4 ranks, a split model's step assumes a balanced
// routing, so rank 0's experts receive as many rows as a whole model's experts run for its own
// tokens: the same expert FLOPs, plus moe_combine's (2 per element of each (token, slot) row
// forward, 4 backward).
TEST(ExpertParallel, APlanOnTheMetaDeviceAssumesABalancedRouting) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertParallelRanks.* only";
  const qwen3::ModelArgs a = small_moe();
  const int64_t B = 2, S = 16;
  DeviceServices& meta = device_services(Device::Meta);
  auto step_flops = [&](qwen3::Qwen3Model& m) {
    meta.reset_flops();
    const Tensor ids = Tensor::zeros({B, S}, DType::I64, Device::Meta);
    autograd::backward(m.forward_loss(ids, ids).loss);
    return meta.flops();
  };
  const std::unique_ptr<dist::Communicator> world = dist::meta_world_communicator(4);
  const std::unique_ptr<nn::ExpertExchange> group = dist::expert_exchange(*world);
  qwen3::Qwen3Model whole(a, DType::F32, Device::Meta);
  qwen3::Qwen3Model split(a, DType::F32, Device::Meta, {}, qwen3::Purpose::Training, {0, 4});
  split.set_expert_exchange(group.get());
  const double whole_flops = step_flops(whole), split_flops = step_flops(split);
  EXPECT_GT(whole_flops, 0.0);
  EXPECT_EQ(split_flops - whole_flops, 6.0 * double(B * S * a.top_k * a.dim * a.n_layers));
}

// A split model's MoE layers also gather rows (embedding) and combine the outputs (moe_combine):
// qwen3::module_ops lists them for it, so [kernels] rules may name them there and only there.
TEST(ExpertParallel, TheKernelsTableOfASplitModelIsWhatItsForwardCalls) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertParallelRanks.* only";
  const qwen3::ModelArgs a = small_moe();
  const std::unique_ptr<dist::Communicator> world = dist::meta_world_communicator(2);
  const std::unique_ptr<nn::ExpertExchange> group = dist::expert_exchange(*world);
  qwen3::Qwen3Model split(a, DType::BF16, Device::Meta, {}, qwen3::Purpose::Training, {0, 2});
  split.set_expert_exchange(group.get());
  std::set<std::pair<std::string, std::string>> table, unsplit;
  for (const kernels::ModuleOps& m : qwen3::module_ops(a, /*experts_split=*/true))
    for (const std::string& op : m.ops) table.emplace(m.module, op);
  for (const kernels::ModuleOps& m : qwen3::module_ops(a))
    for (const std::string& op : m.ops) unsplit.emplace(m.module, op);
  kernels::OpCallRecorder recorder;
  const Tensor ids = Tensor::zeros({2, 16}, DType::I64, Device::Meta);
  autograd::backward(split.forward_loss(ids, ids).loss);
  for (const auto& [module, op] : recorder.calls())
    if (!module.empty()) {
      EXPECT_TRUE(table.count({module, op})) << module << " calls " << op;
    }
  for (const char* op : {"embedding", "moe_combine"}) {
    EXPECT_TRUE(recorder.calls().count({"layers.0.moe", op})) << op;
    EXPECT_FALSE(unsplit.count({"layers.0.moe", op})) << op << " is in the table of an unsplit model";
  }
}

TEST(ExpertParallel, OneRankIsMoeExperts) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertParallelRanks.* only";
  const std::unique_ptr<dist::Communicator> one = dist::single_process_communicator();
  check_expert_parallel(*one, DType::F64, "reference");
  check_expert_parallel(*one, DType::F32, "default");
  check_expert_parallel(*one, DType::BF16, "default");
}

TEST(ExpertParallel, OverTwoAndFourRanksIsMoeExperts) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertParallelRanks.* only";
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const tt::RanksRun run =
        tt::run_this_program_on_ranks(ranks, kRankEnv, "ExpertParallelRanks.*", kRankTests);
    if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
    EXPECT_EQ(run.rc, 0) << run.output;
    EXPECT_EQ(run.ranks_passed, ranks) << "every rank must pass the ExpertParallelRanks tests:\n"
                                       << run.output;
  }
}

// The rank side (skipped when run directly).
#define REQUIRE_RANK()                                                                                \
  do {                                                                                                \
    if (!std::getenv(kRankEnv))                                                                       \
      GTEST_SKIP() << "runs under mpirun, started by ExpertParallel.OverTwoAndFourRanksIsMoeExperts"; \
  } while (0)

TEST(ExpertParallelRanks, AQwen3MoeWithSplitExpertsIsTheOneProcessModel) {
  REQUIRE_RANK();
  check_split_model(tt::rank_world(), /*recomputed=*/false);
}
TEST(ExpertParallelRanks, AQwen3MoeWithSplitExpertsRecomputedInBackward) {
  REQUIRE_RANK();
  check_split_model(tt::rank_world(), /*recomputed=*/true);
}
TEST(ExpertParallelRanks, F64ReferenceKernels) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::F64, "reference");
}
TEST(ExpertParallelRanks, F32ReferenceKernels) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::F32, "reference");
}
TEST(ExpertParallelRanks, F32DefaultKernels) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::F32, "default");
}
TEST(ExpertParallelRanks, Bf16DefaultKernels) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::BF16, "default");
}
TEST(ExpertParallelRanks, F64ARankWithoutTokensAndExpertsWithoutRows) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::F64, "reference", /*empties=*/true);
}
TEST(ExpertParallelRanks, F32ARankWithoutTokensAndExpertsWithoutRows) {
  REQUIRE_RANK();
  check_expert_parallel(tt::rank_world(), DType::F32, "default", /*empties=*/true);
}

}  // namespace
}  // namespace titan
