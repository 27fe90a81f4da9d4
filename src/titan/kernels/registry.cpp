#include "titan/kernels/registry.h"

#include <mutex>

#include "titan/kernels/substitution.h"

namespace titan::kernels {

namespace {
std::vector<KernelEntry>& registry() {
  static std::vector<KernelEntry> entries;
  return entries;
}
std::vector<Substitution>& rules() {
  static std::vector<Substitution> r;
  return r;
}
thread_local std::string t_module;
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

const std::vector<KernelEntry>& all_kernels() { return registry(); }

bool has_kernel(const std::string& op, Device device, DType dtype, const std::string& variant) {
  for (auto& e : registry())
    if (e.op == op && e.device == device && e.dtype == dtype && e.variant == variant) return true;
  return false;
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
  if (!t_module.empty()) {
    // Last matching rule wins, so later, more specific config lines override earlier ones.
    for (auto it = rules().rbegin(); it != rules().rend(); ++it)
      if (it->op == op && glob_match(it->modules, t_module) && has_kernel(op, device, dtype, it->variant))
        return it->variant;
  }
  for (auto& e : registry())
    if (e.op == op && e.device == device && e.dtype == dtype && e.variant == "default" &&
        (!e.available || e.available().empty()))
      return "default";
  return "reference";
}

// ---------------------------------------------------------------- substitutions

void set_substitutions(std::vector<Substitution> r) {
  for (auto& s : r) {
    bool op_known = false, variant_known = false;
    for (auto& e : registry()) {
      op_known |= e.op == s.op;
      variant_known |= e.op == s.op && e.variant == s.variant;
    }
    TITAN_CHECK(op_known, "kernels: unknown op '", s.op, "' in substitution (see `titan kernels list`)");
    TITAN_CHECK(variant_known, "kernels: op '", s.op, "' has no variant '", s.variant,
                "' (see `titan kernels list`)");
  }
  rules() = std::move(r);
}

const std::vector<Substitution>& substitutions() { return rules(); }

bool glob_match(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star_p = std::string::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '[') {
      size_t close = p.find(']', pi);
      TITAN_CHECK(close != std::string::npos, "glob '", p, "': unterminated '['");
      bool match = false;
      for (size_t k = pi + 1; k < close; ++k) {
        if (k + 2 < close && p[k + 1] == '-') {
          match |= s[si] >= p[k] && s[si] <= p[k + 2];
          k += 2;
        } else {
          match |= s[si] == p[k];
        }
      }
      if (match) {
        pi = close + 1;
        ++si;
        continue;
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
      continue;
    } else if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (star_p == std::string::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

const std::string& current_module() { return t_module; }

ModuleScope::ModuleScope(std::string name) : prev_(t_module) {
  t_module = t_module.empty() ? std::move(name) : t_module + "." + name;
}

ModuleScope::~ModuleScope() { t_module = prev_; }

}  // namespace titan::kernels
