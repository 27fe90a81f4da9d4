#include "titan/core/tensor.h"

#include <cstring>
#include <numeric>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/element.h"

namespace titan {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      TITAN_FAIL("shape ", shape_str(s), " has more elements than an int64 holds");
  return n;
}

// Every way a tensor is made checks its shape here, so the error names the function the caller used.
static void check_dims(const char* who, const Shape& shape) {
  for (size_t i = 0; i < shape.size(); ++i)
    TITAN_CHECK(shape[i] >= 0, who, ": dimension ", i, " of shape ", shape_str(shape), " is negative (",
                shape[i], "); sizes are >= 0");
}

// The bytes a tensor of this shape and dtype holds, checked: the element count fits an int64
// (shape_numel) and so does its product with the element size (a wrapped product would put a huge
// tensor on a few bytes).
static size_t checked_nbytes(const char* who, const Shape& shape, DType dtype) {
  check_dims(who, shape);
  int64_t bytes = 0;
  TITAN_CHECK(!__builtin_mul_overflow(shape_numel(shape), int64_t(dtype_size(dtype)), &bytes), who,
              ": shape ", shape_str(shape), " of ", dtype_name(dtype),
              " holds more bytes than an int64 counts");
  return size_t(bytes);
}

// A product that saturates instead of overflowing: the strides of an empty shape with huge other
// dimensions (numel 0) are never used to address anything, but must not be undefined behaviour.
static int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = acc;
    acc = saturating_mul(acc, shape[size_t(i)]);
  }
  return st;
}

// ---------------------------------------------------------------- Storage

Storage::Storage(size_t nbytes, Device device) : data_(nullptr), nbytes_(nbytes), device_(device) {}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner)
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {
  if (!owner_) owner_ = std::shared_ptr<void>(data, [](void*) {});  // caller-managed: never free
}

Storage::~Storage() {
  if (!owner_ && data_) device_services(device_).deallocate(data_, nbytes_);
}

void Storage::release() {
  TITAN_CHECK(!owner_, "Storage::release: the bytes are borrowed (an mmap or a caller's buffer), not ours to free");
  if (!data_) return;
  device_services(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
}

void Storage::materialize() {
  TITAN_CHECK(!owner_, "Storage::materialize: the bytes are borrowed, not allocated here");
  if (!data_) data_ = device_services(device_).allocate(nbytes_);
}

// ---------------------------------------------------------------- construction

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_dims("Tensor::empty", shape);
  Tensor t = released(shape, dtype, device);
  t.storage_->materialize();
  return t;
}

Tensor Tensor::released(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(checked_nbytes("Tensor::released", shape, dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  device_services(device).fill(t.raw_data(), t.numel(), dtype, 0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                         Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, checked_nbytes("Tensor::from_blob", shape, dtype), device,
                                         std::move(owner));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

namespace {

ViewGradRecorder g_view_grad_recorder = nullptr;

void record_view(const char* op, const Tensor& input, Tensor& out, ViewBackward backward) {
  if (g_view_grad_recorder) g_view_grad_recorder(op, input, out, std::move(backward));
}

// A row-major walk over a tensor's elements (host memory only).
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  for_each_strided_offset(int(shape.size()), shape.data(), strides.data(), f);
}

}  // namespace

void set_view_grad_recorder(ViewGradRecorder recorder) { g_view_grad_recorder = recorder; }

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, DType dtype) {
  check_dims("Tensor::from_vector", shape);
  TITAN_CHECK(int64_t(v.size()) == shape_numel(shape), "Tensor::from_vector: ", v.size(),
              " values for shape ", shape_str(shape), " of ", shape_numel(shape), " elements");
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_element(t.raw_data(), dtype, int64_t(i), v[i]);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& shape, DType dtype) {
  check_dims("Tensor::from_vector", shape);
  TITAN_CHECK(int64_t(v.size()) == shape_numel(shape), "Tensor::from_vector: ", v.size(),
              " values for shape ", shape_str(shape), " of ", shape_numel(shape), " elements");
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_element(t.raw_data(), dtype, int64_t(i), v[i]);
  return t;
}

Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& shape, DType dtype) {
  check_dims("Tensor::from_vector", shape);
  TITAN_CHECK(int64_t(v.size()) == shape_numel(shape), "Tensor::from_vector: ", v.size(),
              " values for shape ", shape_str(shape), " of ", shape_numel(shape), " elements");
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_element(t.raw_data(), dtype, int64_t(i), double(v[i]));
  if (dtype == DType::I64) std::memcpy(t.raw_data(), v.data(), v.size() * 8);  // exact beyond 2^53
  return t;
}

