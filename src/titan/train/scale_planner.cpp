#include "titan/train/scale_planner.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/parse.h"
#include "titan/ops/linear/linear.h"

namespace titan::train {

std::optional<int64_t> parse_byte_size(const std::string& text) {
  size_t unit_at = text.size();
  while (unit_at > 0 && std::isalpha(static_cast<unsigned char>(text[unit_at - 1]))) --unit_at;
  std::string number = text.substr(0, unit_at), unit;
  while (!number.empty() && number.back() == ' ') number.pop_back();
  for (char c : text.substr(unit_at)) unit += char(std::tolower(static_cast<unsigned char>(c)));
  struct Unit {
    const char* name;
    double bytes;
  };
  static const Unit units[] = {{"", 1},       {"b", 1},       {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
                               {"tib", 0x1p40}, {"kb", 1e3},    {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  const Unit* u = std::find_if(std::begin(units), std::end(units), [&](const Unit& x) { return unit == x.name; });
  const std::optional<double> value = parse_number(number);
  if (u == std::end(units) || !value || !(*value > 0)) return std::nullopt;
  const double bytes = *value * u->bytes;
  if (bytes < 1 || bytes > 0x1p62) return std::nullopt;
  return int64_t(bytes);
}

int64_t memory_need(const StepProfile& p) {
  return std::max(p.reserved, p.peak) + p.checkpoint_copy;
}

MemoryFit fit_step(const qwen3::ModelArgs& args, const StepShape& shape, int64_t available,
                   bool cache_returns_at_bound) {
  MemoryFit f;
  f.need = f.unbounded_need = memory_need(profile_training_step(args, shape, Device::Meta));
  f.fits = f.need <= available;
  if (f.fits || !cache_returns_at_bound) return f;
  // The replay within the bound takes the unbounded one's path until the cache would pass it; from
  // there the GPU's allocator returns its free segments and retries.
  try {
    const MetaMemoryBound bound(available);
    f.need = memory_need(profile_training_step(args, shape, Device::Meta));
    f.fits = f.by_returning_cache = f.need <= available;
  } catch (const MetaOutOfMemory&) {
    f.need = f.unbounded_need;
  }
  return f;
}

BatchSearch largest_fitting_batch(const qwen3::ModelArgs& args, StepShape shape, int64_t available,
                                  bool cache_returns_at_bound) {
  BatchSearch s;
  s.bound = std::max<int64_t>(1, (int64_t(1) << 31) / shape.seq_len);
  auto fit_at = [&](int64_t batch) {
    shape.local_batch = batch;
    ++s.profiles;
    return fit_step(args, shape, available, cache_returns_at_bound);
  };
  int64_t fits = 0, fits_need = 0, fails = 0, fails_need = 0;
  // Doubling until a batch does not fit (or the bound), then bisection between the two: the need
  // grows with the batch (every activation does; the reservation only about so, as tensors move
  // between the allocator's pools).
  for (int64_t b = 1;; b = std::min(2 * b, s.bound)) {
    const MemoryFit f = fit_at(b);
    if (!f.fits) {
      fails = b, fails_need = f.need;
      break;
    }
    fits = b, fits_need = f.need;
    if (b == s.bound) break;
  }
  while (fails && fails - fits > 1) {
    const int64_t mid = fits + (fails - fits) / 2;
    const MemoryFit f = fit_at(mid);
    if (!f.fits)
      fails = mid, fails_need = f.need;
    else
      fits = mid, fits_need = f.need;
  }
  s.largest = fits;
  s.largest_need = fits_need;
  s.at_bound = fails == 0;
  s.next_need = fails_need;
  return s;
}

GemmRate measure_gemm_rate(Device device, DType dtype, int64_t M, int64_t N, int64_t K, double seconds) {
  autograd::NoGradGuard no_grad;
  DeviceServices& dev = device_services(device);
  const Tensor x = Tensor::full({M, K}, 0.01, dtype, device), w = Tensor::full({N, K}, 0.01, dtype, device);
  ops::linear(x, w);  // warm-up: kernel selection, JIT, first touch of the output
  dev.synchronize();
  // The fastest call, not the mean: other work on the machine only ever slows a call down, so the
  // mean of a short sample swung 20x on a loaded host where the fastest call stays put.
  int64_t calls = 0;
  double elapsed = 0, fastest = std::numeric_limits<double>::infinity();
  const auto t0 = std::chrono::steady_clock::now();
  while (elapsed < seconds || calls < 3) {
    const auto c0 = std::chrono::steady_clock::now();
    ops::linear(x, w);
    dev.synchronize();
    const auto c1 = std::chrono::steady_clock::now();
    fastest = std::min(fastest, std::chrono::duration<double>(c1 - c0).count());
    ++calls;
    elapsed = std::chrono::duration<double>(c1 - t0).count();
  }
  GemmRate r;
  r.tflops = 2.0 * double(M) * double(N) * double(K) / fastest / 1e12;
  char source[320];
  std::snprintf(
      source, sizeof source,
      "measured: %s GEMM %ld x %ld x %ld (M x N x K) with ops::linear on %s, %s, the fastest of %ld calls "
      "in %.2f s",
      std::string(dtype_name(dtype)).c_str(), long(M), long(N), long(K), dev.description().c_str(),
      device != Device::CPU        ? "one stream"
      : omp_get_max_threads() == 1 ? "1 thread"
                                   : (std::to_string(omp_get_max_threads()) + " threads").c_str(),
      long(calls), elapsed);
  r.source = source;
  return r;
}

std::vector<GemmShape> model_gemm_shapes(const qwen3::ModelArgs& a, int64_t M) {
  std::map<std::array<int64_t, 3>, double> shapes;  // (M, N capped, K) -> forward FLOPs
  // `rows` may be fractional (an expert's share): the FLOPs are exact, the measured shape whole.
  auto add = [&](double rows, int64_t n, int64_t k, double times) {
    const int64_t m = std::max<int64_t>(1, int64_t(rows));
    shapes[{m, std::min<int64_t>(n, 16384), k}] += times * 2.0 * rows * double(n) * double(k);
  };
  const int64_t q = a.n_heads * a.head_dim, kv = a.n_kv_heads * a.head_dim;
  for (int64_t layer = 0; layer < a.n_layers; ++layer) {
    add(double(M), q, a.dim, 1);
    add(double(M), kv, a.dim, 2);
    add(double(M), a.dim, q, 1);
    if (a.is_moe_layer(layer)) {
      add(double(M), a.num_experts, a.dim, 1);                                  // the router
      const double rows = double(M) * double(a.top_k) / double(a.num_experts);  // an expert's share
      add(rows, a.moe_hidden_dim, a.dim, 2.0 * double(a.num_experts));
      add(rows, a.dim, a.moe_hidden_dim, double(a.num_experts));
    } else {
      add(double(M), a.hidden_dim, a.dim, 2);
      add(double(M), a.dim, a.hidden_dim, 1);
    }
  }
  add(double(M), a.vocab_size, a.dim, 1);
  std::vector<GemmShape> out;
  for (const auto& [shape, flops] : shapes) out.push_back({shape[0], shape[1], shape[2], flops});
  return out;
}

GemmRate measure_model_gemm_rate(Device device, DType dtype, const qwen3::ModelArgs& a, int64_t M,
                                 double seconds) {
  const std::vector<GemmShape> shapes = model_gemm_shapes(a, M);
  double flops = 0, time = 0;
  std::string shown;
  const double each = seconds / double(shapes.size());
  for (const GemmShape& shape : shapes) {
    const double shape_flops = shape.flops;
    int64_t m = shape.m, n = shape.n;
    const int64_t k = shape.k;
    // A call of at most ~4 GFLOP (a narrower N down to 2048, then fewer rows down to 256): a large
    // model planned on a laptop measures in seconds, at shapes big enough to run at the rate of its
    // own.
    constexpr double kMaxCallFlops = 4e9;
    const auto over = [&] { return 2.0 * double(m) * double(n) * double(k) > kMaxCallFlops; };
    if (over())
      n = std::max<int64_t>(std::min<int64_t>(n, 2048),
                            int64_t(kMaxCallFlops / (2.0 * double(m) * double(k))) / 64 * 64);
    if (over())
      m = std::max<int64_t>(std::min<int64_t>(m, 256),
                            int64_t(kMaxCallFlops / (2.0 * double(n) * double(k))) / 64 * 64);
    const GemmRate r = measure_gemm_rate(device, dtype, m, n, k, each);
    flops += shape_flops;
    time += shape_flops / (r.tflops * 1e12);
    char one[96];
    std::snprintf(one, sizeof one, "%s%ld x %ld x %ld %.3g", shown.empty() ? "" : ", ", long(m), long(n),
                  long(k), r.tflops);
    shown += one;
  }
  GemmRate out;
  out.tflops = flops / time / 1e12;
  out.source = "measured: " + std::string(dtype_name(dtype)) +
               " GEMMs of the model's shapes (M x N x K TFLOP/s: " + shown + ") with ops::linear on " +
               device_services(device).description() + ", " +
               (device != Device::CPU        ? std::string("one stream")
                : omp_get_max_threads() == 1 ? std::string("1 thread")
                                             : std::to_string(omp_get_max_threads()) + " threads") +
               ", weighted by their forward FLOPs";
  return out;
}

CommEstimate estimate_communication(const StepProfile& p, const StepShape& shape, const Link& link) {
  CommEstimate e;
  e.bytes = double(p.comm.bytes_sent);
  e.seconds = e.bytes * 8 / (link.gbps * 1e9) + double(p.comm.ring_steps) * link.latency_us * 1e-6;
  const char* mode = shape.dp_shard > 1 ? (shape.dp_replicate > 1 ? "HSDP" : "FSDP")
                     : shape.dp_replicate > 1 ? "DDP"
                                              : "one rank";
  // The mode as the mesh line says it (dist::ParallelPlan::describe), and the experts' all-to-alls
  // named in the bytes: they grow with the tokens routed, not with the parameters as the rest does.
  char all_to_alls[96] = "";
  if (p.comm.all_to_alls > 0)
    std::snprintf(all_to_alls, sizeof all_to_alls, " (%ld of them the experts' all-to-alls, %.4g MB)",
                  long(p.comm.all_to_alls), double(p.comm.all_to_all_bytes) / 1e6);
  char f[256];
  std::snprintf(f, sizeof f, "%s%s, %ld collectives%s, %ld ring steps", mode, shape.ep > 1 ? " + EP" : "",
                long(p.comm.collectives), all_to_alls, long(p.comm.ring_steps));
  e.formula = f;
  return e;
}

}  // namespace titan::train
