#include "titan/kernels/parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/tensor.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/embedding.h"
#include "titan/ops/linear.h"
#include "titan/ops/moe.h"
#include "titan/ops/optim.h"
#include "titan/ops/rms_norm.h"
#include "titan/ops/rope.h"
#include "titan/ops/swiglu.h"

namespace titan::kernels {

namespace {

using Dims = std::vector<int64_t>;
using OpFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// One comparison's inputs: float inputs marked requires_grad get their gradients compared too.
struct Case {
  std::vector<Tensor> inputs;
  std::vector<std::string> input_names;
  OpFn fn;
  std::vector<std::string> output_names;
};

// |diff| <= atol * (relative_to_max ? max(1, max|ref| of the tensor) : 1) + rtol * |ref|.
struct Tolerance {
  double atol = 0, rtol = 0;
  bool atol_relative_to_max = false;
};

struct Driver {
  std::string op;
  std::vector<std::string> dims;  // names, in the order --shapes gives them
  size_t required_dims;           // trailing dims beyond this many are optional
  std::vector<Dims> default_shapes;
  std::function<std::string(const Dims&)> check;  // "" or why the shape is invalid
  std::function<Case(const Dims&, DType, uint64_t seed, const std::string& variant)> make;
  std::function<Tolerance(const Dims&, DType, const std::string& variant)> tolerance;
};

Tensor uniform(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(size_t(shape_numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dtype);
}

Tensor random_ids(int64_t n, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, {n});
}

// Labels in [0, V) with every fourth row ignored (-100), so both paths see ignored rows.
Tensor random_labels(int64_t n, int64_t V, uint64_t seed) {
  Tensor t = random_ids(n, V, seed);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 3; i < n; i += 4) p[i] = -100;
  return t;
}

Tensor grad_input(Tensor t) {
  return t.set_requires_grad(true);
}

// f64 variants exist only where f64 is a test path; there the only difference is reassociation.
Tolerance f64_tolerance(double scale = 1) {
  return {1e-12 * scale, 1e-10};
}

// Tolerances are those the op tests state for the same comparison (tests/ops/*_test.cpp,
// tests/backend/attention_test.cpp); docs/kernels.md has the table.
std::vector<Driver> make_drivers() {
  std::vector<Driver> d;
  auto none = [](const Dims&) { return std::string(); };

  d.push_back(
      {"linear",
       {"M", "N", "K"},
       3,
       {{1, 1, 1}, {7, 33, 19}, {64, 96, 130}},
       none,
       [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
         return Case{
             {grad_input(uniform({s[0], s[2]}, dt, seed)), grad_input(uniform({s[1], s[2]}, dt, seed + 1))},
             {"x", "w"},
             [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::linear(in[0], in[1])}; },
             {"y"}};
       },
       [](const Dims& s, DType dt, const std::string&) -> Tolerance {
         const double K = double(s[2]);
         if (dt == DType::F64) return f64_tolerance(K);
         return dt == DType::BF16 ? Tolerance{1e-4 * K, 8e-3} : Tolerance{1e-5 * K, 1e-5};
       }});

  d.push_back(
      {"attention",
       {"B", "S", "Hq", "Hkv", "D"},
       5,
       {{1, 1, 2, 1, 8}, {2, 37, 4, 2, 64}, {1, 70, 4, 1, 25}},
       [](const Dims& s) { return s[2] % s[3] == 0 ? std::string() : "Hq must be a multiple of Hkv"; },
       [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
         const double scale = 1.0 / std::sqrt(double(s[4]));
         return Case{{grad_input(uniform({s[0], s[1], s[2], s[4]}, dt, seed, -2, 2)),
                      grad_input(uniform({s[0], s[1], s[3], s[4]}, dt, seed + 1, -2, 2)),
                      grad_input(uniform({s[0], s[1], s[3], s[4]}, dt, seed + 2))},
                     {"q", "k", "v"},
                     [scale](const std::vector<Tensor>& in) {
                       return std::vector<Tensor>{ops::attention(in[0], in[1], in[2], scale)};
                     },
                     {"out"}};
       },
       [](const Dims&, DType dt, const std::string& variant) -> Tolerance {
         if (dt == DType::F64) return f64_tolerance();
         // bf16_probs rounds P and dS to bf16 (tests/backend/attention_test.cpp, Bf16Probs...).
         if (variant == "bf16_probs") return Tolerance{1e-2, 1e-2, true};
         return dt == DType::BF16 ? Tolerance{1e-4, 4e-3, true} : Tolerance{2e-5, 2e-5, true};
       }});

