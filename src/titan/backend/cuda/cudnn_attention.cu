// cuDNN fused attention through the backend graph API (see cudnn_attention.h).
//
// cuDNN has no single "attention" call in every 9.x: its fused flash-attention engines recognise
// a graph of primitive operations (matmul, pointwise, reduction) in the shape cudnn_frontend's SDPA
// node emits, and this file emits that graph itself (cudnn_graph.h builds and runs it).
#include <cuda_runtime.h>

#include <limits>
#include <memory>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/backend/cuda/cudnn_attention.h"
#include "titan/backend/cuda/cudnn_graph.h"
#include "titan/core/check.h"

namespace titan::cuda {
namespace {

using cudnn::Desc;
using cudnn::GraphBuilder;
using cudnn::Plan;
using cudnn::runtime_version;

// ------------------------------------------------------------------ the attention graphs

// The graphs' tensors that reach memory (or the host, by value).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDqAccum
};

// Where a masked score goes: cuDNN from 9.10 takes -inf, older ones the lowest float (what
// cudnn_frontend passes to each).
float mask_value() {
  return runtime_version() >= 91000 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::lowest();
}

// cuDNN up to 9.15 computes a wrong backward when the sequence is not a multiple of its 128-row tile
// (cudnn_frontend then adds a padding mask); this file asks for whole tiles there instead.
bool backward_needs_whole_tiles() { return runtime_version() < 91600; }

// The dims and strides of the op's tensors in cuDNN's (batch, head, row, column) order.
struct Layout {
  std::vector<int64_t> q, q_strides;                 // q, out, dout, dq: [B, S, Hq, D] in memory
  std::vector<int64_t> kv, kv_strides;               // k, v, dk, dv: [B, S, Hkv, D] in memory
  std::vector<int64_t> kv_t, kv_t_strides;           // k or v read transposed: [B, Hkv, D, S]
  std::vector<int64_t> rows, rows_strides;           // stats, per-row sums: [B, Hq, S, 1]
  std::vector<int64_t> scores, scores_strides;       // S x S scores, virtual
  std::vector<int64_t> scores_t_strides;             // the same read transposed
  std::vector<int64_t> q_packed_strides;             // [B, Hq, S, D] contiguous (dq accumulator)
  explicit Layout(const SdpaShape& s) {
    const int64_t B = s.B, S = s.S, H = s.Hq, Hk = s.Hkv, D = s.D;
    q = {B, H, S, D}, q_strides = {S * H * D, D, H * D, 1};
    kv = {B, Hk, S, D}, kv_strides = {S * Hk * D, D, Hk * D, 1};
    kv_t = {B, Hk, D, S}, kv_t_strides = {S * Hk * D, D, 1, Hk * D};
    rows = {B, H, S, 1}, rows_strides = {H * S, S, 1, 1};
    scores = {B, H, S, S}, scores_strides = {H * S * S, S * S, S, 1};
    scores_t_strides = {H * S * S, S * S, 1, S};
    q_packed_strides = {H * S * D, S * D, D, 1};
  }
};

// scores -> scores with row < column set to the mask value (causal, diagonal at the top left):
// row and column indices, row >= column, select.
const Desc& causal_mask(GraphBuilder& g, const Layout& l, const Desc& scores) {
  const Desc& row = g.virt(l.scores, l.scores_strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, nullptr, 2);
  const Desc& col = g.virt(l.scores, l.scores_strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, col, nullptr, 3);
  const Desc& keep = g.virt(l.scores, l.scores_strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep, nullptr, -1, CUDNN_DATA_BOOLEAN);
  const Desc& masked = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, &g.scalar(kMaskValue), masked, &keep);
  return masked;
}

// scale · Q Kᵀ for every (query, key) pair, in f32 (`scale`: the graph's one by-value scale tensor).
const Desc& scaled_scores(GraphBuilder& g, const Layout& l, const Desc& q, const Desc& k_t, const Desc& scale) {
  const Desc& qk = g.virt(l.scores, l.scores_strides);
  g.matmul(q, k_t, qk);
  const Desc& scaled = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, &scale, scaled);
  return scaled;
}

