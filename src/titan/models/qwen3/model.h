#pragma once
// The Qwen3 / Qwen3-MoE decoder: one implementation for every route.
//
//   h = embed(tokens)
//   for each layer:  h = h + attention(rms_norm(h))          (q/k/v proj, per-head q/k norm, RoPE, GQA)
//                    h = h + mlp_or_moe(rms_norm(h))         (SwiGLU MLP, or routed SwiGLU experts)
//   logits = lm_head(rms_norm(h))                             (lm_head tied to the embedding or not)
//
// Parameters are native names (torchtitan's spelling, listed in state_dict.h) in flat
// blocks: "embedding", "layers.{i}", "head", and, when the experts are split over ranks
// (ExpertSplit), "layers.{i}.experts" after them. The state-dict adapter maps them to HF keys.
#include <memory>
#include <string>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/kernels/substitution.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/checkpointing.h"
#include "titan/nn/expert_parallel.h"
#include "titan/nn/param_block.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/moe/moe.h"
#include "titan/ops/rope/rope.h"

namespace titan::qwen3 {

enum class InitScheme { HuggingFace, Torchtitan };

// What a model is built for: training keeps a gradient buffer beside every weight; inference
// (generation, evaluation, export) keeps none.
enum class Purpose { Training, Inference };

// What a batch's rows hold besides their token ids (the loader says, data::Batch).
struct RowContents {
  // Where attention is cut inside the rows (model.attn_mask_type = "block_causal"); empty: causal
  // over each whole row.
  ops::DocumentSpans documents;
  // Per row, its tokens before the padding; empty: no padding. The MoE aux loss counts these tokens
  // only, as transformers' load_balancing_loss_func does under an attention_mask.
  std::vector<int64_t> lengths;
};

struct LossOutput {
  Tensor loss;            // what backward starts from: ce (+ coef * aux when enabled), weighted
  Tensor ce_loss;         // mean cross-entropy over non-ignored targets
  Tensor aux_loss;        // MoE load-balancing aux (undefined for dense models)
  int64_t num_targets = 0;  // targets that were not ignored
};

class Qwen3Model;

// The keys and values every layer's attention computed for the tokens so far (a KV cache), so that
// generation runs each new token through the model once instead of the whole sequence again. Made
// empty by Qwen3Model::kv_cache, filled by Qwen3Model::next_token_logits; usable with that model only.
// Its buffers hold room for the tokens so far, doubling as they fill (never past capacity()), so a
// generation that stops early never holds its whole allowance.
//
// Rows hold prompts of different lengths left-padded (batched generation), as transformers pads
// them: row b's first left_padding()[b] positions are padding, never attended to, and its first
// token after them is rope position 0. Its keys and values still take those positions, so every row
// has length() positions and each new token takes the same position in every row.
class KVCache {
 public:
  int64_t length() const { return length_; }        // positions cached: where the next token goes
  int64_t capacity() const { return capacity_; }    // the most positions it may hold
  int64_t allocated() const { return allocated_; }  // the positions its buffers have room for now
  int64_t batch() const { return batch_; }
  const std::vector<int64_t>& left_padding() const { return padding_; }  // empty: no row padded
  // Row i becomes the old row rows[i] (at least one; any order, a row may be taken twice or not at
  // all): a batched generation drops the rows that have stopped, so the steps after run the others
  // alone, and beam search continues each chosen beam from the row of the beam it extends.
  void select_rows(const std::vector<int64_t>& rows);
  // Appends the one row of `alone` (a prompt run by itself, at most length() positions) as a last
  // row, its positions right-aligned with the others' (the ones before them are its padding), so that
  // its next token takes the batch's next position as every row's does (continuous batching).
  void add_row(const KVCache& alone);
  // Keeps the first `length` positions only (at most length(), and no fewer than any row's padding):
  // a generation that continues an earlier one whose tokens changed after them (an interactive
  // chat's history rendered again) runs only the tokens from there.
  void truncate(int64_t length);