  d.push_back({"rms_norm",
               {"R", "D"},
               2,
               {{1, 1}, {5, 7}, {33, 128}, {3, 1000}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 return Case{{grad_input(uniform({s[0], s[1]}, dt, seed, -2, 2)),
                              grad_input(uniform({s[1]}, dt, seed + 1, 0.5, 1.5))},
                             {"x", "w"},
                             [](const std::vector<Tensor>& in) {
                               return std::vector<Tensor>{ops::rms_norm(in[0], in[1], 1e-6)};
                             },
                             {"y"}};
               },
               [](const Dims&, DType dt, const std::string&) -> Tolerance {
                 if (dt == DType::F64) return f64_tolerance();
                 return dt == DType::BF16 ? Tolerance{2e-2, 8e-3} : Tolerance{1e-5, 1e-5};
               }});

  d.push_back({"rope",
               {"B", "S", "H", "D"},
               4,
               {{1, 1, 1, 2}, {2, 7, 3, 10}, {2, 33, 4, 128}},
               [](const Dims& s) { return s[3] % 2 == 0 ? std::string() : "D must be even"; },
               [](const Dims& s, DType dt, uint64_t seed, const std::string& variant) {
                 // gather_free requires positions 0..S-1 (what training uses); the others are also
                 // given scattered positions per batch row, which exercises their table lookups.
                 std::vector<int64_t> pos;
                 Shape pos_shape;
                 if (variant == "gather_free") {
                   for (int64_t i = 0; i < s[1]; ++i) pos.push_back(i);
                   pos_shape = {s[1]};
                 } else {
                   Tensor r = random_ids(s[0] * s[1], 4096, seed + 1);
                   pos.assign(r.data<int64_t>(), r.data<int64_t>() + r.numel());
                   pos_shape = {s[0], s[1]};
                 }
                 return Case{{grad_input(uniform({s[0], s[1], s[2], s[3]}, dt, seed, -3, 3)),
                              Tensor::from_vector(pos, pos_shape)},
                             {"x", "positions"},
                             [](const std::vector<Tensor>& in) {
                               return std::vector<Tensor>{ops::rope(in[0], in[1], 1e6)};
                             },
                             {"y"}};
               },
               [](const Dims&, DType, const std::string&) {
                 return Tolerance{0, 0};
               }});

