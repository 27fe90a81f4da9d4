#include "titan/models/qwen3/model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/substitution.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/cached_attention/cached_attention.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/embedding/embedding.h"
#include "titan/ops/linear/linear.h"
#include "titan/ops/moe/moe.h"
#include "titan/ops/rms_norm/rms_norm.h"
#include "titan/ops/rope/rope.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::qwen3 {

using nn::Init;
using nn::ParamSpec;

Qwen3Model::Qwen3Model(const ModelArgs& args, DType compute_dtype, Device device, nn::BlockShard shard,
                       Purpose purpose, ExpertSplit experts)
    : args_(args), compute_dtype_(compute_dtype), device_(device), experts_(experts) {
  const bool trainable = purpose == Purpose::Training;
  args_.validate();
  TITAN_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16 || compute_dtype == DType::F64,
              "Qwen3Model: compute dtype must be f32, bf16 or f64, got ", dtype_name(compute_dtype));
  const int64_t D = args_.dim, hd = args_.head_dim, q_dim = args_.n_heads * hd, kv_dim = args_.n_kv_heads * hd;
  TITAN_CHECK(experts_.count >= 1 && experts_.index >= 0 && experts_.index < experts_.count,
              "Qwen3Model: expert run ", experts_.index, " of ", experts_.count, " does not exist");
  const bool split = experts_.count > 1;
  if (split)
    TITAN_CHECK(args_.is_moe() && args_.num_experts % experts_.count == 0, "Qwen3Model: experts split in ",
                experts_.count, " runs (run ", experts_.index,
                "): the model must be a MoE whose num_experts (", args_.num_experts, ") the runs divide");
  TITAN_CHECK(split || experts_.shard.count == 1,
              "Qwen3Model: a model whose experts are not split has no "
              "block of experts to shard (ExpertSplit shard count ",
              experts_.shard.count, ")");
  std::vector<std::pair<int64_t, std::vector<ParamSpec>>>
      expert_blocks;  // split experts (by layer), after the head

  blocks_.reserve(size_t(2 * args_.n_layers + 2));
  blocks_.emplace_back("embedding", std::vector<ParamSpec>{{"tok_embeddings.weight", {args_.vocab_size, D}}},
                       device_, shard, trainable);
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    std::vector<ParamSpec> specs = {
        {p + "attention_norm.weight", {D}, Init::Ones},
        {p + "attention.wq.weight", {q_dim, D}},
        {p + "attention.wk.weight", {kv_dim, D}},
        {p + "attention.wv.weight", {kv_dim, D}},
        {p + "attention.q_norm.weight", {hd}, Init::Ones},
        {p + "attention.k_norm.weight", {hd}, Init::Ones},
        {p + "attention.wo.weight", {D, q_dim}},
        {p + "ffn_norm.weight", {D}, Init::Ones},
    };
    if (args_.is_moe_layer(i)) {
      const int64_t E = args_.num_experts, F = args_.moe_hidden_dim, local = E / experts_.count;
      specs.push_back({p + "moe.router.gate.weight", {E, D}});
      // This model's run of experts: element 0 is expert index * local's first element.
      const int64_t first = experts_.index * local * F * D;
      std::vector<ParamSpec> experts = {{p + "moe.experts.w1", {local, F, D}, Init::Normal, 0.02, first},
                                        {p + "moe.experts.w2", {local, D, F}, Init::Normal, 0.02, first},
                                        {p + "moe.experts.w3", {local, F, D}, Init::Normal, 0.02, first}};
      if (split)
        expert_blocks.emplace_back(i, std::move(experts));
      else
        specs.insert(specs.end(), experts.begin(), experts.end());
    } else {
      const int64_t F = args_.hidden_dim;
      specs.push_back({p + "feed_forward.w1.weight", {F, D}});
      specs.push_back({p + "feed_forward.w2.weight", {D, F}});
      specs.push_back({p + "feed_forward.w3.weight", {F, D}});
    }
    blocks_.emplace_back("layers." + std::to_string(i), specs, device_, shard, trainable);
  }
  std::vector<ParamSpec> head = {{"norm.weight", {D}, Init::Ones}};
  if (!args_.tie_embeddings) head.push_back({"output.weight", {args_.vocab_size, D}});
  blocks_.emplace_back("head", head, device_, shard, trainable);
  for (auto& [layer, specs] : expert_blocks) {
    blocks_.emplace_back("layers." + std::to_string(layer) + ".experts", specs, device_, experts_.shard,
                         trainable);
    expert_block_layers_.push_back(size_t(layer) + 1);
  }

  tok_embeddings_ = find_param("tok_embeddings.weight");
  norm_ = find_param("norm.weight");
  output_ = args_.tie_embeddings ? tok_embeddings_ : find_param("output.weight");
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    Layer L;
    L.attention_norm = find_param(p + "attention_norm.weight");
    L.wq = find_param(p + "attention.wq.weight");
    L.wk = find_param(p + "attention.wk.weight");
    L.wv = find_param(p + "attention.wv.weight");
    L.wo = find_param(p + "attention.wo.weight");
    L.q_norm = find_param(p + "attention.q_norm.weight");
    L.k_norm = find_param(p + "attention.k_norm.weight");
    L.ffn_norm = find_param(p + "ffn_norm.weight");
    L.moe = args_.is_moe_layer(i);
    if (L.moe) {
      L.router = find_param(p + "moe.router.gate.weight");
      L.e_w1 = find_param(p + "moe.experts.w1");
      L.e_w2 = find_param(p + "moe.experts.w2");
      L.e_w3 = find_param(p + "moe.experts.w3");
    } else {
      L.w1 = find_param(p + "feed_forward.w1.weight");
      L.w2 = find_param(p + "feed_forward.w2.weight");
      L.w3 = find_param(p + "feed_forward.w3.weight");
    }
    layers_.push_back(L);
  }
}