// ---------------------------------------------------------------- accessors

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t wrapped = d < 0 ? d + nd : d;
  TITAN_CHECK(wrapped >= 0 && wrapped < nd, "size(", d, ") out of range for tensor ", str(), " of ", nd,
              " dims");
  return shape_[size_t(wrapped)];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    size_t u = size_t(i);
    if (shape_[u] != 1 && strides_[u] != acc) return false;
    acc = saturating_mul(acc, shape_[u]);
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

void* Tensor::raw_data() const {
  TITAN_CHECK(defined(), "access to an undefined tensor");
  TITAN_CHECK(storage_->resident(), "access to a released tensor ", str(),
              " (a sharded parameter or gradient used outside the layer that gathered it)");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

// ---------------------------------------------------------------- views

Tensor Tensor::view_of(const Shape& shape, const Shape& strides, int64_t offset) const {
  Tensor t = *this;  // the same storage, dtype and device
  t.meta_.reset();   // no autograd history of its own until the caller records the view
  t.shape_ = shape;
  t.strides_ = strides;
  t.offset_ = offset;
  return t;
}

Tensor Tensor::reshape(const Shape& new_shape_in) const {
  Shape new_shape = new_shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      TITAN_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(new_shape_in));
      infer = int64_t(i);
    } else {
      TITAN_CHECK(new_shape[i] >= 0, "reshape: dimension ", i, " of ", shape_str(new_shape_in),
                  " is negative; sizes are >= 0, or -1 (inferred) once");
      known *= new_shape[i];
    }
  }
  if (infer >= 0) {
    TITAN_CHECK(known > 0 && numel() % known == 0, "reshape: cannot reshape ", str(), " to ", shape_str(new_shape_in));
    new_shape[size_t(infer)] = numel() / known;
  }
  TITAN_CHECK(shape_numel(new_shape) == numel(), "reshape: ", str(), " has ", numel(), " elements, shape ",
              shape_str(new_shape_in), " needs ", shape_numel(new_shape));
  TITAN_CHECK(is_contiguous(), "reshape: tensor ", str(), " is not contiguous; call contiguous() first");
  Tensor out = view_of(new_shape, contiguous_strides(new_shape), offset_);
  if (requires_grad()) {
    Shape old_shape = shape_;
    record_view("reshape", *this, out, [old_shape](const Tensor& g) { return g.contiguous().reshape(old_shape); });
  }
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t nd = dim();
  if (d0 < 0) d0 += nd;
  if (d1 < 0) d1 += nd;
  TITAN_CHECK(d0 >= 0 && d0 < nd && d1 >= 0 && d1 < nd, "transpose(", d0, ", ", d1, ") out of range for ", str());
  Shape sh = shape_, st = strides_;
  std::swap(sh[size_t(d0)], sh[size_t(d1)]);
  std::swap(st[size_t(d0)], st[size_t(d1)]);
  Tensor out = view_of(sh, st, offset_);
  if (requires_grad())
    record_view("transpose", *this, out, [d0, d1](const Tensor& g) { return g.transpose(d0, d1).contiguous(); });
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  TITAN_CHECK(d >= 0 && d < dim(), "narrow: dim ", d, " out of range for ", str());
  // length <= size - start: start + length could overflow.
  TITAN_CHECK(start >= 0 && length >= 0 && start <= shape_[size_t(d)] && length <= shape_[size_t(d)] - start,
              "narrow: start ", start, ", length ", length, " out of range for dim ", d, " of ", str());
  Shape sh = shape_;
  sh[size_t(d)] = length;
  Tensor out = view_of(sh, strides_, offset_ + start * strides_[size_t(d)]);
  if (requires_grad()) {
    Shape full = shape_;
    record_view("narrow", *this, out, [full, d, start, length](const Tensor& g) {
      Tensor gi = Tensor::zeros(full, g.dtype(), g.device());
      gi.narrow(d, start, length).copy_from(g);
      return gi;
    });
  }
  return out;
}