  d.push_back(
      {"swiglu",
       {"N"},
       1,
       {{1}, {37}, {4099}},
       none,
       [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
         return Case{
             {grad_input(uniform({s[0]}, dt, seed, -8, 8)), grad_input(uniform({s[0]}, dt, seed + 1, -2, 2))},
             {"gate", "up"},
             [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::swiglu(in[0], in[1])}; },
             {"y"}};
       },
       [](const Dims&, DType dt, const std::string&) -> Tolerance {
         if (dt == DType::F64) return f64_tolerance();
         return dt == DType::BF16 ? Tolerance{1e-6, 8e-3} : Tolerance{1e-6, 2e-6};
       }});

  d.push_back({"embedding",
               {"N", "V", "D"},
               3,
               {{1, 1, 1}, {41, 37, 19}, {333, 1013, 97}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 return Case{{random_ids(s[0], s[1], seed), grad_input(uniform({s[1], s[2]}, dt, seed + 1))},
                             {"ids", "table"},
                             [](const std::vector<Tensor>& in) {
                               return std::vector<Tensor>{ops::embedding(in[0], in[1])};
                             },
                             {"out"}};
               },
               [](const Dims&, DType, const std::string&) {
                 return Tolerance{0, 0};
               }});

  d.push_back({"cross_entropy",
               {"N", "V"},
               2,
               {{1, 1}, {7, 1000}, {33, 257}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 return Case{{grad_input(uniform({s[0], s[1]}, dt, seed, -8, 8)),
                              random_labels(s[0], s[1], seed + 1)},
                             {"logits", "labels"},
                             [](const std::vector<Tensor>& in) {
                               return std::vector<Tensor>{ops::cross_entropy(in[0], in[1])};
                             },
                             {"loss"}};
               },
               [](const Dims&, DType dt, const std::string&) {
                 return dt == DType::F64 ? f64_tolerance() : Tolerance{1e-7, 2e-5};
               }});

  d.push_back({"linear_cross_entropy",
               {"N", "V", "D", "chunk"},
               3,
               {{1, 1, 1, 1}, {37, 1000, 19, 384}, {13, 257, 64}, {16, 100, 8, 7}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 const int64_t chunk = s.size() > 3 ? s[3] : 8192;
                 return Case{
                     {grad_input(uniform({s[0], s[2]}, dt, seed)),
                      grad_input(uniform({s[1], s[2]}, dt, seed + 1)), random_labels(s[0], s[1], seed + 2)},
                     {"hidden", "weight", "labels"},
                     [chunk](const std::vector<Tensor>& in) {
                       return std::vector<Tensor>{
                           ops::linear_cross_entropy(in[0], in[1], in[2], -100, chunk)};
                     },
                     {"loss"}};
               },
               [](const Dims&, DType dt, const std::string&) -> Tolerance {
                 if (dt == DType::F64) return f64_tolerance();
                 return dt == DType::BF16 ? Tolerance{1e-5, 1e-3} : Tolerance{1e-6, 1e-4};
               }});

  d.push_back({"router_topk",
               {"T", "E", "k"},
               3,
               {{1, 1, 1}, {37, 8, 2}, {64, 128, 8}},
               [](const Dims& s) { return s[2] <= s[1] ? std::string() : "k must be <= E"; },
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 const int64_t k = s[2];
                 return Case{{grad_input(uniform({s[0], s[1]}, dt, seed, -2, 2))},
                             {"logits"},
                             [k](const std::vector<Tensor>& in) {
                               auto r = ops::router_topk(in[0], k, true);
                               return std::vector<Tensor>{r.weights, r.indices, r.probs, r.counts};
                             },
                             {"weights", "indices", "probs", "counts"}};
               },
               // The router's softmax runs in f32 on widened logits in every dtype: the f32 bound of
               // a vectorised exp and reassociated sums (as cross_entropy) holds for bf16 too.
               [](const Dims&, DType dt, const std::string&) {
                 return dt == DType::F64 ? f64_tolerance() : Tolerance{1e-7, 2e-5};
               }});

  d.push_back({"moe_experts",
               {"T", "D", "F", "E", "k"},
               5,
               {{1, 8, 4, 3, 1}, {5, 6, 4, 4, 2}, {37, 24, 20, 7, 3}, {131, 72, 40, 8, 2}},
               [](const Dims& s) { return s[4] <= s[3] ? std::string() : "k must be <= E"; },
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 const int64_t T = s[0], D = s[1], F = s[2], E = s[3], k = s[4];
                 // Routing from the reference router on f32 logits; routing weights stay f32 (as the
                 // model passes them) while x and the expert weights take the dtype.
                 ops::RouterOutput r;
                 {
                   autograd::NoGradGuard no_grad;
                   ForceVariant ref("router_topk", "reference");
                   r = ops::router_topk(uniform({T, E}, DType::F32, seed, -2, 2), k, true);
                 }
                 const DType wdt = dt == DType::F64 ? DType::F64 : DType::F32;
                 const double sd = 1.7 / std::sqrt(double(D)), sf = 1.7 / std::sqrt(double(F));
                 return Case{
                     {grad_input(uniform({T, D}, dt, seed + 1)), grad_input(r.weights.to(wdt)), r.indices,
                      grad_input(uniform({E, F, D}, dt, seed + 2, -sd, sd)),
                      grad_input(uniform({E, F, D}, dt, seed + 3, -sd, sd)),
                      grad_input(uniform({E, D, F}, dt, seed + 4, -sf, sf))},
                     {"x", "weights", "indices", "w_gate", "w_up", "w_down"},
                     [](const std::vector<Tensor>& in) {
                       return std::vector<Tensor>{ops::moe_experts(in[0], in[1], in[2], in[3], in[4], in[5])};
                     },
                     {"y"}};
               },
               [](const Dims& s, DType dt, const std::string&) -> Tolerance {
                 const double n = double(std::max({s[0], s[1], s[2]}));
                 if (dt == DType::F64) return f64_tolerance(n);
                 return dt == DType::BF16 ? Tolerance{1e-2, 1e-2} : Tolerance{1e-7 * n, 1e-5};
               }});

  d.push_back({"adamw",
               {"n"},
               1,
               {{1}, {1000}, {65537}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 const int64_t n = s[0];
                 // Three steps from non-zero moments, each with its own gradient.
                 return Case{{uniform({n}, dt, seed), uniform({n}, dt, seed + 1, -1e-2, 1e-2),
                              uniform({n}, dt, seed + 2, 0, 1e-4), uniform({n}, dt, seed + 3),
                              uniform({n}, dt, seed + 4, -1e-3, 1e-3), uniform({n}, dt, seed + 5, -10, 10)},
                             {"param", "exp_avg", "exp_avg_sq", "grad1", "grad2", "grad3"},
                             [](const std::vector<Tensor>& in) {
                               Tensor p = in[0], m = in[1], v = in[2];
                               for (int64_t t = 1; t <= 3; ++t)
                                 ops::adamw_step(p, in[size_t(2 + t)], m, v, {}, t);
                               return std::vector<Tensor>{p, m, v};
                             },
                             {"param", "exp_avg", "exp_avg_sq"}};
               },
               // optim_test: bit-identical to the reference (same fused multiply-adds).
               [](const Dims&, DType, const std::string&) {
                 return Tolerance{0, 0};
               }});

  d.push_back({"grad_norm",
               {"n"},
               1,
               {{1}, {1000}, {200003}},
               none,
               [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
                 return Case{
                     {uniform({s[0]}, dt, seed)},
                     {"grad"},
                     [](const std::vector<Tensor>& in) {
                       return std::vector<Tensor>{Tensor::full({1}, ops::grad_norm_sq(in[0]), DType::F64)};
                     },
                     {"sum_sq"}};
               },
               // optim_test: exact squares summed in f64 in another order, n ulps of the sum.
               [](const Dims& s, DType, const std::string&) {
                 return Tolerance{0, double(s[0]) * 0x1p-52};
               }});

  d.push_back(
      {"add",
       {"N"},
       1,
       {{1}, {37}, {4099}},
       none,
       [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
         return Case{
             {grad_input(uniform({s[0]}, dt, seed)), grad_input(uniform({s[0]}, dt, seed + 1))},
             {"a", "b"},
             [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::add(in[0], in[1])}; },
             {"out"}};
       },
       // One correctly rounded addition per element: any variant must be exact.
       [](const Dims&, DType, const std::string&) {
         return Tolerance{0, 0};
       }});
  return d;
}

