// cuDNN fused attention through the backend graph API (see cudnn_attention.h).
//
// cuDNN has no single "attention" call in every 9.x: its fused flash-attention engines recognise
// a graph of primitive operations (matmul, pointwise, reduction) in the shape cudnn_frontend's SDPA
// node emits, and this file emits that graph itself. Each operation is a backend descriptor whose
// attributes are set one by one and finalized; the graph's engine configurations come from cuDNN's
// heuristics and the first one that finalizes into an execution plan is kept per shape.
#include <cudnn_graph.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/backend/cuda/cudnn_attention.h"
#include "titan/core/check.h"

namespace titan::cuda {
namespace {

// ------------------------------------------------------------------ the library, through dlopen

// The backend API's entry points, looked up in libcudnn.so.9 (the cuDNN 9 ABI).
struct CudnnApi {
  size_t (*get_version)();
  const char* (*get_error_string)(cudnnStatus_t);
  void (*get_last_error_string)(char*, size_t);
  cudnnStatus_t (*create)(cudnnHandle_t*);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*create_descriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
  cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                 cudnnBackendAttributeType_t, int64_t, const void*);
  cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                 cudnnBackendAttributeType_t, int64_t, int64_t*, void*);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
  std::string error;  // why cuDNN cannot be loaded; empty when it can
};

template <class F>
bool look_up(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("libcudnn.so.9 has no ") + name;
  return fn != nullptr;
}

const CudnnApi& api() {
  static const CudnnApi loaded = [] {
    CudnnApi a{};
    // Never closed: plans and the handle live until the process exits.
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      a.error = std::string("cuDNN 9 could not be loaded (") + (err ? err : "unknown error") +
                "); put its lib folder on LD_LIBRARY_PATH (PyTorch wheels ship it as "
                "site-packages/nvidia/cudnn/lib)";
      return a;
    }
    look_up(lib, "cudnnGetVersion", a.get_version, a.error);
    look_up(lib, "cudnnGetErrorString", a.get_error_string, a.error);
    look_up(lib, "cudnnGetLastErrorString", a.get_last_error_string, a.error);
    look_up(lib, "cudnnCreate", a.create, a.error);
    look_up(lib, "cudnnSetStream", a.set_stream, a.error);
    look_up(lib, "cudnnBackendCreateDescriptor", a.create_descriptor, a.error);
    look_up(lib, "cudnnBackendDestroyDescriptor", a.destroy_descriptor, a.error);
    look_up(lib, "cudnnBackendSetAttribute", a.set_attribute, a.error);
    look_up(lib, "cudnnBackendGetAttribute", a.get_attribute, a.error);
    look_up(lib, "cudnnBackendFinalize", a.finalize, a.error);
    look_up(lib, "cudnnBackendExecute", a.execute, a.error);
    if (!a.error.empty()) return a;
    if (a.get_version() < 90000) a.error = "cuDNN " + std::to_string(a.get_version()) + " is older than 9.0";
    return a;
  }();
  return loaded;
}

// The library's functions, or an error naming why it could not be loaded.
const CudnnApi& loaded_api() {
  const CudnnApi& a = api();
  TITAN_CHECK(a.error.empty(), "attention (cudnn): ", a.error);
  return a;
}

// A titan::Error naming the call, cuDNN's status and its last error message.
void check_cudnn(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char message[1024] = {0};
  api().get_last_error_string(message, sizeof(message));
  TITAN_FAIL("cuDNN attention: ", what, " failed: ", api().get_error_string(st), message[0] ? " (" : "",
             message, message[0] ? ")" : "",
             "; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN say more");
}

// The process's cuDNN handle on the current GPU, created on first use (after the backend chose
// the device).
cudnnHandle_t handle() {
  static const cudnnHandle_t h = [] {
    cudnnHandle_t created = nullptr;
    check_cudnn(loaded_api().create(&created), "cudnnCreate");
    return created;
  }();
  return h;
}