 private:
  friend class Qwen3Model;
  // Grows the buffers (copying the cached tokens) to hold at least `tokens`.
  void make_room(int64_t tokens);
  // Writes the new tokens' keys and values [B, S, Hkv, head_dim] at positions length() .. +S-1 of
  // `layer` and returns the new queries' attention over every cached position after each row's
  // padding (ops::cached_attention); into an empty cache (the prompt), the causal attention of
  // ops::attention, the training kernels, with each row's padding a document of its own.
  Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, double scale);
  // Sets padding_ (one count per row, or empty) and first_key_, its copy on the model's device.
  void set_padding(std::vector<int64_t> padding);
  std::vector<Tensor> k_, v_;  // per layer [B, allocated, Hkv, head_dim] in the compute dtype
  int64_t length_ = 0, capacity_ = 0, allocated_ = 0, batch_ = 0;
  std::vector<int64_t> padding_;  // per row, or empty
  Tensor first_key_;              // padding_ as i64 [B] on the model's device (cached_attention)
  const Qwen3Model* owner_ = nullptr;
};

// Expert parallelism: the experts of every MoE layer split into `count` equal runs, of which this
// model holds run `index` (nn/expert_parallel.h). The ranks holding the same run shard its block as
// FSDP shards every block (torchtitan's dp_shard_mod_ep): this model keeps slice `shard` of it.
struct ExpertSplit {
  int64_t index = 0, count = 1;
  nn::BlockShard shard = {};
};

class Qwen3Model {
 public:
  // compute_dtype: F32, or BF16 (weights cast from the f32 masters on use), or F64 (tests).
  // Parameters, gradients and activations live on `device` (cpu, cuda, or meta for planning).
  // `shard`: every block born sharded (nn::ParamBlock), for a data-parallel rank of a sharded plan.
  // Purpose::Inference: a model that is never trained (generation, evaluation, export), whose
  // blocks hold no gradients (an untrainable nn::ParamBlock): the weights' memory alone.
  // `experts`: with count > 1, every MoE layer holds only its run of experts (E / count of them) in
  // a block of its own ("layers.{i}.experts", after the head block, born sharded by experts.shard),
  // and its forward exchanges tokens with the models holding the others (set_expert_exchange).
  explicit Qwen3Model(const ModelArgs& args, DType compute_dtype = DType::F32, Device device = Device::CPU,
                      nn::BlockShard shard = {}, Purpose purpose = Purpose::Training,
                      ExpertSplit experts = {});
  // The parameters point into the model's own blocks, so a copy would point into the original's.
  // A move keeps them valid for the moved-to model (the blocks' storage moves with it); the
  // moved-from one is left unusable.
  Qwen3Model(const Qwen3Model&) = delete;
  Qwen3Model& operator=(const Qwen3Model&) = delete;
  Qwen3Model(Qwen3Model&&) = default;
  Qwen3Model& operator=(Qwen3Model&&) = delete;

  const ModelArgs& args() const { return args_; }
  DType compute_dtype() const { return compute_dtype_; }
  Device device() const { return device_; }
  void set_checkpointing(Checkpointing layers) { checkpointing_ = layers; }
  // Memory the fused loss may spend keeping the [tokens, V] logits from forward to backward
  // instead of recomputing them (a quarter of its FLOPs); 0 always recomputes.
  void set_keep_logits_bytes(int64_t bytes) { keep_logits_bytes_ = bytes; }

