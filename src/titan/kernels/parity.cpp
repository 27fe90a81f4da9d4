#include "titan/kernels/parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>
#include <set>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/parse.h"
#include "titan/core/suggest.h"
#include "titan/core/tensor.h"
#include "titan/kernels/registry.h"
#include "titan/kernels/spec.h"

namespace titan::kernels {

namespace {

std::string shape_text(const OpSpec& d, const Dims& s) {
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) t += (i ? " " : "") + d.dims[i] + "=" + std::to_string(s[i]);
  return t;
}

void check_shape(const OpSpec& d, const Dims& s) {
  TITAN_CHECK(s.size() >= d.required_dims && s.size() <= d.dims.size(), "kernels parity: ", d.op, " shape ",
              shape_str(s), " needs ", d.required_dims == d.dims.size() ? "" : "at least ", d.required_dims,
              " dimensions ", join(d.dims, "x"));
  for (int64_t v : s)
    TITAN_CHECK(v >= 1, "kernels parity: ", d.op, " shape ", shape_text(d, s),
                ": every dimension must be >= 1");
  const std::string why = d.check ? d.check(s) : std::string();
  TITAN_CHECK(why.empty(), "kernels parity: ", d.op, " shape ", shape_text(d, s), ": ", why);
}

struct Run {
  std::vector<Tensor> outputs, grads;  // grads[i]: gradient of input i (undefined when none)
};

// Runs the case with `variant` forced on `device`, on fresh copies of the host inputs, then backward
// seeded with fixed random weights on every float output that took part in autograd. Outputs and
// gradients come back to the host.
//
// With `reference_outputs` (the reference run's), the backward runs on those values: the outputs
// are compared as computed, then overwritten in place (a backward that reads its saved output, as
// attention's D_i = dout . out does, sees the reference's) before backward. So the gradients compare
// the backward kernels on one input: a bf16 output one rounding step off the reference's is the
// forward's difference, judged there, and is not judged again amplified by the backward's
// cancellation (dS = P (dP - D_i)).
Run run_case(const std::string& op, const std::string& variant, Device device, const ParityCase& c,
             uint64_t seed, const std::vector<Tensor>* reference_outputs = nullptr) {
  ForceVariant force(op, variant);
  autograd::Tape tape;
  autograd::TapeScope scope(&tape);
  std::vector<Tensor> in;
  for (auto& t : c.inputs) {
    Tensor x = t.device() == device ? t.clone() : t.to(device);
    if (t.requires_grad()) x.set_requires_grad(true);
    in.push_back(x);
  }
  Run r;
  r.outputs = c.fn(in);
  std::vector<Tensor> computed;  // what the forward computed, before any overwrite
  for (auto& y : r.outputs) computed.push_back(y.to(Device::CPU));
  if (reference_outputs)
    for (size_t i = 0; i < r.outputs.size() && i < reference_outputs->size(); ++i) {
      const Tensor& ref = (*reference_outputs)[i];
      if (ref.defined() && ref.shape() == r.outputs[i].shape() && ref.dtype() == r.outputs[i].dtype())
        r.outputs[i].copy_from(ref);
    }
  std::vector<Tensor> outs, seeds;
  for (size_t i = 0; i < r.outputs.size(); ++i)
    if (dtype_is_float(r.outputs[i].dtype()) && r.outputs[i].requires_grad()) {
      outs.push_back(r.outputs[i]);
      const DType odt = r.outputs[i].dtype();
      Tensor g = spec_uniform(r.outputs[i].shape(), grad_dtype(odt), seed + 100 + i);
      // bf16 variants may take the upstream gradient in bf16 (as a bf16 autograd hands it over;
      // linear, attention and moe_experts do), the reference keeps it in f32: bf16-representable
      // seeds make that documented rounding exact, so the comparison measures the kernels.
      seeds.push_back((odt == DType::BF16 ? g.to(DType::BF16).to(grad_dtype(odt)) : g).to(device));
    }
  if (!outs.empty()) autograd::backward(tape, outs, seeds);
  for (auto& x : in) r.grads.push_back(x.requires_grad() && x.grad().defined() ? x.grad().to(Device::CPU) : Tensor());
  r.outputs = std::move(computed);
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

void compare_runs(const ParityCase& c, const Run& got, const Run& want, const Tolerance& tol, ParityResult& r) {
  double worst_excess = 0;
  bool ok = true;
  for (size_t i = 0; ok && i < want.outputs.size(); ++i)
    ok = compare(got.outputs[i], want.outputs[i], c.output_names[i], tol, r, worst_excess);
  for (size_t i = 0; ok && i < want.grads.size(); ++i)
    ok = compare(got.grads[i], want.grads[i], "d" + c.input_names[i], tol, r, worst_excess);
  r.compared = ok;
  r.status = ok && worst_excess == 0 ? ParityStatus::Pass : ParityStatus::Fail;
}

// The inputs' seed from the run's seed, the op, the shape's dimensions (not its place in the
// list: a case seen in a full run reproduces when `--shapes` names it alone) and the dtype.
uint64_t mix(uint64_t seed, const std::string& op, const std::vector<int64_t>& dims, DType dt) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  for (char ch : op) h = (h ^ uint8_t(ch)) * 0x100000001B3ull;
  for (int64_t d : dims) h = (h ^ uint64_t(d)) * 0x100000001B3ull;
  return h ^ (uint64_t(dt) << 48);
}

}  // namespace