// ------------------------------------------------------------------ backend descriptors

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  Desc() = default;
  Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    check_cudnn(api().create_descriptor(type, &d_), "creating " + what_);
  }
  ~Desc() {
    if (d_) api().destroy_descriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_), what_(std::move(o.what_)) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(what_, o.what_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    check_cudnn(api().set_attribute(d_, name, type, count, values),
                "setting attribute " + std::to_string(int(name)) + " of " + what_);
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& d) {
    cudnnBackendDescriptor_t v = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  Desc& set_i64(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
    return set(name, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
  }
  Desc& set_type(cudnnBackendAttributeName_t name, cudnnDataType_t t) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &t);
  }
  Desc& set_bool(cudnnBackendAttributeName_t name, bool b) {
    bool v = b;
    return set(name, CUDNN_TYPE_BOOLEAN, 1, &v);
  }
  void finalize() { check_cudnn(api().finalize(d_), "finalizing " + what_); }
  // finalize that reports instead of throwing (engine configurations that do not apply).
  cudnnStatus_t try_finalize() { return api().finalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

// An operation graph under construction: its tensors and operations, which the plan keeps alive.
// Every tensor has a unique id (virtual ones too) and 16-byte alignment, as cudnn_frontend declares
// them; every sub-descriptor is finalized before an operation refers to it.
class GraphBuilder {
 public:
  // A tensor the variant pack binds to device memory.
  const Desc& tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type) {
    return add_tensor(uid, dims, strides, type, false, false);
  }
  // A float the variant pack passes by value (a host pointer): dims and strides all 1.
  const Desc& scalar(int64_t uid) { return add_tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true); }
  // An intermediate that never reaches memory.
  const Desc& virt(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return add_tensor(next_virtual_uid_++, dims, strides, type, true, false);
  }

  // c = a @ b over the last two dims, batched over the leading ones (a kv head serves its group of
  // query heads by broadcasting: b has Hkv heads where a and c have Hq).
  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    mm.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    mm.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation " + std::to_string(ops_.size()));
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op.finalize();
    add_op(std::move(op), std::move(mm));
  }

  // y = mode(x[, b[, t]]) elementwise with broadcasting; `axis` for GEN_INDEX. BINARY_SELECT is
  // y = t ? x : b.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y, const Desc* t = nullptr,
                 int64_t axis = -1, cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, {axis});
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            "pointwise operation " + std::to_string(ops_.size()) + " (mode " + std::to_string(int(mode)) + ")");
    const float one = 1.f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    op.finalize();
    add_op(std::move(op), std::move(pw));
  }

  // y = reduce(x) over the dims where y is smaller (1: the whole axis; Hkv of Hq: each head group).
  void reduction(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    red.set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    red.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation " + std::to_string(ops_.size()));
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    op.finalize();
    add_op(std::move(op), std::move(red));
  }

  // y = x viewed with other dims and strides (a transpose without a copy).
  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation " + std::to_string(ops_.size()));
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    add_op(std::move(op), Desc());
  }

  const std::vector<Desc>& ops() const { return ops_; }

 private:
  const Desc& add_tensor(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                         cudnnDataType_t type, bool is_virtual, bool by_value) {
    auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + std::to_string(uid));
    t->set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
        .set_i64(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .set_i64(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid})
        .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {16});
    if (is_virtual) t->set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
    if (by_value) t->set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    t->finalize();
    tensors_.push_back(std::move(t));
    return *tensors_.back();
  }
  void add_op(Desc op, Desc sub) {
    ops_.push_back(std::move(op));
    if (sub.get()) subs_.push_back(std::move(sub));
  }

  std::vector<std::unique_ptr<Desc>> tensors_;  // stable addresses: operations refer to them
  std::vector<Desc> subs_;                      // the matmul / pointwise / reduction descriptors
  std::vector<Desc> ops_;
  int64_t next_virtual_uid_ = 1000;
};

// A finalized execution plan with the graph it runs (whose descriptors it may refer to).
struct Plan {
  GraphBuilder graph;
  Desc op_graph, heuristics, plan;
  std::vector<Desc> engine_configs;  // the plan's configuration among them
  int64_t workspace_bytes = 0;
};

