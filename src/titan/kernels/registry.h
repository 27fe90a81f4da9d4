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
#include <set>
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

// An op is about to run its kernels: the op profiler's mark (core/op_timeline.h), with the current
// module. kernel_for calls it; ops that run without a registered kernel (cast) call it too.
void note_op_call(const std::string& op);

// Records the (module, op) pairs of the op calls this thread makes while it lives (nested
// recorders each see the calls of their own lifetime): which ops a model's modules run, as
// tests/models check qwen3::module_ops against the forward.
class OpCallRecorder {
 public:
  OpCallRecorder();
  ~OpCallRecorder();
  OpCallRecorder(const OpCallRecorder&) = delete;
  OpCallRecorder& operator=(const OpCallRecorder&) = delete;
  const std::set<std::pair<std::string, std::string>>& calls() const { return calls_; }

 private:
  friend void note_op_call(const std::string& op);
  std::set<std::pair<std::string, std::string>> calls_;  // (module, op)
  OpCallRecorder* outer_;
};

template <class K>
const K& kernel_for(const std::string& op, Device device, DType dtype, const std::string& variant) {
  note_op_call(op);
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

// One kernel of an op on a device, for register_kernels: its dtype, variant, one-line description,
// the op's kernel struct, and (optionally) when it can run.
struct VariantKernel {
  DType dtype;
  std::string variant;
  std::string description;
  std::any kernel;
  std::function<std::string()> available = {};
};

// Registers the kernels of `op` on `device` that one file defines, at static-initialisation time;
// `available` applies to every entry that has no check of its own (e.g. the CUDA files' "is a GPU
// usable"). Returns true, so a file registers with
//   const bool registered = kernels::register_kernels("rms_norm", Device::CPU, {
//       {DType::F32, "reference", "row loops, f32", RmsNormKernel{forward<float>, backward<float>}},
//       {DType::BF16, "reference", "row loops, f32 statistics", RmsNormKernel{...}}});
bool register_kernels(const std::string& op, Device device, std::initializer_list<VariantKernel> kernels,
                      const std::function<std::string()>& available = {});

// The element and accumulator types of an op's three reference kernels (reference.cpp): f64 in f64
// (gradient checks), f32 in f32, bf16 elements with f32 math.
template <class T, class Acc>
struct ReferenceTypes {};

// Registers an op's "reference" kernels on the CPU for f64, f32 and bf16, described as
// "<loops>, f64", "<loops>, f32" and "<loops>, bf16: <bf16>"; `kernel_for` builds the op's kernel
// struct from its templates for one ReferenceTypes (TITAN_REFERENCE_KERNEL below writes it):
//   register_reference_kernels("rms_norm", "row loops", "f32 statistics",
//       TITAN_REFERENCE_KERNEL(RmsNormKernel, rms_norm_forward_ref<T, Acc>, rms_norm_backward_ref<T, Acc>));
template <class KernelFor>
bool register_reference_kernels(const std::string& op, const std::string& loops, const std::string& bf16,
                                KernelFor kernel_for) {
  return register_kernels(
      op, Device::CPU,
      {{DType::F64, "reference", loops + ", f64", kernel_for(ReferenceTypes<double, double>{})},
       {DType::F32, "reference", loops + ", f32", kernel_for(ReferenceTypes<float, float>{})},
       {DType::BF16, "reference", loops + ", bf16: " + bf16, kernel_for(ReferenceTypes<Bf16, float>{})}});
}

// One kernel registered from a test file:
//   TITAN_REGISTER_KERNEL(rms_norm_f32_ref, {"rms_norm", Device::CPU, DType::F32, "reference", "...",
//   K{...}});
struct KernelRegistrar {
  explicit KernelRegistrar(KernelEntry e) { register_kernel(std::move(e)); }
};

}  // namespace titan::kernels

// The kernel_for of register_reference_kernels: the kernel struct `Kernel` initialised with the
// fields given, written in terms of the element type T and the accumulator type Acc.
#define TITAN_REFERENCE_KERNEL(Kernel, ...) \
  []<class T, class Acc>(::titan::kernels::ReferenceTypes<T, Acc>) { return Kernel{__VA_ARGS__}; }

#define TITAN_REGISTER_KERNEL(id, ...) \
  static ::titan::kernels::KernelRegistrar titan_kernel_registrar_##id(::titan::kernels::KernelEntry __VA_ARGS__)
