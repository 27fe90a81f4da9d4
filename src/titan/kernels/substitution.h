#pragma once
// Kernel substitutions: the [kernels] table of a job config picks a variant of an
// op for the modules whose fully-qualified names match a glob, e.g.
//   rope = { impl = "gather_free", modules = "layers.*.attention" }
// Model code announces the module it is running with a ModuleScope; op calls
// inside consult the active rules (see select_variant in registry.h).
#include <string>
#include <vector>

namespace titan::kernels {

struct Substitution {
  std::string op;       // "rope"
  std::string variant;  // "gather_free"
  std::string modules;  // glob over module names: '*' any run, '?' one char, [0-3] / [abc] classes
};

// Installs the rules process-wide (replaces earlier ones). Unknown ops or variants are errors.
void set_substitutions(std::vector<Substitution> rules);
const std::vector<Substitution>& substitutions();

// fnmatch-style glob where '*' also matches '.', so "layers.*.moe" matches "layers.12.moe".
bool glob_match(const std::string& pattern, const std::string& name);

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