  // input_ids, targets: i64 [B, S]; targets are already aligned with positions (the next
  // token), -100 where ignored. `loss` = ce_weight * ce (+ aux_weight * coef * aux when
  // args.output_router_logits): a training step weighs each micro-batch's mean cross-entropy by its
  // share of the step's targets, and its aux loss by 1 / micro-batches (TrainStep). `rows`: their
  // documents and padding.
  LossOutput forward_loss(const Tensor& input_ids, const Tensor& targets, double ce_weight = 1,
                          double aux_weight = 1, const RowContents& rows = {});
  // Full logits [B, S, V] in f32 (debug dump, evaluation). Also returns the aux loss for MoE.
  Tensor forward_logits(const Tensor& input_ids, Tensor* aux_loss = nullptr);
  // An empty KV cache for `batch` rows of up to `capacity` tokens (at most max_seq_len), on the
  // model's device in its compute dtype: 2 x layers x batch x kv_heads x head_dim values per token.
  // `left_padding`: empty, or per row the padding positions its prompt starts with (KVCache).
  KVCache kv_cache(int64_t batch, int64_t capacity, std::vector<int64_t> left_padding = {}) const;
  // Inference (no gradient is recorded): runs input_ids [B, S] at positions cache.length() ..
  // cache.length() + S - 1, attending over the cached tokens too, adds their keys and values to
  // `cache`, and returns the f32 [B, V] logits of each row's last new position only (generation pays
  // the output projection once per step, not once per position). A prompt goes in as one call, each
  // new token as the next.
  Tensor next_token_logits(const Tensor& input_ids, KVCache& cache);
  // As next_token_logits, the logits [B, last, V] of each row's last `last` new positions (1 <= last
  // <= S): teacher-forced scoring reads a continuation's every position from one call.
  Tensor cached_logits(const Tensor& input_ids, KVCache& cache, int64_t last);

  // Sharded data parallelism gathers and frees blocks at these points (nn::BlockHooks); null (the
  // default) for a model whose blocks are always whole. `hooks` must outlive its use.
  void set_block_hooks(nn::BlockHooks* hooks) { hooks_ = hooks; }
  // The group holding the other runs of experts, for a model built with an ExpertSplit: each rank
  // of it runs this model's forward and backward alongside (their exchanges are collectives).
  // `exchange` must outlive its use.
  void set_expert_exchange(nn::ExpertExchange* exchange) { exchange_ = exchange; }
  const ExpertSplit& expert_split() const { return experts_; }
  // The blocks of split experts (after the head block).
  bool is_expert_block(size_t block) const { return block > size_t(args_.n_layers) + 1; }
  // The block of the layer whose forward and backward use the experts of `block` (an expert block).
  size_t layer_block_of_experts(size_t block) const;
  // The blocks with backward points (the layers: blocks()[1..n_layers]); the embedding and head
  // blocks serve both ends of the step.
  bool is_layer_block(size_t block) const { return block >= 1 && block <= size_t(args_.n_layers); }
  // Whether a step casting the weights per use (Qwen3Model::w) would hold the compute-dtype copy of
  // all of `block` from its forward to its backward anyway (the GEMMs save what they read): every
  // block but the embedding of an untied model (only the rows of the step's tokens are looked up)
  // and the layers activation checkpointing covers, with their experts (their casts go with the
  // layer's forward and come again in its recompute). Such a block's persistent copy costs no
  // memory beyond the step's (dist::BlockRole::copy_is_free).
  bool holds_whole_weights_through_step(size_t block) const;

  std::vector<nn::ParamBlock>& blocks() { return blocks_; }
  const std::vector<nn::ParamBlock>& blocks() const { return blocks_; }
  nn::Param* find_param(const std::string& native_name);  // null if absent
  std::vector<nn::Param*> params();
  int64_t num_params() const;

  void initialize(uint64_t seed, InitScheme scheme = InitScheme::HuggingFace);
  void zero_grad();

  // Aux-loss-free load balancing (torchtitan): a per-layer bias added to the router
  // scores for expert selection only. Enabled when non-empty.
  std::vector<Tensor>& expert_bias() { return expert_bias_; }
  void enable_expert_bias();
  // Tokens routed to each expert in the last forward, per layer (i64 [E]; undefined for dense layers);
  // padding (RowContents::lengths) not counted.
  const std::vector<Tensor>& last_expert_counts() const { return last_counts_; }
  // The balancing policy, applied once per optimizer step: every expert's bias moves by `coeff`
  // towards balance, up when the expert received fewer tokens than the mean of its layer in
  // `counts` (per layer, i64 [E] as last_expert_counts, or [micro-batches, E]: the rows are
  // summed), down when more; the layer's biases keep their mean (ops::update_expert_bias). No-op
  // without a bias.
  void update_expert_bias(const std::vector<Tensor>& counts, double coeff);
  // The biases as plain numbers (one list per layer, empty for dense layers), for train state
  // files; set_expert_bias_values restores them (layers the model has no bias for are skipped).
  std::vector<std::vector<double>> expert_bias_values() const;
  void set_expert_bias_values(const std::vector<std::vector<double>>& values);

