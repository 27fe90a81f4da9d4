// cuDNN's backend graph API without cudnn_frontend (see cudnn_graph.h).
#include "titan/backend/cuda/cudnn_graph.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <exception>

#include "titan/core/check.h"

namespace titan::cuda {

std::string cudnn_version_text() {
  const cudnn::Api& a = cudnn::api();
  if (!a.error.empty()) return a.error;
  const int v = cudnn::runtime_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace cudnn {

// ------------------------------------------------------------------ the library, through dlopen

namespace {
template <class F>
bool look_up(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("libcudnn.so.9 has no ") + name;
  return fn != nullptr;
}
}  // namespace

const Api& api() {
  static const Api loaded = [] {
    Api a{};
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
const Api& loaded_api() {
  const Api& a = api();
  TITAN_CHECK(a.error.empty(), "cuDNN: ", a.error);
  return a;
}

// A titan::Error naming the call, cuDNN's status and its last error message.
void check(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  const Api& a = loaded_api();  // a status came back, so the library is there
  char message[1024] = {0};
  a.get_last_error_string(message, sizeof(message));
  TITAN_FAIL("cuDNN: ", what, " failed: ", a.get_error_string(st), message[0] ? " (" : "",
             message, message[0] ? ")" : "",
             "; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN say more");
}

// The process's cuDNN handle on the current GPU, created on first use (after the backend chose
// the device).
cudnnHandle_t handle() {
  static const cudnnHandle_t h = [] {
    cudnnHandle_t created = nullptr;
    check(loaded_api().create(&created), "cudnnCreate");
    return created;
  }();
  return h;
}


int runtime_version() { return int(loaded_api().get_version()); }

// ------------------------------------------------------------------ plans

namespace {

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

// cuDNN's heuristics in `mode` for an operation graph: the engine configurations that pass their
// support checks, best first (for the GPU `device_props` describes, else the current one). Keeps
// the heuristics descriptor alive in `heuristics`.
std::vector<Desc> engine_configs(const Desc& op_graph, const Desc* device_props, cudnnBackendHeurMode_t mode,
                                 Desc& heuristics, const std::string& what) {
  const Api& a = api();
  heuristics = Desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what + " heuristics");
  heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (device_props) heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device_props);
  heuristics.finalize();
  int64_t count = 0;
  check(a.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
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
    check(a.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                count, &returned, raw.data()),
                what + ": reading the heuristics' engine configurations");
  configs.resize(size_t(returned));  // the ones cuDNN filled: those that passed its support checks
  return configs;
}

}  // namespace

// The graph -> an operation graph -> cuDNN's heuristics (mode A, as cudnn_frontend and PyTorch ask
// first, then FALLBACK) -> the first engine configuration that finalizes into an execution plan. A
// configuration that fails its finalize (NOT_SUPPORTED, too much shared memory, ...) is skipped;
// when none is left the error lists each one's status.
std::unique_ptr<Plan> finalize_plan(GraphBuilder graph, const std::string& what) {
  const Api& a = loaded_api();
  cudnnHandle_t h = handle();
  auto p = std::make_unique<Plan>();
  p->graph = std::move(graph);
  p->op_graph = operation_graph(p->graph, h, what);
  std::string tried;
  for (const auto& [mode, mode_name] : {std::pair{CUDNN_HEUR_MODE_A, "A"}, std::pair{CUDNN_HEUR_MODE_FALLBACK, "fallback"}}) {
    try {
      p->engine_configs = engine_configs(p->op_graph, nullptr, mode, p->heuristics, what);
    } catch (const std::exception& e) {  // a mode that has nothing for this graph
      tried += std::string(tried.empty() ? "" : ", ") + mode_name + " heuristics: " + e.what();
      continue;
    }
    for (size_t i = 0; i < p->engine_configs.size(); ++i) {
      cudnnBackendDescriptor_t config = p->engine_configs[i].get();
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what + " execution plan");
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
      const cudnnStatus_t st = plan.try_finalize();
      if (st != CUDNN_STATUS_SUCCESS) {
        tried += std::string(tried.empty() ? "" : ", ") + mode_name + " #" + std::to_string(i) + " " +
                 a.get_error_string(st);
        continue;
      }
      int64_t n = 0;
      check(a.get_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                            &p->workspace_bytes),
            what + ": reading the plan's workspace size");
      p->plan = std::move(plan);
      return p;
    }
  }
  char message[1024] = {0};
  a.get_last_error_string(message, sizeof(message));
  TITAN_FAIL("cuDNN: ", what, ": no engine configuration of cuDNN's heuristics (modes A and fallback) builds a plan (",
             tried.empty() ? "none offered" : tried, ")", message[0] ? "; last error: " : "", message,
             "; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr makes cuDNN say more");
}

void execute(const Plan& p, void* stream, const std::vector<std::pair<int64_t, void*>>& bindings, void* ws,
             const std::string& what) {
  const Api& a = api();
  check(a.set_stream(handle(), static_cast<cudaStream_t>(stream)), "cudnnSetStream");
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (auto& [uid, ptr] : bindings) uids.push_back(uid), ptrs.push_back(ptr);
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(what) + " variant pack");
  pack.set_i64(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  pack.finalize();
  check(a.execute(handle(), p.plan.get(), pack.get()), std::string(what) + ": executing the plan");
}

int64_t deviceless_engine_count(const GraphBuilder& graph, const std::string& device_json, const std::string& what) {
  loaded_api();
  TITAN_CHECK(runtime_version() >= 90800, "cuDNN ", cudnn_version_text(),
              " cannot describe a GPU from its properties (cuDNN 9.8 and later can)");
  const Desc op_graph = operation_graph(graph, nullptr, what);
  Desc device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(device_json.size() + 1),
             device_json.c_str());
  device.finalize();
  Desc heuristics;
  return int64_t(engine_configs(op_graph, &device, CUDNN_HEUR_MODE_A, heuristics, what).size());
}