size_t Qwen3Model::layer_block_of_experts(size_t block) const {
  TITAN_CHECK(is_expert_block(block) && block < blocks_.size(), "qwen3: block ", block,
              " is not a block of split experts");
  return expert_block_layers_[block - size_t(args_.n_layers) - 2];
}

nn::Param* Qwen3Model::find_param(const std::string& name) {
  for (auto& b : blocks_)
    for (auto& p : b.params())
      if (p.name == name) return &p;
  return nullptr;
}

std::vector<nn::Param*> Qwen3Model::params() {
  std::vector<nn::Param*> out;
  for (auto& b : blocks_)
    for (auto& p : b.params()) out.push_back(&p);
  return out;
}

int64_t Qwen3Model::num_params() const {
  int64_t n = 0;
  for (auto& b : blocks_)
    for (auto& p : b.params()) n += shape_numel(p.shape);
  return n;
}

void Qwen3Model::initialize(uint64_t seed, InitScheme scheme) {
  // Every scheme starts from transformers' N(0, initializer_range), so re-initialising with another
  // scheme gives the same weights as a fresh model.
  for (auto* p : params())
    if (p->init == nn::Init::Normal) p->std = args_.initializer_range, p->truncate_at = 0;
  if (scheme == InitScheme::Torchtitan) {
    // Depth-scaled: output projections of each residual branch (and the MoE router, which
    // torchtitan initialises with its layer's std) shrink with depth.
    for (int64_t i = 0; i < args_.n_layers; ++i) {
      double scaled = 0.02 / std::sqrt(2.0 * double(i + 1));
      std::string p = "layers." + std::to_string(i) + ".";
      for (const char* n : {"attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
                            "moe.router.gate.weight", "moe.experts.w2", "moe.experts.w3"})
        if (auto* prm = find_param(p + n)) prm->std = scaled;
    }
    tok_embeddings_->std = 1.0;
    output_->std = 1.0 / std::sqrt(double(args_.dim));
    output_->truncate_at = 3;  // torchtitan's trunc_normal_ at +-3 std
  }
  // transformers zeroes the padding_idx row of the embedding (a tied lm_head shares it).
  tok_embeddings_->zero_row = args_.pad_token_id;
  // A sharded rank draws only its slices: the same values (ParamBlock::initialize).
  for (auto& b : blocks_) b.initialize(seed);
}

void Qwen3Model::zero_grad() {
  for (auto& b : blocks_) b.zero_grad();
}