const std::vector<Driver>& drivers() {
  static const std::vector<Driver> d = make_drivers();
  return d;
}

const Driver* find_driver(const std::string& op) {
  for (auto& d : drivers())
    if (d.op == op) return &d;
  return nullptr;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string shape_text(const Driver& d, const Dims& s) {
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) t += (i ? " " : "") + d.dims[i] + "=" + std::to_string(s[i]);
  return t;
}

void check_shape(const Driver& d, const Dims& s) {
  TITAN_CHECK(s.size() >= d.required_dims && s.size() <= d.dims.size(), "kernels parity: ", d.op, " shape ",
              shape_str(s), " needs ", d.required_dims == d.dims.size() ? "" : "at least ", d.required_dims,
              " dimensions ", join(d.dims, "x"));
  for (int64_t v : s)
    TITAN_CHECK(v >= 1, "kernels parity: ", d.op, " shape ", shape_text(d, s),
                ": every dimension must be >= 1");
  std::string why = d.check(s);
  TITAN_CHECK(why.empty(), "kernels parity: ", d.op, " shape ", shape_text(d, s), ": ", why);
}

struct Run {
  std::vector<Tensor> outputs, grads;  // grads[i]: gradient of input i (undefined when none)
};

// Runs the case with `variant` forced, on fresh copies of the inputs, then backward seeded with
// fixed random weights on every float output that took part in autograd.
Run run_case(const std::string& op, const std::string& variant, const Case& c, uint64_t seed) {
  ForceVariant force(op, variant);
  autograd::Tape tape;
  autograd::TapeScope scope(&tape);
  std::vector<Tensor> in;
  for (auto& t : c.inputs) {
    Tensor x = t.clone();
    if (t.requires_grad()) x.set_requires_grad(true);
    in.push_back(x);
  }
  Run r;
  r.outputs = c.fn(in);
  std::vector<Tensor> outs, seeds;
  for (size_t i = 0; i < r.outputs.size(); ++i)
    if (dtype_is_float(r.outputs[i].dtype()) && r.outputs[i].requires_grad()) {
      outs.push_back(r.outputs[i]);
      const DType odt = r.outputs[i].dtype();
      Tensor g = uniform(r.outputs[i].shape(), grad_dtype(odt), seed + 100 + i);
      // bf16 variants may take the upstream gradient in bf16 (as a bf16 autograd hands it over;
      // linear, attention and moe_experts do), the reference keeps it in f32: bf16-representable
      // seeds make that documented rounding exact, so the comparison measures the kernels.
      seeds.push_back(odt == DType::BF16 ? g.to(DType::BF16).to(grad_dtype(odt)) : g);
    }
  if (!outs.empty()) autograd::backward(tape, outs, seeds);
  for (auto& x : in) r.grads.push_back(x.requires_grad() ? x.grad() : Tensor());
  return r;
}