// The graph's operations as a finalized operation graph, bound to `h` when there is a handle
// (cuDNN before 9.8 needs one; a deviceless query has none).
Desc operation_graph(const GraphBuilder& graph, cudnnHandle_t h, const std::string& what) {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc& op : graph.ops()) ops.push_back(op.get());
  Desc og(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what + " operation graph");
  og.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data());
  if (h) og.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  og.finalize();
  return og;
}

// cuDNN's heuristics (mode A, as cudnn_frontend asks for SDPA) for an operation graph: the engine
// configurations that pass their support checks, best first (for the GPU `device_props`
// describes, else the current one). Keeps the heuristics descriptor alive in `heuristics`.
std::vector<Desc> engine_configs(const Desc& op_graph, const Desc* device_props, Desc& heuristics,
                                 const std::string& what) {
  const CudnnApi& a = api();
  heuristics = Desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what + " heuristics");
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (device_props) heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device_props);
  heuristics.finalize();
  int64_t count = 0;
  check_cudnn(a.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                              &count, nullptr),
              what + ": counting the heuristics' engine configurations");
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what + " engine configuration");
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  if (count > 0)
    check_cudnn(a.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                count, &returned, raw.data()),
                what + ": reading the heuristics' engine configurations");
  configs.resize(size_t(returned));  // the ones cuDNN filled: those that passed its support checks
  return configs;
}

// The graph -> an operation graph -> cuDNN's heuristics -> the first engine configuration that
// finalizes into an execution plan. A configuration that fails its finalize (NOT_SUPPORTED, too
// much shared memory, ...) is skipped; when none is left the error lists each one's status.
std::unique_ptr<Plan> finalize_plan(GraphBuilder graph, const std::string& what) {
  const CudnnApi& a = loaded_api();
  cudnnHandle_t h = handle();
  auto p = std::make_unique<Plan>();
  p->graph = std::move(graph);
  p->op_graph = operation_graph(p->graph, h, what);
  p->engine_configs = engine_configs(p->op_graph, nullptr, p->heuristics, what);
  std::string tried;
  for (size_t i = 0; i < p->engine_configs.size(); ++i) {
    cudnnBackendDescriptor_t config = p->engine_configs[i].get();
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what + " execution plan");
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    const cudnnStatus_t st = plan.try_finalize();
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += std::string(tried.empty() ? "" : ", ") + "#" + std::to_string(i) + " " + a.get_error_string(st);
      continue;
    }
    int64_t n = 0;
    check_cudnn(a.get_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                &p->workspace_bytes),
                what + ": reading the plan's workspace size");
    p->plan = std::move(plan);
    return p;
  }
  char message[1024] = {0};
  a.get_last_error_string(message, sizeof(message));
  TITAN_FAIL("cuDNN attention: ", what, ": none of the ", p->engine_configs.size(),
             " engine configurations cuDNN's heuristics offer builds a plan (", tried, ")",
             message[0] ? "; last error: " : "", message,
             "; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN say more");
}

