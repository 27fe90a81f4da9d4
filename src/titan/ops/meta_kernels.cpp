// The meta device's kernels: they do no arithmetic (meta tensors hold no data), they only count
// the floating-point operations the op would do, so a meta run of a training step yields its
// exact allocation profile (the op wrappers allocate as on any device) and its FLOPs. Kernels that
// return a value to the host return what a valid input would: no index out of range, every
// label a target, zero sums.
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

namespace titan::ops {
namespace {

void flops(const KernelContext& ctx, double f) { ctx.services->add_flops(f); }

const LinearKernel linear_meta{
    [](const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*, void*) {
      flops(ctx, 2.0 * double(M) * double(N) * double(K));
    },
    [](const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*, const void*, void* dx,
       void* dw) { flops(ctx, 2.0 * double(M) * double(N) * double(K) * ((dx ? 1 : 0) + (dw ? 1 : 0))); }};

// Causal attention: QK^T and PV over the lower triangle, 2 FLOPs per multiply-add; backward does
// four such products (dV, dP, dQ, dK).
double attention_pair_flops(const AttentionShape& s) {
  return 2.0 * double(s.B) * double(s.Hq) * double(s.S) * double(s.S + 1) / 2.0 * double(s.D);
}
const AttentionKernel attention_meta{
    [](const KernelContext& ctx, const AttentionShape& s, const void*, const void*, const void*, void*, void*) {
      flops(ctx, 2.0 * attention_pair_flops(s));
    },
    [](const KernelContext& ctx, const AttentionShape& s, const void*, const void*, const void*, const void*,
       const void*, const void*, void*, void*, void*) { flops(ctx, 4.0 * attention_pair_flops(s)); }};

const CrossEntropyKernel cross_entropy_meta{
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, const void*, double, void*) {}};

// The fused loss keeps its logits for backward when they fit in keep_bytes, as the CPU kernel
// does (bf16 when rounded to bf16, else the accumulation type): that buffer is often the largest
// activation of a step, so the meta profile allocates it too.
template <DType kAcc>
void lce_meta_forward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void*, void*) {
  flops(ctx, 2.0 * double(a.N) * double(a.V) * double(a.D));
  const DType kept = a.round_logits ? DType::BF16 : kAcc;
  if (a.kept && a.N * a.V * int64_t(dtype_size(kept)) <= a.keep_bytes)
    *a.kept = Tensor::empty({a.N * a.V}, kept, ctx.device);
}
void lce_meta_backward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void*, double, void* dh,
                       void* dw) {
  flops(ctx, 2.0 * double(a.N) * double(a.V) * double(a.D) * ((dh ? 1 : 0) + (dw ? 1 : 0)));
}

const EmbeddingKernel embedding_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {}};

const RmsNormKernel rms_norm_meta{
    [](const KernelContext&, int64_t, int64_t, double, const void*, const void*, void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, const void*, const void*, const void*, const void*, void*, void*) {}};

const RopeKernel rope_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, int64_t, const int64_t*, const RopeTable&, const void*,
       void*) {},
    [](const KernelContext&, int64_t, int64_t, int64_t, int64_t, const int64_t*, const RopeTable&, const void*,
       void*) {},
    /*needs_table=*/false};

const SwigluKernel swiglu_meta{[](const KernelContext&, int64_t, const void*, const void*, void*) {},
                               [](const KernelContext&, int64_t, const void*, const void*, const void*, void*, void*) {}};

const RouterKernel router_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, bool, const void*, const float*, void*, int64_t*, void*,
       int64_t*) {},
    [](const KernelContext&, int64_t, int64_t, int64_t, bool, const void*, const int64_t*, const void*, const void*,
       void*) {}};

const MoeAuxLossKernel moe_aux_loss_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const void*, const int64_t*, int64_t*, double*) {},
    [](const KernelContext&, int64_t, double, const int64_t*, const double*, void*) {},
    [](const KernelContext&, int64_t, int64_t, double, const int64_t*, const void*, void*) {}};

// Per (token, slot): gate and up projections (2 x 2DF) and the down projection (2DF); backward
// twice that. Routing is data-dependent, the FLOPs are not.
double expert_flops(const MoeDims& d) { return 6.0 * double(d.T) * double(d.k) * double(d.D) * double(d.F); }
const MoeExpertsKernel moe_experts_meta{
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, const void*, const void*,
       const void*, void*, void*) { flops(ctx, expert_flops(d)); },
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, const void*, const void*,
       const void*, const void*, const void*, void*, void*, void*, void*, void*) { flops(ctx, 2.0 * expert_flops(d)); }};

const AdamWKernel adamw_meta{
    [](const KernelContext&, int64_t, void*, const void*, void*, void*, const AdamWScalars&) {}};
const GradNormKernel grad_norm_meta{[](const KernelContext&, int64_t, const void*) { return 0.0; }};

const AddKernel add_meta{[](const KernelContext&, int64_t, const void*, const void*, void*) {}};
const AccumulateKernel accumulate_meta{[](const KernelContext&, int64_t, void*, const void*) {}};
const ScaleKernel scale_meta{[](const KernelContext&, int64_t, void*, double) {}};
const SumKernel sum_meta{[](const KernelContext&, int64_t, const void*) { return 0.0; }};
const IndexKernel index_meta{
    [](const KernelContext&, int64_t, const int64_t*, int64_t, int64_t, int64_t) { return int64_t(-1); },
    [](const KernelContext&, int64_t n, const int64_t*, int64_t) { return n; },
    [](const KernelContext&, int64_t, const int64_t*) { return int64_t(0); }};

// One registration per (op, dtype) the op accepts on any device.
template <class K>
void register_meta(const char* op, const K& kernel, std::initializer_list<DType> dtypes) {
  for (DType dt : dtypes)
    kernels::register_kernel({op, Device::Meta, dt, "default", "shapes, allocations and FLOPs only", kernel, {}});
}

const bool registered = [] {
  const auto floats = {DType::F32, DType::BF16, DType::F64};
  register_meta("linear", linear_meta, floats);
  register_meta("attention", attention_meta, floats);
  register_meta("cross_entropy", cross_entropy_meta, floats);
  register_meta("linear_cross_entropy", LinearCrossEntropyKernel{lce_meta_forward<DType::F32>, lce_meta_backward},
                {DType::F32, DType::BF16});
  register_meta("linear_cross_entropy", LinearCrossEntropyKernel{lce_meta_forward<DType::F64>, lce_meta_backward},
                {DType::F64});
  register_meta("embedding", embedding_meta, floats);
  register_meta("rms_norm", rms_norm_meta, floats);
  register_meta("rope", rope_meta, floats);
  register_meta("swiglu", swiglu_meta, floats);
  register_meta("router_topk", router_meta, floats);
  register_meta("moe_aux_loss", moe_aux_loss_meta, {DType::F32, DType::F64});
  register_meta("moe_experts", moe_experts_meta, floats);
  register_meta("adamw", adamw_meta, {DType::F32, DType::F64});
  register_meta("grad_norm", grad_norm_meta, {DType::F32, DType::F64});
  register_meta("add", add_meta, floats);
  register_meta("add_inplace", accumulate_meta, floats);
  register_meta("scale_inplace", scale_meta, floats);
  register_meta("sum", sum_meta, floats);
  register_meta("index", index_meta, {DType::I64});
  return true;
}();

}  // namespace
}  // namespace titan::ops