void Qwen3Model::enable_expert_bias() {
  expert_bias_.clear();
  for (int64_t i = 0; i < args_.n_layers; ++i)
    expert_bias_.push_back(args_.is_moe_layer(i) ? Tensor::zeros({args_.num_experts}, DType::F32, device_) : Tensor());
}

void Qwen3Model::update_expert_bias(const std::vector<Tensor>& counts, double coeff) {
  for (size_t i = 0; i < expert_bias_.size(); ++i) {
    Tensor& bias = expert_bias_[i];
    if (!bias.defined()) continue;
    TITAN_CHECK(i < counts.size() && counts[i].defined() && counts[i].size(-1) == bias.numel(),
                "qwen3: expert counts of layer ", i, " are missing or not [..., ", bias.numel(), "]");
    ops::update_expert_bias(bias, counts[i], coeff);  // on the bias's device: no host read
  }
}

std::vector<std::vector<double>> Qwen3Model::expert_bias_values() const {
  std::vector<std::vector<double>> out;
  for (auto& b : expert_bias_) out.push_back(b.defined() ? b.to_vector() : std::vector<double>{});
  return out;
}

void Qwen3Model::set_expert_bias_values(const std::vector<std::vector<double>>& values) {
  for (size_t i = 0; i < expert_bias_.size() && i < values.size(); ++i) {
    if (!expert_bias_[i].defined()) continue;
    TITAN_CHECK(int64_t(values[i].size()) == expert_bias_[i].numel(), "qwen3: expert bias of layer ", i, " has ",
                values[i].size(), " values, expected ", expert_bias_[i].numel());
    Tensor host = Tensor::empty(expert_bias_[i].shape(), DType::F32);  // the bias may live on a device
    for (size_t e = 0; e < values[i].size(); ++e) host.data<float>()[e] = float(values[i][e]);
    expert_bias_[i].copy_from(host);
  }
}

std::vector<kernels::ModuleOps> module_ops(const ModelArgs& a, bool experts_split) {
  // As the forward below calls them; `cast` makes the compute-dtype copies of the weights, `index`
  // and `sum` are the range checks of the token ids and labels and the loss's target count.
  std::vector<kernels::ModuleOps> m = {
      {"tok_embeddings", {"embedding", "index", "cast"}},
      {"norm", {"rms_norm", "cast"}},
      {"output", {"linear_cross_entropy", "linear", "index", "sum", "cast"}}};
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const std::string l = "layers." + std::to_string(i);
    m.push_back({l, {"rms_norm", "add", "cast"}});
    m.push_back({l + ".attention", {"linear", "rms_norm", "rope", "attention", "cached_attention", "cast"}});
    if (a.is_moe_layer(i) && experts_split)  // rows gathered (and their indices checked) for the exchange
      m.push_back({l + ".moe",
                   {"linear", "router_topk", "embedding", "index", "moe_experts", "moe_combine", "cast"}});
    else if (a.is_moe_layer(i))
      m.push_back({l + ".moe", {"linear", "router_topk", "moe_experts", "cast"}});
    else
      m.push_back({l + ".feed_forward", {"linear", "swiglu", "cast"}});
  }
  return m;
}

bool Qwen3Model::holds_whole_weights_through_step(size_t block) const {
  if (block == 0) return args_.tie_embeddings;
  const size_t layer_block = is_expert_block(block) ? layer_block_of_experts(block) : block;
  if (is_layer_block(layer_block)) return !checkpointing_.covers(int64_t(layer_block) - 1);
  return true;  // the head: the final norm and the output weight
}

bool Qwen3Model::compute_copy_resident(const nn::Param* p) const {
  return p->compute_value.defined() && p->compute_value.storage()->resident() &&
         p->compute_value.dtype() == compute_dtype_;
}

Tensor Qwen3Model::w(const nn::Param* p) const {
  // A block gathered in the compute dtype (sharded bf16 training) is used as it is.
  return compute_copy_resident(p) ? p->compute_value : ops::cast(p->value, compute_dtype_);
}

// ---------------------------------------------------------------- forward

