#include "titan/models/qwen3/reference_pass.h"

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::qwen3 {

ReferencePass run_reference_pass(Qwen3Model& model, const Tensor& ids) {
  TITAN_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64, "input_ids must be i64 [B, S], got ", ids.str());
  const int64_t B = ids.size(0), S = ids.size(1), V = model.args().vocab_size;
  const Tensor host_ids = ids.to(Device::CPU);  // the checks and the shift read the ids on the host
  const int64_t* id = host_ids.data<int64_t>();
  for (int64_t i = 0; i < B * S; ++i)
    TITAN_CHECK(id[i] >= 0 && id[i] < V, "input_ids: token id ", id[i], " at [", i / S, ", ", i % S,
                "] is outside the model's vocabulary [0, ", V, ")");
  // targets[b, s] = input_ids[b, s + 1]; the last position has none (transformers pads with -100).
  Tensor targets = Tensor::full({B, S}, -100.0, DType::I64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + 1 < S; ++s) targets.data<int64_t>()[b * S + s] = id[b * S + s + 1];

  model.zero_grad();
  ReferencePass r;
  r.logits = model.forward_logits(host_ids.to(model.device()), &r.aux_loss);
  Tensor loss =
      ops::cross_entropy(r.logits.reshape({B * S, V}), targets.to(model.device()).reshape({B * S}), -100);
  if (r.aux_loss.defined() && model.args().output_router_logits)
    loss = ops::add(loss, ops::scale(r.aux_loss.reshape(loss.shape()), model.args().router_aux_loss_coef));
  autograd::backward(loss);
  r.loss = loss.detach();
  r.logits = r.logits.detach();
  if (r.aux_loss.defined()) r.aux_loss = r.aux_loss.detach();
  return r;
}

}  // namespace titan::qwen3
