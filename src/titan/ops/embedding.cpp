#include "titan/ops/embedding.h"

#include <cstring>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise.h"

namespace titan::ops {

namespace {

// Reference: row copies and a serial scatter-add in id order (the order every variant must keep
// per row, so f32 gradients are bit-identical across variants).
template <class T>
void embedding_forward_ref(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids, const void* tv, void* ov) {
  const T* table = static_cast<const T*>(tv);
  T* out = static_cast<T*>(ov);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = table[ids[i] * D + d];
}

template <class A>
void embedding_backward_ref(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids, const void* dyv, void* dtv) {
  const A* dy = static_cast<const A*>(dyv);
  A* dt = static_cast<A*>(dtv);
  for (int64_t k = 0; k < V * D; ++k) dt[k] = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) dt[ids[i] * D + d] += dy[i * D + d];
}

TITAN_REGISTER_KERNEL(embedding_f64_ref,
                      {"embedding",
                       Device::CPU,
                       DType::F64,
                       "reference",
                       "row copy, serial scatter-add",
                       EmbeddingKernel{embedding_forward_ref<double>, embedding_backward_ref<double>},
                       {}});
TITAN_REGISTER_KERNEL(embedding_f32_ref,
                      {"embedding",
                       Device::CPU,
                       DType::F32,
                       "reference",
                       "row copy, serial scatter-add",
                       EmbeddingKernel{embedding_forward_ref<float>, embedding_backward_ref<float>},
                       {}});
TITAN_REGISTER_KERNEL(embedding_bf16_ref,
                      {"embedding",
                       Device::CPU,
                       DType::BF16,
                       "reference",
                       "row copy, serial scatter-add into f32",
                       EmbeddingKernel{embedding_forward_ref<uint16_t>, embedding_backward_ref<float>},
                       {}});

// "ids[1, 3]" for flat index i of ids with this shape.
std::string position_str(const Shape& shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  std::string s = "ids[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

}  // namespace

Tensor embedding(const Tensor& ids_in, const Tensor& table_in) {
  TITAN_CHECK(ids_in.dtype() == DType::I64, "embedding: ids must be i64, got ", ids_in.str());
  TITAN_CHECK(table_in.dim() == 2, "embedding: table must be [V, D], got ", table_in.str());
  TITAN_CHECK(dtype_is_float(table_in.dtype()), "embedding: table must be floating point, got ",
              table_in.str());
  TITAN_CHECK(ids_in.device() == table_in.device(), "embedding: ids ", ids_in.str(), " and table ",
              table_in.str(), " are on different devices");
  Tensor ids = ids_in.contiguous(), table = table_in.contiguous().detach();
  const int64_t N = ids.numel(), V = table.size(0), D = table.size(1);
  const int64_t bad = first_index_outside(ids, 0, V, /*allowed=*/0);
  if (bad >= 0)
    TITAN_FAIL("embedding: ", position_str(ids.shape(), bad), " = ", int64_t(ids.reshape({-1}).narrow(0, bad, 1).item()),
               " is out of range for table ", table.str(), " (ids must lie in [0, V=", V, "))");
  Shape out_shape = ids.shape();
  out_shape.push_back(D);
  const auto& kernel = kernels::kernel_for<EmbeddingKernel>("embedding", table.device(), table.dtype());
  const KernelContext ctx = device_services(table.device()).context();
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  kernel.forward(ctx, N, V, D, ids.data<int64_t>(), table.raw_data(), out.raw_data());
  if (autograd::needs_grad({&table_in})) {
    Tensor saved_ids = ids.detach();
    Shape table_shape = table.shape();
    DType gd = grad_dtype(table.dtype());
    autograd::record("embedding", {table_in}, {&out}, [=, &kernel](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor::zeros(table_shape, gd, table.device())};
      Tensor dy = g[0].contiguous();
      Tensor dtable = Tensor::empty(table_shape, gd, table.device());
      kernel.backward(ctx, N, V, D, saved_ids.data<int64_t>(), dy.raw_data(), dtable.raw_data());
      return std::vector<Tensor>{dtable};
    });
  }
  return out;
}

}  // namespace titan::ops
