// qwen3::module_ops, the table [kernels] rules are checked against (a rule for an op its modules
// never run is an error), is what the forward really calls: the (module, op) pairs a recorder sees
// during forward_loss, forward_logits, a backward and generation's cached steps, in f32 and bf16, with and
// without activation checkpointing, are all in the table, and together they are the table (dense and MoE).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <utility>

#include "models/small_args.h"
#include "titan/autograd/autograd.h"
#include "titan/kernels/registry.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

namespace titan {
namespace {

using Calls = std::set<std::pair<std::string, std::string>>;

// Three layers; the MoE one has a dense layer among its sparse ones.
qwen3::ModelArgs args_of(bool moe) {
  qwen3::ModelArgs a = testing::small_args(3, moe);
  if (moe) {
    a.mlp_only_layers = {1};
    a.validate();
  }
  return a;
}

Calls table_of(const qwen3::ModelArgs& a) {
  Calls c;
  for (const kernels::ModuleOps& m : qwen3::module_ops(a))
    for (const std::string& op : m.ops) c.emplace(m.module, op);
  return c;
}

// The (module, op) pairs inside modules that a forward_loss + backward, a forward_logits and two
// cached generation steps call.
Calls calls_of(const qwen3::ModelArgs& a, DType dtype, qwen3::Checkpointing checkpointing) {
  qwen3::Qwen3Model model(a, dtype);
  model.set_checkpointing(checkpointing);
  model.initialize(3, qwen3::InitScheme::HuggingFace);
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int64_t> tok(0, a.vocab_size - 1);
  std::vector<int64_t> ids(32), targets(32);
  for (auto& t : ids) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  const Tensor ids_t = Tensor::from_vector(ids, {2, 16}), targets_t = Tensor::from_vector(targets, {2, 16});
  kernels::OpCallRecorder recorder;
  autograd::backward(model.forward_loss(ids_t, targets_t).loss);
  {
    autograd::NoGradGuard no_grad;
    model.forward_logits(ids_t);
  }
  // Generation: a prompt, then one token over the KV cache.
  qwen3::KVCache cache = model.kv_cache(1, 8);
  model.next_token_logits(Tensor::from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + 5), {1, 5}),
                          cache);
  model.next_token_logits(Tensor::from_vector(std::vector<int64_t>{ids[5]}, {1, 1}), cache);
  Calls in_modules;
  for (const auto& call : recorder.calls())
    if (!call.first.empty()) in_modules.insert(call);  // the loss's sum and the aux loss run outside
  return in_modules;
}

TEST(ModuleOps, TheTableIsWhatTheForwardCalls) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "MoE" : "dense");
    const qwen3::ModelArgs a = args_of(moe);
    const Calls table = table_of(a);
    Calls any;  // over the runs: an f32 run casts nothing, a bf16 one its weights
    for (DType dtype : {DType::F32, DType::BF16})
      for (auto checkpointing : {qwen3::Checkpointing::none(), qwen3::Checkpointing::full()}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) +
                     (checkpointing == qwen3::Checkpointing::full() ? ", full checkpointing" : ""));
        for (const auto& [module, op] : calls_of(a, dtype, checkpointing)) {
          EXPECT_TRUE(table.count({module, op})) << module << " calls " << op << ", which module_ops lacks";
          any.emplace(module, op);
        }
      }
    for (const auto& [module, op] : table)
      EXPECT_TRUE(any.count({module, op}))
          << "module_ops says " << module << " calls " << op << ", which no forward did";
  }
}

}  // namespace
}  // namespace titan
