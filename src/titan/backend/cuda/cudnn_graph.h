#pragma once
// cuDNN's backend graph API (cudnn_graph.h) without cudnn_frontend, for the backend's cuDNN users
// (cudnn_attention.cu, cudnn_moe.cu): the library loaded with dlopen, descriptors as RAII objects,
// a builder for operation graphs, execution plans chosen from cuDNN's heuristics and cached by the
// callers, and a deviceless query of which engines take a graph. Backend-internal: it includes
// cuDNN's header.
//
// libcudnn.so.9 is loaded on first use (the GPU machine's cuDNN comes with its PyTorch wheels, not
// with the toolkit titan was built with), so titan runs without cuDNN and only a job that asks for
// a cuDNN variant needs it; a call that needs it and cannot load it fails naming the library.
#include <cudnn_graph.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace titan::cuda {

// The loaded cuDNN's version ("9.19.0"), or why it could not be loaded.
std::string cudnn_version_text();

namespace cudnn {

// The backend API's entry points, looked up in libcudnn.so.9 (the cuDNN 9 ABI).
struct Api {
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

// The library's entry points; `error` says why they are missing (they are null then).
const Api& api();
// The same, or a titan::Error naming why the library could not be loaded.
const Api& loaded_api();
// The loaded library's version number (9.19.0 -> 91900).
int runtime_version();
// Throws a titan::Error naming `what`, cuDNN's status and its last error message unless st is success.
void check(cudnnStatus_t st, const std::string& what);
// The process's cuDNN handle on the current GPU, created on first use.
cudnnHandle_t handle();

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  Desc() = default;
  Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    // loaded_api: without cuDNN this is an error naming why, not a call through a null pointer.
    check(loaded_api().create_descriptor(type, &d_), "creating " + what_);
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
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values) {
    check(api().set_attribute(d_, name, type, count, values),
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
  void finalize() { check(api().finalize(d_), "finalizing " + what_); }
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
  const Desc& tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                     cudnnDataType_t type) {
    return add_tensor(uid, dims, strides, type, false, false);
  }
  // A float the variant pack passes by value (a host pointer): dims and strides all 1.
  const Desc& scalar(int64_t uid) {
    return add_tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
  }
  // An intermediate that never reaches memory.
  const Desc& virt(std::vector<int64_t> dims, std::vector<int64_t> strides,
                   cudnnDataType_t type = CUDNN_DATA_FLOAT) {
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
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y,
                 const Desc* t = nullptr, int64_t axis = -1, cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, {axis});
    pw.finalize();
    Desc op(
        CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
        "pointwise operation " + std::to_string(ops_.size()) + " (mode " + std::to_string(int(mode)) + ")");
    const float one = 1.f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
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
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
            "reduction operation " + std::to_string(ops_.size()));
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

  // An operation built by the caller (finalized), for the kinds this builder has no helper for.
  void add_operation(Desc op) { add_op(std::move(op), Desc()); }

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

// The graph -> an operation graph -> cuDNN's heuristics (mode A) -> the first engine configuration
// that finalizes into an execution plan; an error listing each configuration's status when none does.
std::unique_ptr<Plan> finalize_plan(GraphBuilder graph, const std::string& what);

// Execution plans by shape, built on first use, the `capacity` most recently used kept. Each plan
// holds host and device memory (and its build runs heuristics, maybe an engine compile): a job whose
// shapes keep changing (block-causal attention, one call per document length; MoE token counts)
// must not keep one per shape for its whole life. A shape whose build failed keeps its error, so
// that asking again (every layer, every step) fails at once instead of building again (an error
// that might pass, out of memory during a build, stays too until evicted). An evicted plan lives on
// while a caller holds it; destroying one does not wait for work it launched (cuDNN's launches do
// not refer to the plan's descriptors once enqueued, as PyTorch's plan cache also assumes).
// Thread-safe; builds run one at a time, and `build` must not call the same cache.
class PlanCache {
 public:
  explicit PlanCache(size_t capacity);
  // The plan under `key`, built by `build` unless cached; the cached error (a titan::Error naming
  // it) for a key whose build threw.
  std::shared_ptr<const Plan> get(const std::string& key,
                                  const std::function<std::unique_ptr<Plan>()>& build);
  size_t size() const;
  int64_t builds() const;  // calls of `build` so far

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const Plan> plan;
    std::string error;
  };
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> recent_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t builds_ = 0;
};

// Runs a plan on `stream` with the (uid, pointer) bindings (host pointers for by-value scalars);
// `workspace` holds at least the plan's workspace_bytes (null when it needs none).
void execute(const Plan& p, void* stream, const std::vector<std::pair<int64_t, void*>>& bindings,
             void* workspace, const std::string& what);

// How many of cuDNN's engine configurations pass their support checks for the graph on the GPU that
// `device_json` describes: cuDNN's serialized device properties (CUDNN_ATTR_DEVICEPROP_JSON_
// REPRESENTATION, cuDNN 9.8 and later). Asks the heuristics without a GPU; cuDNN's runtime-compiled
// engines still want a loadable libcuda.so.1 (the tests give them a stand-in).
int64_t deviceless_engine_count(const GraphBuilder& graph, const std::string& device_json,
                                const std::string& what);

// The current GPU's device properties as cuDNN serializes them (the JSON deviceless_engine_count
// takes; cuDNN 9.8 and later): how a fixture describing a GPU is checked against the real one.
std::string device_properties_json();

}  // namespace cudnn
}  // namespace titan::cuda
