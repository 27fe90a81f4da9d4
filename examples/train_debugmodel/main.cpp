// Trains Qwen3 debugmodel for a few steps through titan's C++ API, the way `titan train` does
// inside: a model from a flavor, the Qwen3 tokenizer and the packing loader over the bundled
// corpus, loss -> backward -> gradient clipping -> AdamW with torchtitan's LR schedule.
//
//   find_package(titan REQUIRED)  +  target_link_libraries(your_program PRIVATE titan::titan)
//
// usage: train_debugmodel [STEPS]   (default 5; needs titan's assets/, found above the working
// directory or the executable, or at $TITAN_ASSETS_DIR)
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/tensor.h"
#include "titan/data/assets.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/optim/optim.h"
#include "titan/train/lr_schedule.h"

using namespace titan;

int main(int argc, char** argv) try {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 5;
  const int64_t batch = 2, seq_len = 64;

  // torchtitan's debugmodel, narrowed so that a few steps take seconds on a laptop CPU
  // (remove the overrides for the real 8-layer, dim-256 model).
  qwen3::ModelArgs args = qwen3::flavor("debugmodel");
  for (auto [key, value] : {std::pair{"n_layers", "2"}, {"dim", "64"}, {"n_heads", "2"}, {"n_kv_heads", "1"},
                            {"head_dim", "32"}, {"hidden_dim", "128"}})
    qwen3::apply_override(args, key, value);
  args.validate();
  qwen3::Qwen3Model model(args, DType::F32);
  model.initialize(/*seed=*/42);

  const data::Tokenizer tokenizer = data::Tokenizer::load(data::default_tokenizer_path());
  data::TokenLoader loader({.paths = {data::default_dataset_path()}, .seq_len = seq_len, .local_batch_size = batch},
                           tokenizer);

  // AdamW moments: one flat f32 buffer per parameter block, like the parameters and gradients.
  std::vector<Tensor> exp_avg, exp_avg_sq;
  for (auto& block : model.blocks()) {
    exp_avg.push_back(Tensor::zeros({block.numel()}, DType::F32));
    exp_avg_sq.push_back(Tensor::zeros({block.numel()}, DType::F32));
  }
  ops::AdamWConfig adamw;
  adamw.lr = 2e-3;
  train::LrSchedule schedule({.lr = adamw.lr, .steps = steps, .warmup_steps = 1});

  for (int64_t step = 1; step <= steps; ++step) {
    data::Batch b = loader.next();
    Tensor inputs = Tensor::from_vector(b.inputs, {batch, seq_len});
    Tensor labels = Tensor::from_vector(b.labels, {batch, seq_len});
    model.zero_grad();
    qwen3::LossOutput out = model.forward_loss(inputs, labels);
    const double loss = out.loss.item();
    autograd::backward(out.loss);
    std::vector<Tensor> grads;
    for (auto& block : model.blocks()) grads.push_back(block.grad());
    const double grad_norm = ops::global_grad_norm(grads);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      std::fprintf(stderr, "step %ld: loss %g, grad norm %g: not finite\n", long(step), loss, grad_norm);
      return 1;
    }
    adamw.lr = schedule.lr(step - 1);
    const double clip = ops::clip_coefficient(/*max_norm=*/1.0, grad_norm);
    for (size_t i = 0; i < model.blocks().size(); ++i)
      ops::adamw_step(model.blocks()[i].data(), model.blocks()[i].grad(), exp_avg[i], exp_avg_sq[i], adamw, step,
                      clip);
    std::printf("step %ld  loss %.4f  grad_norm %.4f  lr %.3e\n", long(step), loss, grad_norm, adamw.lr);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_debugmodel: %s\n", e.what());
  return 1;
}