// Folds one tensor's comparison into the result; returns false (with the note set) on a mismatch
// that makes numbers meaningless (missing tensor, shape).
bool compare(const Tensor& got, const Tensor& want, const std::string& name, const Tolerance& tol,
             ParityResult& r, double& worst_excess) {
  if (got.defined() != want.defined()) {
    r.note = name + ": " + (got.defined() ? "the reference computes none" : "the variant computes none");
    return false;
  }
  if (!want.defined()) return true;
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    r.note = name + ": " + got.str() + " vs reference " + want.str();
    return false;
  }
  const auto a = got.to_vector(), b = want.to_vector();
  const bool exact = !dtype_is_float(want.dtype());
  double max_ref = 0;
  for (double v : b)
    if (std::isfinite(v)) max_ref = std::max(max_ref, std::fabs(v));
  const double atol = exact ? 0 : tol.atol * (tol.atol_relative_to_max ? std::max(1.0, max_ref) : 1.0);
  const double rtol = exact ? 0 : tol.rtol;
  r.atol = std::max(r.atol, atol);
  r.rtol = std::max(r.rtol, rtol);
  // Relative differences of entries that cancelled to ~0 are judged against 1e-3 of the tensor's
  // largest magnitude (1 for an all-zero reference), so the reported ratio means something.
  const double floor = max_ref > 0 ? 1e-3 * max_ref : 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool nan_a = std::isnan(a[i]), nan_b = std::isnan(b[i]);
    double diff = nan_a || nan_b ? (nan_a == nan_b ? 0.0 : INFINITY) : std::fabs(a[i] - b[i]);
    if (a[i] == b[i]) diff = 0;  // equal infinities
    r.max_abs = std::max(r.max_abs, diff);
    r.max_rel = std::max(r.max_rel, diff == 0 ? 0.0 : diff / std::max(std::fabs(b[i]), floor));
    const double excess = diff - (atol + rtol * std::fabs(b[i]));
    if (excess > 0 && excess > worst_excess) {
      worst_excess = excess;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s[%zu]: %.9g vs reference %.9g", name.c_str(), i, a[i], b[i]);
      r.note = buf;
    }
  }
  return true;
}

