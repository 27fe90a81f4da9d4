#pragma once
// The kernel registry: every op registers its kernels per (op, device, dtype)
// under a variant name ("reference" = the plain loops every other variant is
// tested against, "default" = the fast path used unless configured otherwise,
// others selectable per module through substitutions). A kernel is a struct of
// function pointers defined by its op (forward + backward); the registry stores
// it type-erased and checks the type on lookup.
#include <any>
#include <deque>
#include <functional>
#include <initializer_list>
#include <string>
#include <typeindex>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/device.h"
#include "titan/core/dtype.h"

namespace titan::kernels {

struct KernelEntry {
  std::string op;
  Device device;
  DType dtype;
  std::string variant;
  std::string description;  // one line: algorithm, library, constraints
  std::any kernel;          // the op's kernel struct
  // Returns an empty string when this variant can run on this machine for the op's
  // configuration, else why not (ISA missing, head_dim unsupported, ...).
  std::function<std::string()> available;
};

void register_kernel(KernelEntry entry);
// Every registered kernel. A deque: a backend library loaded later (libtitan_cuda.so) appends its
// entries while references to earlier ones (find_kernel, kernel_for) stay valid.
const std::deque<KernelEntry>& all_kernels();

// Looks up an entry; a missing kernel is an error naming op, device, dtype and variant.
const KernelEntry& find_kernel(const std::string& op, Device device, DType dtype, const std::string& variant);
bool has_kernel(const std::string& op, Device device, DType dtype, const std::string& variant);

// The variant an op call should use now: a substitution for the current module
// if one applies (see kernels/substitution.h), else "default" when registered
// and available, else "reference".
std::string select_variant(const std::string& op, Device device, DType dtype);

// Forces one variant of an op on this thread for its scope (tests, `titan kernels parity`).
class ForceVariant {
 public:
  ForceVariant(std::string op, std::string variant);
  ~ForceVariant();

 private:
  std::string op_, prev_;
};

template <class K>
const K& kernel_for(const std::string& op, Device device, DType dtype, const std::string& variant) {
  const KernelEntry& e = find_kernel(op, device, dtype, variant);
  const K* k = std::any_cast<K>(&e.kernel);
  TITAN_CHECK(k, "kernel registry: '", op, "' variant '", variant, "' registered with the wrong kernel type");
  return *k;
}

template <class K>
const K& kernel_for(const std::string& op, Device device, DType dtype) {
  return kernel_for<K>(op, device, dtype, select_variant(op, device, dtype));
}

// The meta device's kernels (each op's meta.cpp) do no arithmetic (meta tensors hold no data), they
// only count the floating-point operations the op would do, so a meta run of a training step yields
// its exact allocation profile (the op wrappers allocate as on any device) and its FLOPs. Kernels
// that return a value to the host return what a valid input would: no index out of range, every
// label a target, zero sums. One registration per dtype the op accepts on any device.
// Returns true, so a meta.cpp registers with `const bool registered = register_meta_kernel(...);`.
bool register_meta_kernel(const std::string& op, std::initializer_list<DType> dtypes, std::any kernel);

// Registration at static-initialisation time from the file that defines the kernel:
//   TITAN_REGISTER_KERNEL(rms_norm_f32_ref, {"rms_norm", Device::CPU, DType::F32, "reference", "...", K{...}});
struct KernelRegistrar {
  explicit KernelRegistrar(KernelEntry e) { register_kernel(std::move(e)); }
};

}  // namespace titan::kernels

#define TITAN_REGISTER_KERNEL(id, ...) \
  static ::titan::kernels::KernelRegistrar titan_kernel_registrar_##id(::titan::kernels::KernelEntry __VA_ARGS__)
