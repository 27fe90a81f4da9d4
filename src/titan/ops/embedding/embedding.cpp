#include "titan/ops/embedding/embedding.h"

#include <cstring>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {

namespace {

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

Tensor embedding(const Tensor& ids_in, const Tensor& table_in, int64_t padding_idx) {
  TITAN_CHECK(ids_in.dtype() == DType::I64, "embedding: ids must be i64, got ", ids_in.str());
  TITAN_CHECK(table_in.dim() == 2, "embedding: table must be [V, D], got ", table_in.str());
  TITAN_CHECK(dtype_is_float(table_in.dtype()), "embedding: table must be floating point, got ",
              table_in.str());
  TITAN_CHECK(ids_in.device() == table_in.device(), "embedding: ids ", ids_in.str(), " and table ",
              table_in.str(), " are on different devices");
  Tensor ids = ids_in.contiguous(), table = table_in.contiguous().detach();
  const int64_t N = ids.numel(), V = table.size(0), D = table.size(1);
  TITAN_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < V), "embedding: padding_idx ",
              padding_idx, " is out of range for table ", table.str(), " (-1: none, else in [0, V=", V, "))");
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
    const autograd::GradientSink table_sink(table_in);
    autograd::record("embedding", {table_in}, {&out}, [=, &kernel](const std::vector<Tensor>& g) {
      // Into the parameter's gradient buffer when there is one: only the rows of the N ids are
      // touched (a fresh [V, D] gradient would be written whole, then added whole); the step's first
      // gradient there zeroes the buffer first (the other rows get nothing). Returned undefined
      // then: already accumulated.
      autograd::GradientTarget target = table_sink.target();
      const bool into_buffer = target.buffer.defined();
      if (into_buffer && !target.add) target.buffer.fill(0.0);
      if (!g[0].defined())
        return std::vector<Tensor>{into_buffer ? Tensor() : Tensor::zeros(table_shape, gd, table.device())};
      Tensor dy = g[0].contiguous();
      Tensor dtable = into_buffer ? target.buffer : Tensor::empty(table_shape, gd, table.device());
      kernel.backward(ctx, N, V, D, saved_ids.data<int64_t>(), padding_idx, dy.raw_data(), dtable.raw_data(),
                      into_buffer);
      return std::vector<Tensor>{into_buffer ? Tensor() : dtable};
    });
  }
  return out;
}

}  // namespace titan::ops
