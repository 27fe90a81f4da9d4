#include "titan/kernels/substitution.h"

#include <algorithm>
#include <cstdio>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/suggest.h"
#include "titan/kernels/registry.h"

namespace titan::kernels {

namespace {

std::vector<Substitution>& rules() {
  static std::vector<Substitution> r;
  return r;
}
thread_local std::string t_module;

// The op and variant must be registered (on some device and dtype), the modules pattern well formed.
void check_known(const Substitution& s) {
  const std::string bad_pattern = glob_problem(s.modules);
  TITAN_CHECK(bad_pattern.empty(), "kernels.", s.op, ".modules = \"", s.modules, "\": ", bad_pattern);
  std::vector<std::string> ops, variants;
  for (auto& e : all_kernels()) {
    if (std::find(ops.begin(), ops.end(), e.op) == ops.end()) ops.push_back(e.op);
    if (e.op == s.op && std::find(variants.begin(), variants.end(), e.variant) == variants.end())
      variants.push_back(e.variant);
  }
  std::sort(ops.begin(), ops.end());
  TITAN_CHECK(!variants.empty(), "kernels.", s.op, ": unknown op '", s.op, "' (ops: ", join(ops),
              "; see `titan kernels list`)");
  TITAN_CHECK(std::find(variants.begin(), variants.end(), s.variant) != variants.end(), "kernels.", s.op,
              ": op '", s.op, "' has no variant '", s.variant, "' (variants: ", join(variants),
              loaded_device_services(Device::CUDA)
                  ? ""
                  : "; those of a device whose backend this process has not loaded, such as cuda's, are not "
                    "among them",
              "; see `titan kernels list`)");
}

}  // namespace

void set_substitutions(std::vector<Substitution> r) {
  for (auto& s : r) check_known(s);
  rules() = std::move(r);
}

const std::vector<Substitution>& substitutions() {
  return rules();
}

std::vector<std::string> plan_substitutions(const std::vector<Substitution>& plan,
                                            const std::vector<ModuleOps>& modules, Device device, DType dtype,
                                            bool on_this_machine) {
  auto runs = [](const ModuleOps& m, const std::string& op) {
    return std::find(m.ops.begin(), m.ops.end(), op) != m.ops.end();
  };
  std::vector<std::string> ops;  // in order of first mention
  for (auto& s : plan) {
    check_known(s);
    // Where the rule applies first (an op no module runs, the optimizer's, has no dtype to ask
    // about), then whether the variant can run there.
    bool matched = false, matched_runner = false;
    std::vector<std::string> names, runners;  // every module; those that run the op
    for (auto& m : modules) {
      const bool match = glob_match(s.modules, m.module);
      matched = matched || match;
      matched_runner = matched_runner || (match && runs(m, s.op));
      names.push_back(m.module);
      if (runs(m, s.op)) runners.push_back(m.module);
    }
    auto first_six = [](const std::vector<std::string>& v) {
      return join(std::vector<std::string>(v.begin(), v.begin() + long(std::min<size_t>(v.size(), 6)))) +
             (v.size() > 6 ? ", ..." : "");
    };
    TITAN_CHECK(matched, "kernels.", s.op, ": modules pattern '", s.modules,
                "' matches no module of this model (modules look like: ", first_six(names), ")");
    TITAN_CHECK(
        matched_runner, "kernels.", s.op, ": modules pattern '", s.modules, "' matches no module that runs ",
        s.op, ", so the rule would never apply (",
        runners.empty() ? "no module of this model runs " + s.op : s.op + " runs in: " + first_six(runners),
        ")");
    TITAN_CHECK(has_kernel(s.op, device, dtype, s.variant), "kernels.", s.op, ": variant '", s.variant,
                "' has no ", device_name(device), "/", dtype_name(dtype),
                " kernel, and this run computes in ", dtype_name(dtype), " (see `titan kernels list`)");
    const KernelEntry& e = find_kernel(s.op, device, dtype, s.variant);
    const std::string why = on_this_machine && e.available ? e.available() : std::string();
    TITAN_CHECK(why.empty(), "kernels.", s.op, ": variant '", s.variant, "' cannot run here: ", why);
    if (std::find(ops.begin(), ops.end(), s.op) == ops.end()) ops.push_back(s.op);
  }
  // As select_variant: the last matching rule wins.
  auto winner = [&](const ModuleOps& m, const std::string& op) -> const Substitution* {
    const Substitution* win = nullptr;
    for (auto& s : plan)
      if (s.op == op && glob_match(s.modules, m.module)) win = &s;
    return win;
  };
  // An op that runs one variant in every module that runs it (a rule over "*", say) is one line,
  // not one per layer.
  std::vector<std::string> everywhere;
  for (auto& op : ops) {
    std::string variant;
    int64_t runners = 0;
    bool uniform = true;
    for (auto& m : modules) {
      if (!runs(m, op)) continue;
      const Substitution* win = winner(m, op);
      uniform = uniform && win && (runners == 0 || win->variant == variant);
      if (win) variant = win->variant;
      ++runners;
    }
    if (uniform && runners > 1) everywhere.push_back(op);
  }
  std::vector<std::string> lines;
  char buf[256];
  for (auto& op : everywhere) {
    int64_t runners = 0;
    for (auto& m : modules) runners += runs(m, op);
    std::snprintf(
        buf, sizeof buf, "kernels: %s -> %s in all %lld modules that run it", op.c_str(),
        winner(*std::find_if(modules.begin(), modules.end(), [&](auto& m) { return runs(m, op); }), op)
            ->variant.c_str(),
        (long long)runners);
    lines.push_back(buf);
  }
  for (auto& m : modules)
    for (auto& op : ops) {
      if (!runs(m, op) || std::find(everywhere.begin(), everywhere.end(), op) != everywhere.end()) continue;
      const Substitution* win = winner(m, op);
      if (!win) continue;
      std::snprintf(buf, sizeof buf, "kernels: %-24s %s -> %s", m.module.c_str(), op.c_str(),
                    win->variant.c_str());
      lines.push_back(buf);
    }
  return lines;
}

const std::string& current_module() {
  return t_module;
}

ModuleScope::ModuleScope(std::string name) : prev_(t_module) {
  t_module = t_module.empty() ? std::move(name) : t_module + "." + name;
}

ModuleScope::~ModuleScope() {
  t_module = prev_;
}

}  // namespace titan::kernels
