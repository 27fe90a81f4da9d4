#include "titan/kernels/spec.h"

#include <algorithm>
#include <random>

#include "titan/core/check.h"

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

}  // namespace titan::kernels