// Forward for training: out = softmax(mask(scale Q K^T)) V and stats = logsumexp of each row.
GraphBuilder forward_graph(const SdpaShape& s) {
  const Layout l(s);
  GraphBuilder g;
  const Desc& q = g.tensor(kQ, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& k_t = g.tensor(kK, l.kv_t, l.kv_t_strides, CUDNN_DATA_BFLOAT16);
  const Desc& v = g.tensor(kV, l.kv, l.kv_strides, CUDNN_DATA_BFLOAT16);
  const Desc& out = g.tensor(kO, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& stats = g.tensor(kStats, l.rows, l.rows_strides, CUDNN_DATA_FLOAT);

  const Desc& masked = causal_mask(g, l, scaled_scores(g, l, q, k_t, g.scalar(kScale)));
  // softmax, with its statistics: max, exp(x - max), sum, stats = max + log(sum), p = exp / sum.
  const Desc& row_max = g.virt(l.rows, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  const Desc& shifted = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, &row_max, shifted);
  const Desc& e = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  const Desc& row_sum = g.virt(l.rows, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  const Desc& log_sum = g.virt(l.rows, l.rows_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, &log_sum, stats);
  // The second matmul takes its A operand in the input dtype (bf16), as cuDNN's engines require.
  const Desc& p = g.virt(l.scores, l.scores_strides, CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, e, &row_sum, p);
  g.matmul(p, v, out);
  return g;
}

// A kv head's gradient: grad = scores^T y per query head (scores read transposed, in bf16, as the
// engines take a matmul's A operand), summed over each group of query heads by cuDNN when there are
// fewer kv heads.
void kv_gradient(GraphBuilder& g, const Layout& l, const Desc& scores, const Desc& y, const Desc& grad) {
  const Desc& scores_t = g.virt(l.scores, l.scores_t_strides, CUDNN_DATA_BFLOAT16);
  g.reshape(scores, scores_t);
  if (l.q[1] == l.kv[1]) return g.matmul(scores_t, y, grad);
  const Desc& per_query_head = g.virt(l.q, l.q_packed_strides, CUDNN_DATA_BFLOAT16);
  g.matmul(scores_t, y, per_query_head);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_query_head, grad);
}

// Backward, as cudnn_frontend builds it (the non-deterministic form: dq accumulated in f32):
//   delta = rowsum(dO * O)                       (into the workspace)
//   P = exp(mask(scale Q K^T - stats))           dV = P^T dO
//   dS = scale * P * (dO V^T - delta)            dK = dS^T Q      dQ = dS K
// With fewer kv heads, dK and dV are formed per query head and summed over each group by cuDNN.
GraphBuilder backward_graph(const SdpaShape& s) {
  const Layout l(s);
  GraphBuilder g;
  const Desc& q = g.tensor(kQ, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& k_t = g.tensor(kK, l.kv_t, l.kv_t_strides, CUDNN_DATA_BFLOAT16);
  const Desc& v_t = g.tensor(kV, l.kv_t, l.kv_t_strides, CUDNN_DATA_BFLOAT16);
  const Desc& out = g.tensor(kO, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& dout = g.tensor(kDO, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& stats = g.tensor(kStats, l.rows, l.rows_strides, CUDNN_DATA_FLOAT);
  const Desc& dq = g.tensor(kDQ, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& dk = g.tensor(kDK, l.kv, l.kv_strides, CUDNN_DATA_BFLOAT16);
  const Desc& dv = g.tensor(kDV, l.kv, l.kv_strides, CUDNN_DATA_BFLOAT16);
  const Desc& softmax_sum = g.tensor(kSoftmaxSum, l.rows, l.rows_strides, CUDNN_DATA_FLOAT);
  const Desc& dq_accum = g.tensor(kDqAccum, l.q, l.q_packed_strides, CUDNN_DATA_FLOAT);
  const Desc& scale = g.scalar(kScale);

  // delta = rowsum(dO * O) (times 1: the frontend's dropout scale, kept for the engine's pattern).
  const Desc& d_o = g.virt(l.q, {l.q[1] * l.q[2] * l.q[3], l.q[2] * l.q[3], l.q[1] * l.q[3], 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, &out, d_o);
  const Desc& delta = g.virt(l.rows, l.rows_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, delta);
  g.pointwise(CUDNN_POINTWISE_MUL, delta, &g.scalar(kOne), softmax_sum);

  // P from the forward's statistics (subtracted before the mask, as the frontend does).
  const Desc& scaled = scaled_scores(g, l, q, k_t, scale);
  const Desc& shifted = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, &stats, shifted);
  const Desc& masked = causal_mask(g, l, shifted);
  const Desc& p = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p);

  // dV = P^T dO.
  kv_gradient(g, l, p, dout, dv);

  // dS = scale * P * (dO V^T - delta).
  const Desc& dp = g.virt(l.scores, l.scores_strides);
  g.matmul(dout, v_t, dp);
  const Desc& dp_centered = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &softmax_sum, dp_centered);
  const Desc& ds_unscaled = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, &p, ds_unscaled);
  const Desc& ds = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, &scale, ds);

  // dK = dS^T Q.
  kv_gradient(g, l, ds, q, dk);

  // dQ = dS K, accumulated in f32 in the workspace, then rounded into dq.
  const Desc& k = g.virt(l.kv, l.kv_strides);
  g.reshape(k_t, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  return g;
}

// Plans per shape (the scale is passed by value at each call, so it is not part of the key).
// A training step needs two plans per layer shape; block-causal attention two per document
// length, up to two per length a sequence can hold. The cache must hold a step's working set (a
// smaller one would evict each plan just before the next layer asks for it again): PyTorch's
// cuDNN plan cache holds 10000.
constexpr size_t kCachedPlans = 10000;

std::shared_ptr<const Plan> cached_plan(bool backward, const SdpaShape& s) {
  // Never destroyed, as the handle: at exit cuDNN's engine libraries (loaded after this cache was
  // made) may be gone before a destructor running here could release their plans.
  static auto& plans = *new cudnn::PlanCache(kCachedPlans);
  const std::string what = std::string(backward ? "backward" : "forward") + " B=" + std::to_string(s.B) +
                           " S=" + std::to_string(s.S) + " Hq=" + std::to_string(s.Hq) +
                           " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D);
  return plans.get(
      what, [&] { return cudnn::finalize_plan(backward ? backward_graph(s) : forward_graph(s), what); });
}

// cuDNN loaded and not a release its frontend refuses; the shape within the engines' rules.
void check_usable(const SdpaShape& s, bool backward) {
  cudnn::loaded_api();
  if (const std::string why = cudnn_attention_unavailable(); !why.empty())
    TITAN_FAIL("attention (cudnn): ", why);
  const std::string why = cudnn_attention_unsupported(s);
  TITAN_CHECK(why.empty(), "attention (cudnn): ", why);
  TITAN_CHECK(!backward || s.S > 1, "attention (cudnn): the backward needs a sequence longer than 1");
}

size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::string cudnn_attention_unavailable() {
  const cudnn::Api& a = cudnn::api();
  if (!a.error.empty()) return a.error;
  const int v = runtime_version();
  if (v >= 91000 && v < 91002)
    return "cuDNN " + cudnn_version_text() +
           " has known bugs in its fused attention (cudnn_frontend refuses 9.10.0 and 9.10.1); use 9.10.2 or "
           "later";
  return "";
}

std::string cudnn_attention_unsupported(const SdpaShape& s) {
  if (s.D % 8 != 0 || s.D > 128)
    return "cuDNN's fused attention takes head_dim a multiple of 8 up to 128, got " + std::to_string(s.D);
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return "query heads " + std::to_string(s.Hq) + " are not a multiple of kv heads " + std::to_string(s.Hkv);
  // cudnn_frontend refuses a backward over one row; the forward falls back with it (one pair).
  if (s.S < 2) return "cuDNN's fused attention backward needs a sequence of 2 or more, got " + std::to_string(s.S);
  // Whole 128-row tiles unless the loaded cuDNN is known to handle the rest (9.16 and later). A
  // missing library is not a shape reason: the call then fails naming it.
  if (s.S % 128 != 0 && cudnn::api().error.empty() && backward_needs_whole_tiles())
    return "cuDNN before 9.16 needs the sequence length a multiple of 128 for its backward, got " + std::to_string(s.S);
  return "";
}


}  // namespace titan::cuda

namespace titan::cuda {

void cudnn_attention_forward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                             void* out, float* lse) {
  check_usable(s, false);
  const std::shared_ptr<const Plan> held = cached_plan(false, s);
  const Plan& plan = *held;
  float scale = s.scale, masked = mask_value();
  cudnn::execute(plan, stream,
          {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out},
           {kStats, lse}, {kScale, &scale}, {kMaskValue, &masked}},
          plan.workspace_bytes > 0 ? workspace(size_t(plan.workspace_bytes)) : nullptr, "forward");
}

void cudnn_attention_backward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv) {
  check_usable(s, true);
  const std::shared_ptr<const Plan> held = cached_plan(true, s);
  const Plan& plan = *held;
  // One workspace: [dq accumulator, f32 B*Hq*S*D][row sums dO.O, f32 B*Hq*S][cuDNN's own].
  const size_t accum_bytes = round_up_256(size_t(s.B * s.Hq * s.S * s.D) * 4),
               sums_bytes = round_up_256(size_t(s.B * s.Hq * s.S) * 4);
  char* ws = static_cast<char*>(workspace(accum_bytes + sums_bytes + size_t(plan.workspace_bytes)));
  void* dq_accum = ws;
  void* sums = ws + accum_bytes;
  if (runtime_version() < 90600)  // later engines clear the accumulator themselves
    TITAN_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, accum_bytes, static_cast<cudaStream_t>(stream)));
  float scale = s.scale, masked = mask_value(), one = 1.f;
  cudnn::execute(plan, stream,
          {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
           {kO, const_cast<void*>(out)}, {kDO, const_cast<void*>(dout)}, {kStats, const_cast<float*>(lse)},
           {kDQ, dq}, {kDK, dk}, {kDV, dv}, {kScale, &scale}, {kMaskValue, &masked}, {kOne, &one},
           {kSoftmaxSum, sums}, {kDqAccum, dq_accum}},
          ws + accum_bytes + sums_bytes, "backward");
}

}  // namespace titan::cuda

namespace titan::cuda {

int64_t cudnn_attention_engine_count(const SdpaShape& s, bool backward, const std::string& device_json) {
  return cudnn::deviceless_engine_count(backward ? backward_graph(s) : forward_graph(s), device_json,
                                        std::string("deviceless attention ") + (backward ? "backward" : "forward"));
}

}  // namespace titan::cuda
