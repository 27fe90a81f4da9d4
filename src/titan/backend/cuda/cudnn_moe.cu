// cuDNN's MoE grouped matmul (see cudnn_moe.h): one operation, CUDNN_BACKEND_OPERATION_MOE_GROUPED_
// MATMUL_DESCRIPTOR in mode NONE (the tokens already in expert order), as cudnn_frontend's
// moe_grouped_matmul node emits it: tokens [1, rows, K], weights [E, K, N] declared with K
// contiguous (our [E, N, K] storage), first-token offsets [E, 1, 1] int32, output [1, rows, N].
#include <atomic>
#include <exception>
#include <string>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/backend/cuda/cudnn_graph.h"
#include "titan/backend/cuda/cudnn_moe.h"
#include "titan/core/check.h"

namespace titan::cuda {
namespace {

using cudnn::Desc;
using cudnn::GraphBuilder;

enum Uid : int64_t { kTokens = 1, kWeights, kFirst, kOut };

cudnnDataType_t out_type(DType t) { return t == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16; }

GraphBuilder grouped_matmul_graph(const GroupedMatmulShape& s) {
  GraphBuilder g;
  const Desc& tokens = g.tensor(kTokens, {1, s.rows, s.K}, {s.rows * s.K, s.K, 1}, CUDNN_DATA_BFLOAT16);
  const Desc& weights = g.tensor(kWeights, {s.E, s.K, s.N}, {s.N * s.K, 1, s.K}, CUDNN_DATA_BFLOAT16);
  const Desc& first = g.tensor(kFirst, {s.E, 1, 1}, {1, 1, 1}, CUDNN_DATA_INT32);
  const Desc& out = g.tensor(kOut, {1, s.rows, s.N}, {s.rows * s.ldc, s.ldc, 1}, out_type(s.out));
  Desc op(CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR, "MoE grouped matmul operation");
  cudnnMoeGroupedMatmulMode_t mode = CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
  op.set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, 1, &mode)
      .set_type(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, CUDNN_DATA_FLOAT)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, tokens)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, weights)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, first)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, out);
  op.finalize();
  g.add_operation(std::move(op));
  return g;
}

std::string describe(const GroupedMatmulShape& s) {
  return "MoE grouped matmul rows=" + std::to_string(s.rows) + " K=" + std::to_string(s.K) +
         " N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) + " ldc=" + std::to_string(s.ldc) + " -> " +
         std::string(dtype_name(s.out));
}

}  // namespace

std::string cudnn_grouped_matmul_unsupported(const GroupedMatmulShape& s) {
  if (s.K % 8 != 0 || s.N % 8 != 0 || s.ldc % 8 != 0)
    return "cuDNN's grouped matmul needs K, N and the output row stride multiples of 8, got K=" +
           std::to_string(s.K) + " N=" + std::to_string(s.N) + " ldc=" + std::to_string(s.ldc);
  if (s.rows >= (int64_t(1) << 31)) return "cuDNN's grouped matmul takes int32 row offsets: too many rows";
  if (s.out != DType::BF16 && s.out != DType::F32) return "cuDNN's grouped matmul writes bf16 or f32";
  return "";
}

std::string cudnn_grouped_matmul_unavailable() {
  const cudnn::Api& a = cudnn::api();
  if (!a.error.empty()) return a.error;
  if (cudnn::runtime_version() < 91800)
    return "cuDNN " + cudnn_version_text() + " is older than 9.18, the first with a usable MoE grouped matmul";
  return "";
}

namespace {

std::atomic<int64_t> calls{0};

// The plan of this shape (its rows change with the token count of a micro-batch: a short last one,
// evaluation), from a cache of the most recent (cudnn::PlanCache; never destroyed, as
// cudnn_attention.cu's: cuDNN's engine libraries may be gone at exit). A shape whose plan did not
// build keeps its error: asked again (every layer's backward, every step), it fails at once.
std::shared_ptr<const cudnn::Plan> plan_for(const GroupedMatmulShape& s) {
  std::string why = cudnn_grouped_matmul_unavailable();
  if (why.empty()) why = cudnn_grouped_matmul_unsupported(s);
  TITAN_CHECK(why.empty(), "moe (cudnn): ", why);
  static auto& plans = *new cudnn::PlanCache(10000);  // (as cudnn_attention.cu's)
  const std::string what = describe(s);
  return plans.get(what, [&] { return cudnn::finalize_plan(grouped_matmul_graph(s), what); });
}

}  // namespace

std::string cudnn_grouped_matmul_plan_error(const GroupedMatmulShape& s) {
  try {
    plan_for(s);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

int64_t cudnn_grouped_matmul_calls() { return calls.load(); }

void cudnn_grouped_matmul(void* stream, const GroupedMatmulShape& s, const void* tokens, const void* weights,
                          const int32_t* first, void* out) {
  if (s.rows == 0) return;
  const std::shared_ptr<const cudnn::Plan> plan = plan_for(s);
  calls.fetch_add(1);
  cudnn::execute(*plan, stream,
                 {{kTokens, const_cast<void*>(tokens)}, {kWeights, const_cast<void*>(weights)},
                  {kFirst, const_cast<int32_t*>(first)}, {kOut, out}},
                 plan->workspace_bytes > 0 ? workspace(size_t(plan->workspace_bytes)) : nullptr, describe(s));
}

int64_t cudnn_grouped_matmul_engine_count(const GroupedMatmulShape& s, const std::string& device_json) {
  return cudnn::deviceless_engine_count(grouped_matmul_graph(s), device_json, "deviceless " + describe(s));
}

}  // namespace titan::cuda
