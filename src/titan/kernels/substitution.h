#pragma once
// Kernel substitutions: the [kernels] table of a job config picks a variant of an
// op for the modules whose fully-qualified names match a glob, e.g.
//   rope = { impl = "gather_free", modules = "layers.*.attention" }
// Model code announces the module it is running with a ModuleScope; op calls
// inside consult the active rules (see select_variant in registry.h).
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/core/dtype.h"
#include "titan/core/glob.h"

namespace titan::kernels {

struct Substitution {
  std::string op;       // "rope"
  std::string variant;  // "gather_free"
  std::string modules;  // glob over module names: '*' any run, '?' one char, [0-3] / [abc] classes
};

// Installs the rules process-wide (replaces earlier ones). Unknown ops or variants are errors
// naming the op and listing what is registered.
void set_substitutions(std::vector<Substitution> rules);
const std::vector<Substitution>& substitutions();

// A module of a model and the ops its own code calls (not those of the modules inside it).
struct ModuleOps {
  std::string module;            // "layers.3.attention"
  std::vector<std::string> ops;  // "linear", "rms_norm", "rope", "attention", "cast"
};

// Checks rules against a model before any compute; installs nothing. Every rule's op and variant
// must be registered, the variant must have a kernel for (device, dtype) and be available on this
// machine, and its modules pattern must match at least one module that runs the op (a rule that
// could never apply asks for something that cannot happen). Throws titan::Error naming the rule
// ("kernels.rope: ...") otherwise. Returns the start-up log: one line per (module, op) a rule
// applies to, with the variant that wins there (the last matching rule), e.g.
//   "kernels: layers.0.attention        rope -> gather_free"
// `on_this_machine` false (planning a job for another machine: titan info, titan plan) skips only
// the last check, whether the variant can run here (a GPU, a library).
std::vector<std::string> plan_substitutions(const std::vector<Substitution>& rules,
                                            const std::vector<ModuleOps>& modules, Device device, DType dtype,
                                            bool on_this_machine = true);

// The module currently running on this thread ("layers.3.attention"), "" outside any.
const std::string& current_module();

class ModuleScope {
 public:
  explicit ModuleScope(std::string name);  // name is appended to the enclosing module's, joined with '.'
  ~ModuleScope();

 private:
  std::string prev_;
};

}  // namespace titan::kernels
