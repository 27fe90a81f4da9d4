// Memory-bound CUDA kernels on Qwen3-0.6B activation shapes (8 x 2048 tokens), timed with CUDA
// events (bench/cuda_bench_util.h) and printed as a table: rms_norm, rope, swiglu, AdamW, the f32 ->
// bf16 cast, and a device-to-device copy as the ceiling; and the random init's draw (compute-bound). GB/s =
// the bytes a call must read and write (each input once, each output once) over the time; the kernels are
// called through the registry exactly as the ops call them.
//
//   build/bin/cuda_ops_bench           # everything (~10 s on an H200)
//   build/bin/cuda_ops_bench swiglu    # rows whose name contains "swiglu"
// Without a usable GPU it prints why and exits 0.
#include <vector>

#include "cuda_bench_util.h"
#include "titan/kernels/registry.h"
#include "titan/ops/init/init.h"
#include "titan/ops/optim/optim.h"
#include "titan/ops/rms_norm/rms_norm.h"
#include "titan/ops/rope/rope.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::bench {
namespace {

void run(DeviceServices& s, const char* filter) {
  KernelContext ctx = s.context();
  auto row = [&](const std::string& name, double bytes, const std::function<void()>& f) {
    if (!wanted(name, filter)) return;
    const double ms = time_ms(f);
    print_row(name, ms, bytes / ms * 1e-6, "GB/s");
  };
  // Qwen3-0.6B activations: 16384 tokens x 1024 hidden; MLP 16384 x 3072; q 16384 x 16 x 128.
  const int64_t T = 8 * 2048, D = 1024, F = 3072, Hq = 16, hd = 128;
  {
    Buffer src(s, size_t(T * F) * 4, 1.5, DType::F32), dst(s, size_t(T * F) * 4, 0, DType::F32);
    row("copy device->device f32 (ceiling)", 2.0 * T * F * 4, [&] { s.copy(dst.p, src.p, src.n); });
    row("convert f32->bf16", double(T * F) * 6, [&] { s.convert(dst.p, DType::BF16, src.p, DType::F32, T * F); });
  }
  {
    const auto& k = kernels::kernel_for<ops::RmsNormKernel>("rms_norm", Device::CUDA, DType::BF16, "default");
    Buffer x(s, size_t(T * D) * 2, 0.5, DType::BF16), w(s, size_t(D) * 2, 1, DType::BF16),
        y(s, size_t(T * D) * 2, 0, DType::BF16), rstd(s, size_t(T) * 4, 0, DType::F32),
        dy(s, size_t(T * D) * 4, 0.1, DType::F32), dx(s, size_t(T * D) * 4, 0, DType::F32),
        dw(s, size_t(D) * 4, 0, DType::F32);
    row("rms_norm bf16 fwd [16384, 1024]", double(T * D) * 4,
        [&] { k.forward(ctx, T, D, 1e-6, x.p, w.p, y.p, rstd.p); });
    row("rms_norm bf16 bwd [16384, 1024]", double(T * D) * (2 + 4 + 4 + 2 + 4),  // dx pass + dw pass
        [&] { k.backward(ctx, T, D, x.p, w.p, rstd.p, dy.p, dx.p, dw.p); });
  }
  {
    const auto& k = kernels::kernel_for<ops::SwigluKernel>("swiglu", Device::CUDA, DType::BF16, "default");
    const int64_t n = T * F;
    Buffer g(s, size_t(n) * 2, 0.5, DType::BF16), u(s, size_t(n) * 2, 0.25, DType::BF16),
        o(s, size_t(n) * 2, 0, DType::BF16), dy(s, size_t(n) * 4, 0.1, DType::F32),
        dg(s, size_t(n) * 4, 0, DType::F32), du(s, size_t(n) * 4, 0, DType::F32);
    row("swiglu bf16 fwd [16384, 3072]", double(n) * 6, [&] { k.forward(ctx, n, g.p, u.p, o.p); });
    row("swiglu bf16 bwd [16384, 3072]", double(n) * (2 + 2 + 4 + 4 + 4),
        [&] { k.backward(ctx, n, g.p, u.p, dy.p, dg.p, du.p); });
  }
  {
    const auto& k = kernels::kernel_for<ops::RopeKernel>("rope", Device::CUDA, DType::BF16, "default");
    const int64_t B = 8, S = 2048, n = B * S * Hq * hd;
    auto table = ops::rope_table(1e6, hd, S);
    std::vector<int64_t> pos_host(size_t(B * S));
    for (int64_t i = 0; i < B * S; ++i) pos_host[size_t(i)] = i % S;
    Buffer pos(s, pos_host.size() * 8, 0, DType::I64), x(s, size_t(n) * 2, 0.5, DType::BF16),
        y(s, size_t(n) * 2, 0, DType::BF16);
    s.copy_from_host(pos.p, pos_host.data(), pos.n);
    row("rope bf16 fwd [8, 2048, 16, 128]", double(n) * 4,
        [&] { k.forward(ctx, B, S, Hq, hd, static_cast<const int64_t*>(pos.p), *table, x.p, y.p); });
  }
  {
    const auto& k = kernels::kernel_for<ops::AdamWKernel>("adamw", Device::CUDA, DType::F32, "default");
    const int64_t n = 600'000'000 / 4;  // a quarter of Qwen3-0.6B's parameters per call
    Buffer p(s, size_t(n) * 4, 0.1, DType::F32), g(s, size_t(n) * 4, 0.01, DType::F32),
        m(s, size_t(n) * 4, 0, DType::F32), v(s, size_t(n) * 4, 0, DType::F32);
    ops::AdamWScalars sc{0.9999, 0.9, 0.1, 0.95, 0.05, -1e-4, 0.2, 1e-8, 1.0};
    row("adamw f32 150M params", double(n) * 4 * 7, [&] { k.step(ctx, n, p.p, g.p, m.p, v.p, nullptr, sc); });
    // With the bf16 compute copy a bf16 job keeps (2 more bytes per parameter; the cast it replaces
    // moved 6).
    Buffer copy(s, size_t(n) * 2, 0, DType::BF16);
    row("adamw f32 150M params + bf16 copy", double(n) * (4 * 7 + 2),
        [&] { k.step(ctx, n, p.p, g.p, m.p, v.p, static_cast<uint16_t*>(copy.p), sc); });
  }
  {
    // The random init's draw (a quarter of Qwen3-0.6B per call; Qwen3-4B draws 27 times as many):
    // compute-bound (hashing, a log, a division and a square root in f64 per pair), so the rate is
    // said in values per second.
    const auto& k =
        kernels::kernel_for<ops::NormalInitKernel>("normal_init", Device::CUDA, DType::F32, "default");
    const int64_t n = 600'000'000 / 4;
    Buffer out(s, size_t(n) * 4, 0, DType::F32);
    const std::string name = "normal_init f32 150M values";
    if (wanted(name, filter)) {
      const double ms = time_ms([&] { k.draw(ctx, 42, 0.02, 0, 0, n, static_cast<float*>(out.p)); });
      print_row(name, ms, double(n) / ms * 1e-6, "Gvalue/s");
    }
  }
}

}  // namespace
}  // namespace titan::bench

int main(int argc, char** argv) {
  using namespace titan;
  if (!bench::gpu_ready("cuda_ops_bench")) return 0;
  DeviceServices& s = device_services(Device::CUDA);
  bench::print_header();
  bench::run(s, argc > 1 ? argv[1] : nullptr);
  bench::print_memory(s);
  return 0;
}