namespace {

// The tokens of rows of S before their padding, in the flattened [rows x S] tokens every MoE layer
// routes; none (all of them count) when no row has padding.
std::vector<ops::TokenRange> tokens_before_padding(const std::vector<int64_t>& lengths, int64_t S) {
  std::vector<ops::TokenRange> counted;
  if (std::all_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n == S; })) return counted;
  for (size_t r = 0; r < lengths.size(); ++r) {
    TITAN_CHECK(lengths[r] >= 0 && lengths[r] <= S, "qwen3: row ", r, " has ", lengths[r],
                " tokens before its padding, outside [0, ", S, "]");
    if (lengths[r] > 0) counted.push_back({int64_t(r) * S, int64_t(r) * S + lengths[r]});
  }
  TITAN_CHECK(!counted.empty(), "qwen3: every row is padding: no token for the aux loss");
  return counted;
}

}  // namespace

Tensor Qwen3Model::attention(int64_t layer, const Layer& L, const Tensor& x, const Sequence& seq) {
  kernels::ModuleScope scope("attention");
  const int64_t B = x.size(0), S = x.size(1), hd = args_.head_dim;
  Tensor q = ops::linear(x, w(L.wq)).reshape({B, S, args_.n_heads, hd});
  Tensor k = ops::linear(x, w(L.wk)).reshape({B, S, args_.n_kv_heads, hd});
  Tensor v = ops::linear(x, w(L.wv)).reshape({B, S, args_.n_kv_heads, hd});
  q = ops::rope(ops::rms_norm(q, w(L.q_norm), args_.norm_eps), seq.positions, args_.rope_theta);
  k = ops::rope(ops::rms_norm(k, w(L.k_norm), args_.norm_eps), seq.positions, args_.rope_theta);
  const double scale = 1.0 / std::sqrt(double(hd));
  Tensor o =
      seq.cache ? seq.cache->attend(layer, q, k, v, scale) : ops::attention(q, k, v, scale, *seq.documents);
  return ops::linear(o.reshape({B, S, args_.n_heads * hd}), w(L.wo));
}

Tensor Qwen3Model::feed_forward(const Layer& L, const Tensor& x) {
  kernels::ModuleScope scope("feed_forward");
  return ops::linear(ops::swiglu(ops::linear(x, w(L.w1)), ops::linear(x, w(L.w3))), w(L.w2));
}

Tensor Qwen3Model::moe(int64_t layer, const Layer& L, const Tensor& x, const Sequence& seq,
                       std::vector<RouterStats>* router) {
  kernels::ModuleScope scope("moe");
  const int64_t B = x.size(0), S = x.size(1), D = args_.dim;
  Tensor flat = x.reshape({B * S, D});
  Tensor logits = ops::linear(flat, w(L.router));
  Tensor bias = expert_bias_.empty() ? Tensor() : expert_bias_[size_t(layer)];
  ops::RouterOutput r = ops::router_topk(logits, args_.top_k, args_.norm_topk_prob, bias);
  if (router) router->push_back({r.probs, r.indices});
  if (last_counts_.size() < size_t(args_.n_layers)) last_counts_.resize(size_t(args_.n_layers));
  // What the expert bias balances: the real tokens' assignments (the router counted every token).
  last_counts_[size_t(layer)] = seq.counted->empty() ? r.counts : ops::expert_counts(r.indices, *seq.counted);
  Tensor y;
  if (experts_.count > 1) {
    TITAN_CHECK(exchange_ && exchange_->size() == experts_.count && exchange_->rank() == experts_.index,
                "qwen3: layer ", layer, " holds expert run ", experts_.index, " of ", experts_.count,
                " and needs the group of ranks holding the others (set_expert_exchange), got ",
                exchange_ ? std::to_string(exchange_->size()) + " ranks" : std::string("none"));
    y = nn::expert_parallel_experts(flat, r.weights, r.indices, w(L.e_w1), w(L.e_w3), w(L.e_w2), *exchange_);
  } else {
    y = ops::moe_experts(flat, r.weights, r.indices, w(L.e_w1), w(L.e_w3), w(L.e_w2));
  }
  return y.reshape({B, S, D});
}