 private:
  struct Layer {
    nn::Param *attention_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm;
    nn::Param *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;              // dense SwiGLU
    nn::Param *router = nullptr, *e_w1 = nullptr, *e_w2 = nullptr, *e_w3 = nullptr;  // MoE
    bool moe = false;
  };
  struct RouterStats {
    Tensor probs;
    ops::ExpertIndices indices;
  };

  // What every layer of one forward reads besides the hidden states: the rope positions, the
  // documents attention is cut into, and the tokens that are not padding (the expert counts')
  // (shared with the recomputes of checkpointed layers).
  struct Sequence {
    ops::RopePositions positions;
    std::shared_ptr<const ops::DocumentSpans> documents;
    std::shared_ptr<const std::vector<ops::TokenRange>> counted;  // empty: every token
    KVCache* cache = nullptr;  // generation: the earlier tokens' keys and values (next_token_logits)
  };
  // `counted`: the tokens that are not padding (empty: all of them).
  // `cache`: the tokens are the next ones of a generation (next_token_logits).
  Tensor hidden_states(const Tensor& input_ids, std::vector<RouterStats>* router,
                       const ops::DocumentSpans& documents = {}, std::vector<ops::TokenRange> counted = {},
                       KVCache* cache = nullptr);
  // One layer, recomputed in backward when activation checkpointing covers it.
  Tensor layer_block(int64_t i, const Tensor& h, const Sequence& seq, std::vector<RouterStats>* router);
  Tensor layer_forward(int64_t i, const Tensor& h, const Sequence& seq, std::vector<RouterStats>* router);
  Tensor attention(int64_t layer, const Layer& L, const Tensor& x, const Sequence& seq);
  Tensor feed_forward(const Layer& L, const Tensor& x);
  Tensor moe(int64_t layer, const Layer& L, const Tensor& x, const Sequence& seq,
             std::vector<RouterStats>* router);
  // Over the `counted` tokens (ops::moe_aux_loss; empty: all of them).
  Tensor aux_loss(const std::vector<RouterStats>& router,
                  const std::vector<ops::TokenRange>& counted = {}) const;
  Tensor w(const nn::Param* p) const;  // parameter in the compute dtype (autograd cast)
  // Whether p's block holds a gathered compute copy (sharded bf16 training), read instead of a cast.
  bool compute_copy_resident(const nn::Param* p) const;

  ModelArgs args_;
  DType compute_dtype_;
  Device device_;
  Checkpointing checkpointing_;
  // The fused loss computes the vocabulary's logits in chunks of this many entries.
  static constexpr int64_t kLossChunk = 8192;
  // 1 GiB: batch 2 x 512 x 151936 logits take 311 MB in bf16, 622 MB in f32; long sequences of
  // big-vocabulary models recompute instead.
  int64_t keep_logits_bytes_ = int64_t(1) << 30;
  std::vector<nn::ParamBlock> blocks_;
  nn::BlockHooks* hooks_ = nullptr;
  ExpertSplit experts_;
  std::vector<size_t> expert_block_layers_;  // per block of split experts, its layer's block
  nn::ExpertExchange* exchange_ = nullptr;
  nn::Param *tok_embeddings_ = nullptr, *norm_ = nullptr, *output_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<Tensor> expert_bias_, last_counts_;
};

// The modules the model announces through kernels::ModuleScope, which [kernels] substitution globs
// are matched against (tok_embeddings, layers.{i}(.attention|.feed_forward|.moe), norm, output),
// each with the ops its forward calls: a rule for an op its modules never run is an error.
// tests/models/module_ops_test.cpp checks the table against the ops a forward really calls.
// `experts_split`: of a model whose experts are split over ranks (ExpertSplit count > 1).
std::vector<kernels::ModuleOps> module_ops(const ModelArgs& args, bool experts_split = false);

}  // namespace titan::qwen3