void compare_runs(const Case& c, const Run& got, const Run& want, const Tolerance& tol, ParityResult& r) {
  double worst_excess = 0;
  bool ok = true;
  for (size_t i = 0; ok && i < want.outputs.size(); ++i)
    ok = compare(got.outputs[i], want.outputs[i], c.output_names[i], tol, r, worst_excess);
  for (size_t i = 0; ok && i < want.grads.size(); ++i)
    ok = compare(got.grads[i], want.grads[i], "d" + c.input_names[i], tol, r, worst_excess);
  r.compared = ok;
  r.status = ok && worst_excess == 0 ? ParityStatus::Pass : ParityStatus::Fail;
}

uint64_t mix(uint64_t seed, const std::string& op, size_t shape_index, DType dt) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  for (char ch : op) h = (h ^ uint8_t(ch)) * 0x100000001B3ull;
  return h ^ (uint64_t(shape_index) << 32) ^ (uint64_t(dt) << 48);
}

}  // namespace

std::vector<std::string> parity_ops() {
  std::vector<std::string> ops;
  for (auto& d : drivers()) ops.push_back(d.op);
  return ops;
}

std::string parity_shape_dims(const std::string& op) {
  const Driver* d = find_driver(op);
  TITAN_CHECK(d, "kernels parity: unknown op '", op, "'; known: ", join(parity_ops(), ", "));
  std::string s;
  for (size_t i = 0; i < d->dims.size(); ++i)
    s += (i ? "x" : "") + (i >= d->required_dims ? "[" + d->dims[i] + "]" : d->dims[i]);
  return s;
}

std::map<std::string, std::vector<std::vector<int64_t>>> parse_parity_shapes(const std::string& spec) {
  std::map<std::string, std::vector<Dims>> out;
  auto split = [](const std::string& s, char sep) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i)
      if (i == s.size() || s[i] == sep) {
        parts.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    return parts;
  };
  for (const std::string& group : split(spec, ';')) {
    if (group.empty()) continue;
    const size_t eq = group.find('=');
    TITAN_CHECK(eq != std::string::npos, "kernels parity: --shapes entry '", group,
                "' must look like op=AxBxC[,AxBxC...] (e.g. linear=7x33x19)");
    const std::string op = group.substr(0, eq);
    const Driver* d = find_driver(op);
    TITAN_CHECK(d, "kernels parity: --shapes names unknown op '", op, "'; known: ", join(parity_ops(), ", "));
    for (const std::string& shape : split(group.substr(eq + 1), ',')) {
      Dims dims;
      for (const std::string& v : split(shape, 'x')) {
        size_t used = 0;
        int64_t x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        TITAN_CHECK(!v.empty() && used == v.size(), "kernels parity: --shapes ", op, ": '", shape,
                    "' is not a list of integers joined by 'x' (", op, " takes ", parity_shape_dims(op), ")");
        dims.push_back(x);
      }
      check_shape(*d, dims);
      out[op].push_back(dims);
    }
  }
  return out;
}