// `workspace` holds at least the plan's workspace_bytes (null when it needs none).
void execute(const Plan& p, void* stream, const std::vector<std::pair<int64_t, void*>>& bindings, void* ws,
             const char* what) {
  const CudnnApi& a = api();
  check_cudnn(a.set_stream(handle(), static_cast<cudaStream_t>(stream)), "cudnnSetStream");
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (auto& [uid, ptr] : bindings) uids.push_back(uid), ptrs.push_back(ptr);
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(what) + " variant pack");
  pack.set_i64(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  pack.finalize();
  check_cudnn(a.execute(handle(), p.plan.get(), pack.get()), std::string(what) + ": executing the plan");
}

}  // namespace
}  // namespace titan::cuda
namespace titan::cuda {
namespace {

// ------------------------------------------------------------------ the attention graphs

// The graphs' tensors that reach memory (or the host, by value).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDqAccum
};

int runtime_version() { return int(api().get_version()); }  // 9.19.0 -> 91900

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

// Forward for training: out = softmax(mask(scale Q K^T)) V and stats = logsumexp of each row.
GraphBuilder forward_graph(const SdpaShape& s) {
  const Layout l(s);
  GraphBuilder g;
  const Desc& q = g.tensor(kQ, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& k_t = g.tensor(kK, l.kv_t, l.kv_t_strides, CUDNN_DATA_BFLOAT16);
  const Desc& v = g.tensor(kV, l.kv, l.kv_strides, CUDNN_DATA_BFLOAT16);
  const Desc& out = g.tensor(kO, l.q, l.q_strides, CUDNN_DATA_BFLOAT16);
  const Desc& stats = g.tensor(kStats, l.rows, l.rows_strides, CUDNN_DATA_FLOAT);

  const Desc& qk = g.virt(l.scores, l.scores_strides);
  g.matmul(q, k_t, qk);
  const Desc& scaled = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, &g.scalar(kScale), scaled);
  const Desc& masked = causal_mask(g, l, scaled);
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

// Backward, as cudnn_frontend builds it (the non-deterministic form: dq accumulated in f32):
//   delta = rowsum(dO * O)                       (into the workspace)
//   P = exp(mask(scale Q K^T - stats))           dV = P^T dO
//   dS = scale * P * (dO V^T - delta)            dK = dS^T Q      dQ = dS K
// With fewer kv heads, dK and dV are formed per query head and summed over each group by cuDNN.
GraphBuilder backward_graph(const SdpaShape& s) {
  const Layout l(s);
  const bool grouped = s.Hq != s.Hkv;
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
  const Desc& qk = g.virt(l.scores, l.scores_strides);
  g.matmul(q, k_t, qk);
  const Desc& scaled = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, &scale, scaled);
  const Desc& shifted = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, &stats, shifted);
  const Desc& masked = causal_mask(g, l, shifted);
  const Desc& p = g.virt(l.scores, l.scores_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p);