Tensor Qwen3Model::layer_forward(int64_t i, const Tensor& h_in, const Sequence& seq,
                                 std::vector<RouterStats>* router) {
  const Layer& L = layers_[size_t(i)];
  kernels::ModuleScope scope("layers." + std::to_string(i));
  Tensor h = ops::add(h_in, attention(i, L, ops::rms_norm(h_in, w(L.attention_norm), args_.norm_eps), seq));
  Tensor x = ops::rms_norm(h, w(L.ffn_norm), args_.norm_eps);
  return ops::add(h, L.moe ? moe(i, L, x, seq, router) : feed_forward(L, x));
}

Tensor Qwen3Model::hidden_states(const Tensor& input_ids, std::vector<RouterStats>* router,
                                 const ops::DocumentSpans& documents, std::vector<ops::TokenRange> counted,
                                 KVCache* cache) {
  TITAN_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::I64, "qwen3: input_ids must be i64 [B, S], got ",
              input_ids.str());
  const int64_t S = input_ids.size(1), first = cache ? cache->length() : 0;
  TITAN_CHECK(first + S <= args_.max_seq_len, "qwen3: sequence length ", first + S, " exceeds max_seq_len ",
              args_.max_seq_len);
  // One set of positions for the 2 x n_layers rope calls (and their recomputes) of this forward.
  // Positions run on across documents, as torchtitan's block-causal training does, and after the
  // cached tokens in generation.
  const Sequence seq{ops::sequential_positions(input_ids.size(0), S, device_, first,
                                               cache ? cache->left_padding() : std::vector<int64_t>()),
                     std::make_shared<const ops::DocumentSpans>(documents),
                     std::make_shared<const std::vector<ops::TokenRange>>(std::move(counted)), cache};

  // Block numbers as in blocks(): the embedding, the layers, the head.
  const size_t embedding_block = 0, head_block = size_t(args_.n_layers) + 1;
  if (hooks_) hooks_->before_forward(embedding_block);
  Tensor h;
  {
    kernels::ModuleScope scope("tok_embeddings");
    // Gather from the f32 table, then cast: the same values as gathering from a cast table, which
    // is what a sharded bf16 run gathered into the block's compute copy (then read as it is).
    const nn::Param* table = tok_embeddings_;
    h = ops::cast(
        ops::embedding(input_ids, compute_copy_resident(table) ? table->compute_value : table->value,
                       args_.pad_token_id),
        compute_dtype_);
  }
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    const size_t block = size_t(i) + 1;
    if (hooks_) {
      // Autograd reaches this point of the tape after the layer's whole backward.
      hooks_->before_forward(block);
      h = autograd::on_backward("layers." + std::to_string(i) + ".done", h,
                                [hooks = hooks_, block] { hooks->after_backward(block); });
    }
    h = layer_block(i, h, seq, router);
    if (hooks_) {
      hooks_->after_forward(block);
      // ... and this one before it.
      h = autograd::on_backward("layers." + std::to_string(i) + ".start", h,
                                [hooks = hooks_, block] { hooks->before_backward(block); });
    }
  }
  if (hooks_) hooks_->before_forward(head_block);
  kernels::ModuleScope scope("norm");
  return ops::rms_norm(h, w(norm_), args_.norm_eps);
}

Tensor Qwen3Model::layer_block(int64_t i, const Tensor& h, const Sequence& seq,
                               std::vector<RouterStats>* router) {
  if (!checkpointing_.covers(i) || !autograd::grad_enabled()) return layer_forward(i, h, seq, router);
  // Recompute the whole layer in backward; router statistics are block outputs so the
  // aux loss still reaches the router.
  const bool moe_layer = layers_[size_t(i)].moe && router;
  // The forward's routing, kept as the router made it (block outputs are plain tensors; the
  // indices need no gradient, only the probs do).
  auto routed = std::make_shared<ops::ExpertIndices>();
  auto fn = [this, i, seq, moe_layer, routed](const std::vector<Tensor>& in) {
    std::vector<RouterStats> stats;
    Tensor out = layer_forward(i, in[0], seq, moe_layer ? &stats : nullptr);
    std::vector<Tensor> outs{out};
    if (moe_layer) {
      outs.push_back(stats[0].probs);
      if (!routed->tensor().defined()) *routed = stats[0].indices;  // the recompute routes alike
    }
    return outs;
  };
  auto outs = autograd::recompute("layers." + std::to_string(i), fn, {h});
  if (moe_layer) router->push_back({outs[1], *routed});
  return outs[0];
}

