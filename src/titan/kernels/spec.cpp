#include "titan/kernels/spec.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::kernels {

namespace {
std::vector<OpSpec>& specs() {
  static std::vector<OpSpec> s;
  return s;
}
}  // namespace

void register_op_spec(OpSpec spec) {
  TITAN_CHECK(!find_op_spec(spec.op), "op specs: '", spec.op, "' registered twice");
  auto& s = specs();
  auto at = std::lower_bound(s.begin(), s.end(), spec.op, [](const OpSpec& a, const std::string& op) { return a.op < op; });
  s.insert(at, std::move(spec));
}

const std::vector<OpSpec>& op_specs() { return specs(); }

const OpSpec* find_op_spec(const std::string& op) {
  for (auto& s : specs())
    if (s.op == op) return &s;
  return nullptr;
}

Tensor spec_uniform(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(size_t(shape_numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dtype);
}

Tensor spec_random_ids(int64_t n, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, {n});
}

Tensor spec_random_labels(int64_t n, int64_t V, uint64_t seed) {
  Tensor t = spec_random_ids(n, V, seed);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 3; i < n; i += 4) p[i] = -100;
  return t;
}

Tensor spec_grad_input(Tensor t) { return t.set_requires_grad(true); }

Tolerance spec_f64_tolerance(double scale) { return {1e-12 * scale, 1e-10}; }

ToleranceFn spec_tolerance(Tolerance f32, Tolerance bf16) {
  return [f32, bf16](const Dims&, DType dt, Device, const std::string&) {
    return dt == DType::F64 ? spec_f64_tolerance() : dt == DType::BF16 ? bf16 : f32;
  };
}

ToleranceFn spec_exact_tolerance() {
  return [](const Dims&, DType, Device, const std::string&) { return Tolerance{0, 0}; };
}

namespace {

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// "lo..hi" over the values, or the one value.
std::string value_range(const std::vector<double>& values) {
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  return *lo == *hi ? short_number(*lo) : short_number(*lo) + ".." + short_number(*hi);
}

bool has_variant(const std::string& op, const std::string& variant, DType dtype) {
  for (const KernelEntry& e : all_kernels())
    if (e.op == op && e.variant == variant && e.dtype == dtype && e.device == Device::CPU) return true;
  return false;
}

// One table cell: the variant's tolerance in `dtype` over the spec's (valid) default shapes.
std::string tolerance_cell(const OpSpec& spec, const std::string& variant, DType dtype) {
  if (!has_variant(spec.op, variant, dtype)) return "-";
  std::vector<double> atol, rtol;
  bool relative_to_max = false;
  for (const Dims& dims : spec.default_shapes) {
    if (spec.check && !spec.check(dims).empty()) continue;
    const Tolerance t = spec.tolerance(dims, dtype, Device::CPU, variant);
    atol.push_back(t.atol);
    rtol.push_back(t.rtol);
    relative_to_max = relative_to_max || t.atol_relative_to_max;
  }
  if (atol.empty()) return "-";
  return value_range(atol) + (relative_to_max ? "·m" : "") + ", " + value_range(rtol);
}

}  // namespace

std::string tolerance_table_markdown() {
  std::string table = "| op | variant | f32: atol, rtol | bf16: atol, rtol | why |\n|---|---|---|---|---|\n";
  for (const OpSpec& spec : op_specs()) {
    std::set<std::string> variants;
    for (const KernelEntry& e : all_kernels())
      if (e.op == spec.op && e.device == Device::CPU && e.variant != "reference") variants.insert(e.variant);
    std::vector<std::string> ordered(variants.begin(), variants.end());
    std::stable_partition(ordered.begin(), ordered.end(), [](const std::string& v) { return v == "default"; });
    for (const std::string& variant : ordered)
      table += "| " + spec.op + " | " + variant + " | " + tolerance_cell(spec, variant, DType::F32) + " | " +
               tolerance_cell(spec, variant, DType::BF16) + " | " + spec.tolerance_why + " |\n";
  }
  return table;
}

}  // namespace titan::kernels
