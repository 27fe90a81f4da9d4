#pragma once
// Tensor: a strided view (shape, strides, offset, dtype) over shared Storage.
// Views (reshape, transpose, narrow, expand) share storage and cost nothing;
// contiguous() copies only when needed. Kernels take contiguous inputs.
// Autograd state lives in an AutogradMeta shared by a tensor and its copies.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/core/dtype.h"

namespace titan {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 33, 4096]"
int64_t shape_numel(const Shape& s);

// Bytes owned by an allocator, or borrowed from elsewhere (an mmap) and kept alive by `owner`.
class Storage {
 public:
  Storage(size_t nbytes, Device device);  // holds no bytes until materialize()
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner);  // borrows
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }

  // Sharded data parallelism (ZeRO-3) keeps a block's full parameters and gradients only while a
  // layer computes with them: release() gives the bytes back to the device allocator and
  // materialize() takes them again (contents undefined), while every view of the storage, including
  // tensors autograd saved, stays valid across the gap. Only for storage this object allocated.
  void release();
  void materialize();
  bool resident() const { return data_ != nullptr; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  std::shared_ptr<void> owner_;  // null when we allocated
};

struct AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // A tensor whose storage holds no bytes until storage()->materialize() (Storage::release).
  static Tensor released(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::CPU);
  // Wraps memory owned elsewhere; `owner` keeps it alive (may be null for caller-managed).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                          Device device = Device::CPU);
  // Copies host values (converted to dtype).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32);
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::F64);
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "f32[2, 33]" for messages

  void* raw_data() const;  // pointer to element 0 (offset applied)
  template <class T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // Views. reshape needs a contiguous tensor (call contiguous() first otherwise);
  // one dimension may be -1. These record autograd nodes when needed.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;  // size-1 dims broadcast with stride 0
  Tensor contiguous() const;                // self when already contiguous
  Tensor clone() const;                     // always a new contiguous copy (no autograd)
  Tensor to(DType dtype) const;             // converted contiguous copy (no autograd; see ops::cast)
  Tensor to(Device device) const;           // contiguous copy on another device (no autograd)
  void copy_from(const Tensor& src);        // same shape; converts dtype; crosses devices; no autograd
  void fill(double value);
  std::vector<double> to_vector() const;    // any dtype and device, converted to double (tests, logs)
  double item() const;                      // single-element tensors

  // Autograd.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  // Undefined until backward wrote one. A ParamBlock parameter's preset buffer that no gradient of
  // this step reached yet (AutogradMeta::grad_unwritten) is zeroed by this read first.
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;   // preset a gradient buffer (e.g. a slice of a flat one)
  Tensor detach() const;                     // same storage, no autograd history
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return meta_; }
  std::shared_ptr<AutogradMeta>& ensure_autograd_meta();

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::shared_ptr<AutogradMeta> meta_;

  Tensor view_of(const Shape& shape, const Shape& strides, int64_t offset) const;
};

// The autograd state a tensor carries (autograd/autograd.h records and reads it).
struct AutogradMeta {
  bool requires_grad = false;
  bool is_leaf = true;  // false once an op produced the tensor
  Tensor grad;          // accumulated gradient (or a preset buffer slice for parameters)
  bool grad_preset = false;  // grad is a buffer given by set_grad (a parameter's slice of its block's)
  std::string name;     // parameters carry their name (diagnostics)
  // Set by an op whose backward hands this tensor's gradient to its input unchanged (a cast between
  // f32 and bf16): a gradient may be added to that input's directly (autograd::GradientSink).
  std::shared_ptr<AutogradMeta> grad_passes_to;
  // A parameter's preset buffer (grad_preset) that holds no gradient of this step yet: instead of
  // writing zeros over it, nn::ParamBlock::zero_grad sets this, and the first gradient writes the
  // buffer instead of adding to it (autograd::GradientSink::target, accumulate_grad). Shared by the
  // metas that preset the same buffer (a parameter's value and its compute copy).
  std::shared_ptr<bool> grad_unwritten;
  // An intermediate whose producing node ran in a backward and left the tape: a gradient reaching it
  // later (a second backward through a shared part of a graph) could go no further, so it is refused.
  bool graph_released = false;
};

Shape contiguous_strides(const Shape& shape);

// How a view's gradient flows back: the gradient of the view in, the gradient of its input out.
using ViewBackward = std::function<Tensor(const Tensor& grad_of_view)>;
// Records `out` as a view of `input` (op names it) when gradients are tracked. core sits below
// autograd, so autograd installs the recorder when it loads (autograd/autograd.cpp); the view ops
// above call it only for inputs that require grad.
using ViewGradRecorder = void (*)(const char* op, const Tensor& input, Tensor& out, ViewBackward backward);
void set_view_grad_recorder(ViewGradRecorder recorder);

// Gradients are f64 for f64 tensors (gradient checks) and f32 for everything else.
inline DType grad_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

}  // namespace titan