Tensor Qwen3Model::aux_loss(const std::vector<RouterStats>& router,
                            const std::vector<ops::TokenRange>& counted) const {
  std::vector<Tensor> probs;
  std::vector<ops::ExpertIndices> indices;
  for (auto& r : router) {
    probs.push_back(r.probs);
    indices.push_back(r.indices);
  }
  return ops::moe_aux_loss(probs, indices, args_.num_experts, args_.top_k, counted);
}

LossOutput Qwen3Model::forward_loss(const Tensor& input_ids, const Tensor& targets, double ce_weight,
                                    double aux_weight, const RowContents& rows) {
  TITAN_CHECK(targets.shape() == input_ids.shape() && targets.dtype() == DType::I64,
              "qwen3: targets must be i64 with the shape of input_ids ", input_ids.str(), ", got ", targets.str());
  TITAN_CHECK(rows.lengths.empty() || int64_t(rows.lengths.size()) == input_ids.size(0),
              "qwen3: ", rows.lengths.size(), " row lengths for input_ids ", input_ids.str());
  const std::vector<ops::TokenRange> counted = tokens_before_padding(rows.lengths, input_ids.size(1));
  std::vector<RouterStats> router;
  Tensor h = hidden_states(input_ids, args_.is_moe() ? &router : nullptr, rows.documents, counted);
  const int64_t N = h.size(0) * h.size(1);
  LossOutput out;
  {
    kernels::ModuleScope scope("output");
    out.ce_loss = ops::linear_cross_entropy(h.reshape({N, args_.dim}), w(output_), targets.reshape({N}), -100,
                                            kLossChunk, ops::Reduction::Mean, &out.num_targets, true,
                                            keep_logits_bytes_);
  }
  out.loss = ce_weight == 1 ? out.ce_loss : ops::scale(out.ce_loss, ce_weight);
  if (args_.is_moe() && args_.output_router_logits) {
    out.aux_loss = aux_loss(router, counted);
    out.loss = ops::add(out.loss, ops::scale(out.aux_loss.reshape(out.ce_loss.shape()),
                                             args_.router_aux_loss_coef * aux_weight));
  } else if (args_.is_moe()) {
    // Logged only: recorded, its node (holding every layer's [tokens, experts] probabilities) would
    // stay on the tape, unreached by the backward, until the next step's backward pruned it.
    autograd::NoGradGuard logged_only;
    out.aux_loss = aux_loss(router, counted);
  }
  return out;
}

Tensor Qwen3Model::forward_logits(const Tensor& input_ids, Tensor* aux) {
  std::vector<RouterStats> router;
  Tensor h = hidden_states(input_ids, args_.is_moe() ? &router : nullptr);
  kernels::ModuleScope scope("output");
  Tensor logits = ops::linear(h, w(output_));
  if (aux && args_.is_moe()) *aux = aux_loss(router);
  return ops::cast(logits, compute_dtype_ == DType::F64 ? DType::F64 : DType::F32);
}

// ---------------------------------------------------------------- generation

KVCache Qwen3Model::kv_cache(int64_t batch, int64_t capacity, std::vector<int64_t> left_padding) const {
  TITAN_CHECK(batch >= 1 && capacity >= 1 && capacity <= args_.max_seq_len,
              "kv_cache: need batch >= 1 and 1 <= capacity <= max_seq_len (", args_.max_seq_len,
              "), got batch ", batch, ", capacity ", capacity);
  TITAN_CHECK(left_padding.empty() || int64_t(left_padding.size()) == batch,
              "kv_cache: ", left_padding.size(), " left-padding counts for ", batch, " rows");
  KVCache cache;
  for (size_t b = 0; b < left_padding.size(); ++b)
    TITAN_CHECK(left_padding[b] >= 0 && left_padding[b] < capacity, "kv_cache: row ", b, "'s left padding ",
                left_padding[b], " must be in [0, capacity ", capacity, ")");
  for (int64_t i = 0; i < args_.n_layers; ++i)
    for (auto* side : {&cache.k_, &cache.v_})
      side->push_back(Tensor::empty({batch, 0, args_.n_kv_heads, args_.head_dim}, compute_dtype_, device_));
  cache.capacity_ = capacity;
  cache.batch_ = batch;
  cache.owner_ = this;
  cache.set_padding(std::move(left_padding));
  return cache;
}

