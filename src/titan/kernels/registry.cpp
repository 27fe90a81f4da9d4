#include "titan/kernels/registry.h"

#include <mutex>

#include "titan/core/op_timeline.h"
#include "titan/kernels/substitution.h"

namespace titan::kernels {

namespace {
std::deque<KernelEntry>& registry() {
  static std::deque<KernelEntry> entries;
  return entries;
}
thread_local std::vector<std::pair<std::string, std::string>> t_forced;  // (op, variant)
}  // namespace

ForceVariant::ForceVariant(std::string op, std::string variant) : op_(std::move(op)) {
  for (auto& [o, v] : t_forced)
    if (o == op_) {
      prev_ = v;
      v = std::move(variant);
      return;
    }
  t_forced.emplace_back(op_, std::move(variant));
}

ForceVariant::~ForceVariant() {
  for (size_t i = 0; i < t_forced.size(); ++i)
    if (t_forced[i].first == op_) {
      if (prev_.empty()) t_forced.erase(t_forced.begin() + long(i));
      else t_forced[i].second = prev_;
      return;
    }
}

void register_kernel(KernelEntry entry) {
  for (auto& e : registry())
    TITAN_CHECK(!(e.op == entry.op && e.device == entry.device && e.dtype == entry.dtype && e.variant == entry.variant),
                "kernel registry: duplicate registration of '", entry.op, "' ", device_name(entry.device), "/",
                dtype_name(entry.dtype), " variant '", entry.variant, "'");
  registry().push_back(std::move(entry));
}

bool register_meta_kernel(const std::string& op, std::initializer_list<DType> dtypes, std::any kernel) {
  for (DType dt : dtypes)
    register_kernel({op, Device::Meta, dt, "default", "shapes, allocations and FLOPs only", kernel, {}});
  return true;
}

bool register_kernels(const std::string& op, Device device, std::initializer_list<VariantKernel> kernels,
                      const std::function<std::string()>& available) {
  for (const VariantKernel& k : kernels)
    register_kernel(
        {op, device, k.dtype, k.variant, k.description, k.kernel, k.available ? k.available : available});
  return true;
}

const std::deque<KernelEntry>& all_kernels() { return registry(); }

bool has_kernel(const std::string& op, Device device, DType dtype, const std::string& variant) {
  for (auto& e : registry())
    if (e.op == op && e.device == device && e.dtype == dtype && e.variant == variant) return true;
  return false;
}

namespace {
thread_local OpCallRecorder* t_recorder = nullptr;  // the innermost live recorder of this thread
}  // namespace

void note_op_call(const std::string& op) {
  if (profiling::recording()) profiling::mark_op(op, current_module());
  for (OpCallRecorder* r = t_recorder; r; r = r->outer_) r->calls_.emplace(current_module(), op);
}

OpCallRecorder::OpCallRecorder() : outer_(t_recorder) {
  t_recorder = this;
}
OpCallRecorder::~OpCallRecorder() {
  t_recorder = outer_;
}

const KernelEntry& find_kernel(const std::string& op, Device device, DType dtype, const std::string& variant) {
  for (auto& e : registry())
    if (e.op == op && e.device == device && e.dtype == dtype && e.variant == variant) return e;
  std::string have;
  for (auto& e : registry())
    if (e.op == op)
      have += std::string(have.empty() ? "" : ", ") + std::string(device_name(e.device)) + "/" +
              std::string(dtype_name(e.dtype)) + ":" + e.variant;
  TITAN_FAIL("no kernel for op '", op, "' on device ", device_name(device), " with dtype ", dtype_name(dtype),
             " (variant '", variant, "'); registered: ", have.empty() ? "none" : have);
}

std::string select_variant(const std::string& op, Device device, DType dtype) {
  for (auto& [o, v] : t_forced)
    if (o == op) return v;
  if (const std::string& module = current_module(); !module.empty()) {
    // Last matching rule wins, so later, more specific config lines override earlier ones.
    const auto& rules = substitutions();
    for (auto it = rules.rbegin(); it != rules.rend(); ++it)
      if (it->op == op && glob_match(it->modules, module) && has_kernel(op, device, dtype, it->variant))
        return it->variant;
  }
  for (auto& e : registry())
    if (e.op == op && e.device == device && e.dtype == dtype && e.variant == "default" &&
        (!e.available || e.available().empty()))
      return "default";
  return "reference";
}

}  // namespace titan::kernels