std::vector<std::string> parity_ops() {
  std::vector<std::string> ops;
  for (auto& d : op_specs()) ops.push_back(d.op);
  return ops;
}

std::string parity_shape_dims(const std::string& op) {
  const OpSpec* d = find_op_spec(op);
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
    const OpSpec* d = find_op_spec(op);
    TITAN_CHECK(d, "kernels parity: --shapes names unknown op '", op, "'; known: ", join(parity_ops(), ", "));
    for (const std::string& shape : split(group.substr(eq + 1), ',')) {
      Dims dims;
      for (const std::string& v : split(shape, 'x')) {
        const auto x = parse_int(v);
        TITAN_CHECK(x, "kernels parity: --shapes ", op, ": '", shape, "' is not a list of integers joined by 'x' (", op,
                    " takes ", parity_shape_dims(op), ")");
        dims.push_back(*x);
      }
      check_shape(*d, dims);
      out[op].push_back(dims);
    }
  }
  return out;
}

std::vector<ParityResult> run_parity(const ParityOptions& o,
                                     const std::function<void(const ParityResult&)>& on_result) {
  // The device's kernels register when its backend library loads (before the registry is read).
  const std::string not_loaded = load_device_backend(o.device);
  TITAN_CHECK(not_loaded.empty(), "kernels parity --device ", device_name(o.device), ": ", not_loaded);
  std::set<std::string> ops;
  for (auto& d : op_specs()) ops.insert(d.op);
  for (auto& e : all_kernels())
    if (e.device == o.device && e.variant != "reference") ops.insert(e.op);
  if (!o.op.empty()) {
    const std::vector<std::string> known(ops.begin(), ops.end());
    TITAN_CHECK(ops.count(o.op), "kernels parity: unknown op '", o.op, "'", suggestion(o.op, known),
                " (known: ", join(known, ", "), ")");
    ops = {o.op};
  }
  for (auto& [op, shapes] : o.shapes) {
    const OpSpec* d = find_op_spec(op);
    TITAN_CHECK(d, "kernels parity: shapes given for unknown op '", op, "'");
    TITAN_CHECK(ops.count(op), "kernels parity: --shapes gives shapes for ", op, " but --op checks ", o.op,
                " alone");
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
    const OpSpec* d = find_op_spec(op);
    for (DType dt : dtypes)
      for (const KernelEntry& e : all_kernels()) {
        if (e.op != op || e.device != o.device || e.dtype != dt ||
            (e.device == Device::CPU && e.variant == "reference"))
          continue;
        ParityResult base;
        base.op = op;
        base.variant = e.variant;
        base.dtype = dt;
        if (!d) {
          base.shape = "-";
          base.note = "no spec registered for this op (add src/titan/ops/<op>/spec.cpp, see kernels/spec.h)";
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
              const uint64_t seed = mix(o.seed, op, shapes[si], dt);
              const ParityCase c = d->make(shapes[si], dt, seed, e.variant);
              const Run want = run_case(op, "reference", Device::CPU, c, seed);
              const Run got = run_case(op, e.variant, o.device, c, seed, &want.outputs);
              compare_runs(c, got, want, d->tolerance(shapes[si], dt, o.device, e.variant), r);
            } catch (const std::bad_alloc&) {  // the shape, not the kernel: said so
              r.status = ParityStatus::Fail;
              r.note =
                  "not run: the case's tensors do not fit in this machine's memory (std::bad_alloc); give a "
                  "smaller shape";
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