void KVCache::make_room(int64_t tokens) {
  if (tokens <= allocated_) return;
  // Doubling keeps the copies to about one per cached token over a whole generation.
  const int64_t grown = std::min(capacity_, std::max({tokens, 2 * allocated_, int64_t(64)}));
  for (auto* side : {&k_, &v_})
    for (Tensor& t : *side) {
      Tensor bigger = Tensor::empty({batch_, grown, t.size(2), t.size(3)}, t.dtype(), t.device());
      if (length_ > 0) bigger.narrow(1, 0, length_).copy_from(t.narrow(1, 0, length_));
      t = bigger;
    }
  allocated_ = grown;
}

Tensor KVCache::attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t S = k.size(1);
  Tensor& k_cache = k_[size_t(layer)];
  Tensor& v_cache = v_[size_t(layer)];
  k_cache.narrow(1, length_, S).copy_from(k);
  v_cache.narrow(1, length_, S).copy_from(v);
  // The prompt attends over its own keys only: the training kernels, the fastest for many queries,
  // with a row's padding cut off as a document of its own (its rows are never read).
  if (length_ == 0) {
    ops::DocumentSpans documents;
    const int64_t B = q.size(0);
    for (int64_t b = 0; b < B && !padding_.empty(); ++b) {
      documents.starts.push_back(b * S);
      if (padding_[size_t(b)] > 0 && padding_[size_t(b)] < S)
        documents.starts.push_back(b * S + padding_[size_t(b)]);
    }
    return ops::attention(q, k, v, scale, documents);
  }
  return ops::cached_attention(q, k_cache, v_cache, length_ + S, scale, first_key_);
}

void KVCache::set_padding(std::vector<int64_t> padding) {
  first_key_ = padding.empty() ? Tensor()
                               : Tensor::from_vector(padding, {int64_t(padding.size())}).to(owner_->device());
  padding_ = std::move(padding);
}

void KVCache::add_row(const KVCache& alone) {
  TITAN_CHECK(alone.owner_ == owner_, "KVCache::add_row: the row's cache was made by another model");
  TITAN_CHECK(alone.batch_ == 1 && alone.length_ >= 1 && alone.length_ <= length_,
              "KVCache::add_row: need one row of 1 .. ", length_, " cached positions, got ", alone.batch_,
              " rows of ", alone.length_);
  const int64_t L = alone.length_, pad = length_ - L + (alone.padding_.empty() ? 0 : alone.padding_[0]);
  for (size_t side = 0; side < 2; ++side)
    for (size_t layer = 0; layer < k_.size(); ++layer) {
      Tensor& t = side == 0 ? k_[layer] : v_[layer];
      const Tensor& row = side == 0 ? alone.k_[layer] : alone.v_[layer];
      Tensor bigger = Tensor::empty({batch_ + 1, allocated_, t.size(2), t.size(3)}, t.dtype(), t.device());
      bigger.narrow(0, 0, batch_).narrow(1, 0, length_).copy_from(t.narrow(1, 0, length_));
      Tensor last = bigger.narrow(0, batch_, 1);
      if (length_ > L) last.narrow(1, 0, length_ - L).fill(0);  // padding: never read, not left uninitialised
      last.narrow(1, length_ - L, L).copy_from(row.narrow(1, 0, L));
      t = bigger;
    }
  std::vector<int64_t> padding = padding_.empty() ? std::vector<int64_t>(size_t(batch_), 0) : padding_;
  padding.push_back(pad);
  set_padding(std::move(padding));
  ++batch_;
}

void KVCache::truncate(int64_t length) {
  const int64_t padded = padding_.empty() ? 0 : *std::max_element(padding_.begin(), padding_.end());
  TITAN_CHECK(length >= padded && length <= length_, "KVCache::truncate: keep ", length, " positions of ",
              length_, padded > 0 ? " (at least the rows' padding, " + std::to_string(padded) + ")" : "");
  length_ = length;
}