std::string device_properties_json() {
  const Api& a = loaded_api();
  TITAN_CHECK(runtime_version() >= 90800, "cuDNN ", cudnn_version_text(),
              " cannot serialize device properties (cuDNN 9.8 and later can)");
  cudnnHandle_t h = handle();
  Desc device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  device.set(CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  device.finalize();
  int64_t n = 0;
  check(a.get_attribute(device.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n, nullptr),
        "sizing the device properties' JSON");
  std::string json(size_t(n), '\0');
  check(a.get_attribute(device.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, json.data()),
        "reading the device properties' JSON");
  json.resize(std::min(json.size(), json.find('\0')));  // cuDNN counts the terminating zero
  return json;
}

PlanCache::PlanCache(size_t capacity) : capacity_(capacity) {
  TITAN_CHECK(capacity_ >= 1, "cuDNN plan cache: capacity must be at least 1");
}

std::shared_ptr<const Plan> PlanCache::get(const std::string& key,
                                           const std::function<std::unique_ptr<Plan>()>& build) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = index_.find(key); it != index_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second);
  } else {
    Entry e{key, nullptr, ""};
    ++builds_;
    try {
      e.plan = build();
    } catch (const std::exception& err) {
      e.error = err.what();
    }
    recent_.push_front(std::move(e));
    try {
      index_[key] = recent_.begin();
    } catch (...) {  // (out of memory) the list holds only entries the index knows
      recent_.pop_front();
      throw;
    }
    while (recent_.size() > capacity_) {
      index_.erase(recent_.back().key);
      recent_.pop_back();
    }
  }
  const Entry& e = recent_.front();
  if (!e.plan) throw Error(e.error);  // the message as first thrown (it names the shape)
  return e.plan;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recent_.size();
}

int64_t PlanCache::builds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return builds_;
}

}  // namespace cudnn
}  // namespace titan::cuda
