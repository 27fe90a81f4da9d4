#pragma once
// embedding: out[..., :] = table[ids[...], :] with ids i64 of any shape and table [V, D]; out has
// shape ids.shape + [D] and the table's dtype. Every id must lie in [0, V): an out-of-range id is an
// error naming the id, its position in ids and V (no clamping, no silent zero rows).
// Autograd: dtable = scatter-add of the output gradient rows (f32; f64 for f64 tables). ids get none.
// padding_idx (-1: none) is PyTorch's nn.Embedding padding_idx, which transformers sets from a
// config.json's pad_token_id: the positions holding that id add nothing to dtable, so the row gets no
// gradient from the lookup (a tied lm_head still gives it one). It must be -1 or lie in [0, V).
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor embedding(const Tensor& ids, const Tensor& table, int64_t padding_idx = -1);

// Kernels; pointers are contiguous row-major. ids [N] (already checked to lie in [0, V)),
// table [V, D] and out [N, D] in the table dtype. dy [N, D] and dtable [V, D] are in the grad
// dtype; backward overwrites all of dtable (rows no id selects become zero).
struct EmbeddingKernel {
  void (*forward)(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids, const void* table, void* out);
  // dtable [V, D] (acc) = the scatter-add of dy's rows by id, in increasing position order per id,
  // skipping the positions whose id is padding_idx (-1: none); add: added to what dtable holds (a
  // parameter's gradient buffer: autograd::GradientSink), so only the rows of ids present are
  // touched, else every row is written (padding_idx's row with zeros).
  void (*backward)(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids,
                   int64_t padding_idx, const void* dy, void* dtable, bool add);
};

}  // namespace titan::ops