Tensor Tensor::expand(const Shape& shape) const {
  TITAN_CHECK(int64_t(shape.size()) == dim(), "expand: ", str(), " to ", shape_str(shape), " needs equal rank");
  check_dims("expand", shape);
  Shape st = strides_;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape_[i] == shape[i]) continue;
    TITAN_CHECK(shape_[i] == 1, "expand: dim ", i, " of ", str(), " is not 1, cannot expand to ", shape_str(shape));
    st[i] = 0;
  }
  Tensor out = view_of(shape, st, offset_);
  if (requires_grad()) {
    Shape small = shape_;
    record_view("expand", *this, out, [small](const Tensor& g) {
      // Sum the gradient over the broadcast dimensions (host loop: no op needs it on a device).
      TITAN_CHECK(g.device() == Device::CPU, "expand: backward through a broadcast runs on the cpu only, got a ",
                  device_name(g.device()), " gradient");
      Tensor gi = Tensor::zeros(small, g.dtype());
      Tensor acc = gi.expand(g.shape());  // stride-0 view used as a scatter target
      Tensor src = g.contiguous();
      std::vector<double> sums(size_t(gi.numel()), 0.0);
      const Shape& ast = acc.strides();
      for_each_offset(src.shape(), ast, [&](int64_t lin, int64_t off) {
        sums[size_t(off)] += load_element(src.raw_data(), src.dtype(), lin);
      });
      for (size_t i = 0; i < sums.size(); ++i) store_element(gi.raw_data(), gi.dtype(), int64_t(i), sums[i]);
      return gi;
    });
  }
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = clone();
  if (requires_grad()) record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  Tensor out = empty(shape_, dtype, device_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  TITAN_CHECK(src.shape() == shape_, "copy_from: shape ", src.str(), " into ", str());
  if (numel() == 0) return;
  if (src.device() != device_) {
    // Across devices (one side is the host): convert on the source's device, move contiguous bytes.
    TITAN_CHECK(src.device() == Device::CPU || device_ == Device::CPU, "copy_from: ", device_name(src.device()),
                " -> ", device_name(device_), " needs a stop on the cpu");
    Tensor staged = src.dtype() == dtype_ ? src.contiguous() : src.to(dtype_);
    Tensor dst = is_contiguous() ? *this : empty(shape_, dtype_, device_);
    if (device_ == Device::CPU) {
      device_services(src.device()).count_host_read();
      device_services(src.device()).copy_to_host(dst.raw_data(), staged.raw_data(), nbytes());
    } else
      device_services(device_).copy_from_host(dst.raw_data(), staged.raw_data(), nbytes());
    if (dst.storage_ != storage_) copy_from(dst);  // a strided destination: one more copy on its device
    return;
  }
  DeviceServices& dev = device_services(device_);
  if (src.dtype() != dtype_) {
    Tensor s = src.contiguous();
    if (is_contiguous()) return dev.convert(raw_data(), dtype_, s.raw_data(), s.dtype(), numel());
    Tensor converted = empty(shape_, dtype_, device_);
    dev.convert(converted.raw_data(), dtype_, s.raw_data(), s.dtype(), numel());
    return copy_from(converted);
  }
  if (is_contiguous() && src.is_contiguous()) return dev.copy(raw_data(), src.raw_data(), nbytes());
  dev.copy_strided(raw_data(), strides_.data(), src.raw_data(), src.strides().data(), dtype_, int(dim()),
                   shape_.data());
}

void Tensor::fill(double value) {
  if (numel() == 0) return;
  if (is_contiguous()) return device_services(device_).fill(raw_data(), numel(), dtype_, value);
  Tensor filled = full(shape_, value, dtype_, device_);
  copy_from(filled);
}

std::vector<double> Tensor::to_vector() const {
  // One host read: the copy to the host counts it for a device tensor, this line for a CPU one.
  if (device_ == Device::CPU) device_services(Device::CPU).count_host_read();
  const Tensor host = device_ == Device::CPU ? *this : to(Device::CPU);
  std::vector<double> out(static_cast<size_t>(host.numel()));
  const void* base = host.raw_data();
  for_each_offset(shape_, host.strides_,
                  [&](int64_t lin, int64_t off) { out[size_t(lin)] = load_element(base, dtype_, off); });
  return out;
}

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

double Tensor::item() const {
  TITAN_CHECK(numel() == 1, "item(): tensor ", str(), " has ", numel(), " elements, expected 1");
  return to_vector()[0];
}

// ---------------------------------------------------------------- autograd accessors

std::shared_ptr<AutogradMeta>& Tensor::ensure_autograd_meta() {
  if (!meta_) meta_ = std::make_shared<AutogradMeta>();
  return meta_;
}

bool Tensor::requires_grad() const { return meta_ && meta_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool on) {
  ensure_autograd_meta()->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  if (!meta_) return Tensor();
  // A parameter's preset buffer no gradient of this step has reached yet holds an earlier step's
  // values (nn::ParamBlock::zero_grad writes no zeros): zero is what it means, written on this read.
  if (meta_->grad_unwritten && *meta_->grad_unwritten) {
    meta_->grad.fill(0.0);
    *meta_->grad_unwritten = false;
  }
  return meta_->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  TITAN_CHECK(meta_, "set_grad on a tensor without autograd state (call set_requires_grad first)");
  TITAN_CHECK(grad.shape() == shape_, "set_grad: gradient ", grad.str(), " for tensor ", str());
  meta_->grad = grad;
  meta_->grad_preset = true;
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.meta_.reset();
  return t;
}

}  // namespace titan