void KVCache::select_rows(const std::vector<int64_t>& rows) {
  TITAN_CHECK(!rows.empty(), "KVCache::select_rows: select at least one row");
  bool increasing = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    TITAN_CHECK(rows[i] >= 0 && rows[i] < batch_, "KVCache::select_rows: row ", rows[i], " at ", i,
                " is not one of the cache's ", batch_);
    increasing = increasing && rows[i] >= int64_t(i) && (i == 0 || rows[i] > rows[i - 1]);
  }
  const int64_t selected = int64_t(rows.size());
  bool identity = selected == batch_;
  for (int64_t i = 0; i < selected && identity; ++i) identity = rows[size_t(i)] == i;
  if (identity) return;
  for (auto* side : {&k_, &v_})
    for (Tensor& t : *side) {
      if (increasing) {
        // Row rows[i] moves down to i in place: every source lies at or after its destination and
        // after every earlier destination, so copying in order never overwrites a row still to be read.
        for (int64_t i = 0; i < selected && length_ > 0; ++i)
          if (rows[size_t(i)] != i)
            t.narrow(0, i, 1)
                .narrow(1, 0, length_)
                .copy_from(t.narrow(0, rows[size_t(i)], 1).narrow(1, 0, length_));
        t = t.narrow(0, 0, selected);
      } else {  // a row taken twice or moved up: new buffers, one copy per run of consecutive rows
        Tensor chosen = Tensor::empty({selected, allocated_, t.size(2), t.size(3)}, t.dtype(), t.device());
        for (int64_t i = 0, run = 1; i < selected && length_ > 0; i += run) {
          for (run = 1; i + run < selected && rows[size_t(i + run)] == rows[size_t(i)] + run;) ++run;
          chosen.narrow(0, i, run)
              .narrow(1, 0, length_)
              .copy_from(t.narrow(0, rows[size_t(i)], run).narrow(1, 0, length_));
        }
        t = chosen;
      }
    }
  if (!padding_.empty()) {
    std::vector<int64_t> padding;
    for (int64_t r : rows) padding.push_back(padding_[size_t(r)]);
    set_padding(std::move(padding));
  }
  batch_ = selected;
}

Tensor Qwen3Model::next_token_logits(const Tensor& input_ids, KVCache& cache) {
  const Tensor logits = cached_logits(input_ids, cache, 1);
  return logits.reshape({logits.size(0), logits.size(2)});
}

Tensor Qwen3Model::cached_logits(const Tensor& input_ids, KVCache& cache, int64_t last) {
  TITAN_CHECK(input_ids.dim() == 2 && input_ids.size(1) >= 1,
              "next_token_logits: input_ids must be [B, S >= 1], got ", input_ids.str());
  TITAN_CHECK(cache.owner_ == this, "next_token_logits: the KV cache was made by another model (kv_cache)");
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  TITAN_CHECK(last >= 1 && last <= S, "cached_logits: the logits of the last ", last, " of ", S,
              " new positions (1 .. ", S, ")");
  TITAN_CHECK(B == cache.batch(), "next_token_logits: ", B, " rows for a KV cache of ", cache.batch());
  TITAN_CHECK(S <= cache.capacity() - cache.length(), "next_token_logits: ", cache.length(), " cached + ", S,
              " new tokens pass the KV cache's capacity (", cache.capacity(), ")");
  autograd::NoGradGuard no_grad;
  cache.make_room(cache.length() + S);
  Tensor h = hidden_states(input_ids, nullptr, {}, {}, &cache);
  cache.length_ += S;  // only once every layer holds the new tokens (an error above leaves it as it was)
  Tensor tail = h.narrow(1, S - last, last).contiguous().reshape({B * last, args_.dim});
  kernels::ModuleScope scope("output");
  return ops::cast(ops::linear(tail, w(output_)), compute_dtype_ == DType::F64 ? DType::F64 : DType::F32)
      .reshape({B, last, args_.vocab_size});
}

}  // namespace titan::qwen3