  // dV = P^T dO (per query head, then summed over each group).
  const Desc& p_t = g.virt(l.scores, l.scores_t_strides, CUDNN_DATA_BFLOAT16);
  g.reshape(p, p_t);
  if (grouped) {
    const Desc& dv_full = g.virt(l.q, l.q_packed_strides, CUDNN_DATA_BFLOAT16);
    g.matmul(p_t, dout, dv_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  } else {
    g.matmul(p_t, dout, dv);
  }

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
  const Desc& ds_t = g.virt(l.scores, l.scores_t_strides, CUDNN_DATA_BFLOAT16);
  g.reshape(ds, ds_t);
  if (grouped) {
    const Desc& dk_full = g.virt(l.q, l.q_packed_strides, CUDNN_DATA_BFLOAT16);
    g.matmul(ds_t, q, dk_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  } else {
    g.matmul(ds_t, q, dk);
  }

  // dQ = dS K, accumulated in f32 in the workspace, then rounded into dq.
  const Desc& k = g.virt(l.kv, l.kv_strides);
  g.reshape(k_t, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  return g;
}

// Plans per shape (the scale is passed by value at each call, so it is not part of the key).
using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
ShapeKey key_of(const SdpaShape& s) { return {s.B, s.S, s.Hq, s.Hkv, s.D}; }

const Plan& cached_plan(bool backward, const SdpaShape& s) {
  static std::mutex mutex;
  // Never destroyed, as the handle: at exit cuDNN's engine libraries (loaded after this map was
  // made) may be gone before a destructor running here could release their plans.
  static auto& plans = *new std::map<std::pair<bool, ShapeKey>, std::unique_ptr<Plan>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = plans[{backward, key_of(s)}];
  if (!slot) {
    const std::string what = std::string(backward ? "backward" : "forward") + " B=" + std::to_string(s.B) +
                             " S=" + std::to_string(s.S) + " Hq=" + std::to_string(s.Hq) +
                             " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D);
    slot = finalize_plan(backward ? backward_graph(s) : forward_graph(s), what);
  }
  return *slot;
}

// cuDNN loaded and not a release its frontend refuses; the shape within the engines' rules.
void check_usable(const SdpaShape& s, bool backward) {
  loaded_api();
  const int v = runtime_version();
  TITAN_CHECK(v < 91000 || v >= 91002, "attention (cudnn): cuDNN ", cudnn_version_text(),
              " has known bugs in its fused attention (cudnn_frontend refuses 9.10.0 and 9.10.1); use 9.10.2 or later");
  const std::string why = cudnn_attention_unsupported(s);
  TITAN_CHECK(why.empty(), "attention (cudnn): ", why);
  TITAN_CHECK(!backward || s.S > 1, "attention (cudnn): the backward needs a sequence longer than 1");
}

size_t round_up_256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::string cudnn_attention_unsupported(const SdpaShape& s) {
  if (s.D % 8 != 0 || s.D > 128)
    return "cuDNN's fused attention takes head_dim a multiple of 8 up to 128, got " + std::to_string(s.D);
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return "query heads " + std::to_string(s.Hq) + " are not a multiple of kv heads " + std::to_string(s.Hkv);
  // cudnn_frontend refuses a backward over one row; the forward falls back with it (one pair).
  if (s.S < 2) return "cuDNN's fused attention backward needs a sequence of 2 or more, got " + std::to_string(s.S);
  // Whole 128-row tiles unless the loaded cuDNN is known to handle the rest (9.16 and later). A
  // missing library is not a shape reason: the call then fails naming it.
  if (s.S % 128 != 0 && api().error.empty() && backward_needs_whole_tiles())
    return "cuDNN before 9.16 needs the sequence length a multiple of 128 for its backward, got " + std::to_string(s.S);
  return "";
}

std::string cudnn_version_text() {
  const CudnnApi& a = api();
  if (!a.error.empty()) return a.error;
  const size_t v = a.get_version();  // 9.19.0 -> 91900
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace titan::cuda

namespace titan::cuda {

void cudnn_attention_forward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                             void* out, float* lse) {
  check_usable(s, false);
  const Plan& plan = cached_plan(false, s);
  float scale = s.scale, masked = mask_value();
  execute(plan, stream,
          {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out},
           {kStats, lse}, {kScale, &scale}, {kMaskValue, &masked}},
          plan.workspace_bytes > 0 ? workspace(size_t(plan.workspace_bytes)) : nullptr, "forward");
}

void cudnn_attention_backward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv) {
  check_usable(s, true);
  const Plan& plan = cached_plan(true, s);
  // One workspace: [dq accumulator, f32 B*Hq*S*D][row sums dO.O, f32 B*Hq*S][cuDNN's own].
  const size_t accum_bytes = round_up_256(size_t(s.B * s.Hq * s.S * s.D) * 4),
               sums_bytes = round_up_256(size_t(s.B * s.Hq * s.S) * 4);
  char* ws = static_cast<char*>(workspace(accum_bytes + sums_bytes + size_t(plan.workspace_bytes)));
  void* dq_accum = ws;
  void* sums = ws + accum_bytes;
  if (runtime_version() < 90600)  // later engines clear the accumulator themselves
    TITAN_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, accum_bytes, static_cast<cudaStream_t>(stream)));
  float scale = s.scale, masked = mask_value(), one = 1.f;
  execute(plan, stream,
          {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
           {kO, const_cast<void*>(out)}, {kDO, const_cast<void*>(dout)}, {kStats, const_cast<float*>(lse)},
           {kDQ, dq}, {kDK, dk}, {kDV, dv}, {kScale, &scale}, {kMaskValue, &masked}, {kOne, &one},
           {kSoftmaxSum, sums}, {kDqAccum, dq_accum}},
          ws + accum_bytes + sums_bytes, "backward");
}

}  // namespace titan::cuda

namespace titan::cuda {

int64_t cudnn_attention_engine_count(const SdpaShape& s, bool backward, const std::string& device_json) {
  loaded_api();
  TITAN_CHECK(runtime_version() >= 90800, "attention (cudnn): cuDNN ", cudnn_version_text(),
              " cannot describe a GPU from its properties (cuDNN 9.8 and later can)");
  const std::string what = std::string("deviceless ") + (backward ? "backward" : "forward");
  const GraphBuilder graph = backward ? backward_graph(s) : forward_graph(s);
  const Desc op_graph = operation_graph(graph, nullptr, what);
  Desc device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(device_json.size() + 1),
             device_json.c_str());
  device.finalize();
  Desc heuristics;
  return int64_t(engine_configs(op_graph, &device, heuristics, what).size());
}

}  // namespace titan::cuda