std::vector<ParityResult> run_parity(const ParityOptions& o,
                                     const std::function<void(const ParityResult&)>& on_result) {
  std::set<std::string> ops;
  for (auto& d : drivers()) ops.insert(d.op);
  for (auto& e : all_kernels())
    if (e.device == Device::CPU && e.variant != "reference") ops.insert(e.op);
  if (!o.op.empty()) {
    TITAN_CHECK(ops.count(o.op), "kernels parity: unknown op '", o.op,
                "'; known: ", join(std::vector<std::string>(ops.begin(), ops.end()), ", "));
    ops = {o.op};
  }
  for (auto& [op, shapes] : o.shapes) {
    const Driver* d = find_driver(op);
    TITAN_CHECK(d, "kernels parity: shapes given for unknown op '", op, "'");
    for (auto& s : shapes) check_shape(*d, s);
  }
  const std::vector<DType> dtypes =
      o.dtypes.empty() ? std::vector<DType>{DType::F32, DType::BF16, DType::F64} : o.dtypes;

  std::vector<ParityResult> results;
  auto emit = [&](ParityResult r) {
    if (on_result) on_result(r);
    results.push_back(std::move(r));
  };
  for (const std::string& op : ops) {
    const Driver* d = find_driver(op);
    for (DType dt : dtypes)
      for (const KernelEntry& e : all_kernels()) {
        if (e.op != op || e.device != Device::CPU || e.dtype != dt || e.variant == "reference") continue;
        ParityResult base;
        base.op = op;
        base.variant = e.variant;
        base.dtype = dt;
        if (!d) {
          base.shape = "-";
          base.note = "no parity driver for this op (add one in src/titan/kernels/parity.cpp)";
          emit(base);
          continue;
        }
        const std::string why = e.available ? e.available() : std::string();
        const auto given = o.shapes.find(op);
        const std::vector<Dims>& shapes = given != o.shapes.end() ? given->second : d->default_shapes;
        for (size_t si = 0; si < shapes.size(); ++si) {
          ParityResult r = base;
          r.shape = shape_text(*d, shapes[si]);
          if (!why.empty()) {
            r.status = ParityStatus::Skipped;
            r.note = why;
          } else if (!has_kernel(op, Device::CPU, dt, "reference")) {
            r.note = "no reference kernel to compare with";
          } else {
            try {
              const uint64_t seed = mix(o.seed, op, si, dt);
              const Case c = d->make(shapes[si], dt, seed, e.variant);
              const Run want = run_case(op, "reference", c, seed);
              const Run got = run_case(op, e.variant, c, seed);
              compare_runs(c, got, want, d->tolerance(shapes[si], dt, e.variant), r);
            } catch (const std::exception& ex) {
              r.status = ParityStatus::Fail;
              r.note = ex.what();
            }
          }
          emit(r);
        }
      }
  }
  return results;
}

std::string format_parity_result(const ParityResult& r) {
  const char* status = r.status == ParityStatus::Pass   ? "PASS"
                       : r.status == ParityStatus::Fail ? "FAIL"
                                                        : "SKIPPED";
  char buf[512];
  if (!r.compared) {
    std::snprintf(buf, sizeof buf, "%-7s %-20s %-12s %-4s %-32s", status, r.op.c_str(), r.variant.c_str(),
                  std::string(dtype_name(r.dtype)).c_str(), r.shape.c_str());
    return std::string(buf) + " " + r.note;
  }
  std::snprintf(buf, sizeof buf,
                "%-7s %-20s %-12s %-4s %-32s max_abs %.3e  max_rel %.3e  (atol %.2g, rtol %.2g)", status,
                r.op.c_str(), r.variant.c_str(), std::string(dtype_name(r.dtype)).c_str(), r.shape.c_str(),
                r.max_abs, r.max_rel, r.atol, r.rtol);
  std::string line = buf;
  if (r.status == ParityStatus::Fail && !r.note.empty()) line += "  worst " + r.note;
  return line;
}

}  // namespace titan::kernels
