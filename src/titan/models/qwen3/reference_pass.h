#pragma once
// One forward + backward exactly as transformers computes it for `model(input_ids, labels=input_ids)`:
// logits for every position, loss = mean CE of logits[:, :-1] vs input_ids[:, 1:]
// (+ router_aux_loss_coef * aux when the config outputs router logits), gradients of every parameter.
// `titan debug dump` writes this; the oracle tests compare it with transformers.
#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

struct ReferencePass {
  Tensor logits;    // f32 [B, S, V]
  Tensor loss;      // f32 scalar
  Tensor aux_loss;  // f32 scalar, MoE only (undefined for dense)
  // Gradients are left in the model's parameter gradients (read them with hf_tensors()).
};

// Runs on the model's device (input_ids may be on any device); the results stay there.
ReferencePass run_reference_pass(Qwen3Model& model, const Tensor& input_ids);

}  // namespace titan::qwen3
