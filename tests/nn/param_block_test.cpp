// A block's gradients after zero_grad: nothing is written until a gradient arrives, the step's first
// gradient of each parameter is written over what its slice held, later ones are added, and what no
// gradient reached reads as zeros. And the bf16 copy of its weights a bf16 job's block keeps: the
// weights cast, after every write.
#include "titan/nn/param_block.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/embedding/embedding.h"
#include "titan/ops/linear/linear.h"
#include "titan/ops/rms_norm/rms_norm.h"

using namespace titan;
using namespace titan::testing;

namespace {

// w [3, 5] for a linear (its gradient written into the buffer by the GEMM), g [5] for an rms_norm
// weight (a fresh gradient that autograd accumulates), table [6, 5] for an embedding (rows
// scattered), unused [4] (no gradient ever).
nn::ParamBlock make_block() {
  nn::ParamBlock b("block", std::vector<nn::ParamSpec>{{"w", {3, 5}}, {"g", {5}}, {"table", {6, 5}}, {"unused", {4}}});
  b.initialize(3);
  return b;
}

// One forward and backward through every used parameter: ids -> embedding -> rms_norm -> linear,
// loss = sum of the outputs (the upstream gradient all ones).
void forward_backward(nn::ParamBlock& b, const Tensor& ids) {
  auto& p = b.params();
  Tensor h = ops::rms_norm(ops::embedding(ids, p[2].value), p[1].value, 1e-6);
  Tensor y = ops::linear(h, p[0].value);
  autograd::backward(autograd::current_tape(), {y}, {Tensor::full(y.shape(), 1.0, DType::F32)});
}

// The gradients of one such pass, from a fresh block whose buffers start at zero.
std::vector<double> gradients_of_one_pass(const Tensor& ids) {
  nn::ParamBlock fresh = make_block();
  forward_backward(fresh, ids);
  return fresh.grad().to_vector();
}

// A previous step's gradients in every parameter's slice (the gaps between them and the padding
// hold zeros from the start, and nothing writes them).
void fill_parameters_gradients(nn::ParamBlock& b, double value) {
  for (nn::Param& p : b.params()) p.value.grad().fill(value);
}

}  // namespace

TEST(ParamBlock, AfterZeroGradTheFirstGradientIsWrittenAndWhatNoneReachedReadsZero) {
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 4, 1}, {3});
  const std::vector<double> once = gradients_of_one_pass(ids);
  nn::ParamBlock b = make_block();
  fill_parameters_gradients(b, 7.0);
  b.zero_grad();
  // zero_grad writes nothing: each slice is left to its first gradient (the buffer itself, not
  // read through grad(), which would zero it).
  EXPECT_EQ(b.params()[3].value.autograd_meta()->grad.to_vector(), std::vector<double>(4, 7.0));
  EXPECT_TRUE(*b.params()[3].grad_unwritten);
  forward_backward(b, ids);
  // The unused parameter read through its tensor, as a user holding it would, before anything
  // settled the block: zeros, not the 7s.
  EXPECT_EQ(b.params()[3].value.grad().to_vector(), std::vector<double>(4, 0.0));
  // Every used parameter holds exactly this pass's gradient (nothing of the 7s added), the unused
  // one reads zeros, and so do the embedding rows no id picked.
  const std::vector<double> got = b.grad().to_vector();
  ASSERT_EQ(got.size(), once.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], once[i], 1e-6) << "element " << i;
  EXPECT_EQ(b.params()[3].grad().to_vector(), std::vector<double>(4, 0.0));
  const std::vector<double> table = b.params()[2].grad().to_vector();
  for (int64_t row : {0, 2, 3, 5})
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(table[size_t(row * 5 + c)], 0.0) << "row " << row;
  // The used parameters got non-zero gradients (the comparison above is not between zeros).
  double norm = 0;
  for (double v : got) norm += v * v;
  EXPECT_GT(norm, 0.0);
}

TEST(ParamBlock, GradientsOfLaterPassesAreAddedUntilTheNextZeroGrad) {
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 5}, {2});
  const std::vector<double> once = gradients_of_one_pass(ids);
  nn::ParamBlock b = make_block();
  fill_parameters_gradients(b, -3.0);
  b.zero_grad();
  forward_backward(b, ids);
  forward_backward(b, ids);  // gradient accumulation: a second micro-batch adds
  std::vector<double> got = b.grad().to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], 2 * once[i], 1e-5) << "element " << i;
  // The next step starts over.
  b.zero_grad();
  forward_backward(b, ids);
  got = b.shard_grad().to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], once[i], 1e-6) << "element " << i;
}

// A parameter used through its bf16 compute copy (the gradient lands in the same f32 slice) is
// written by its first gradient as well.
TEST(ParamBlock, AComputeCopySharesItsParametersUnwrittenState) {
  nn::ParamBlock b("block", std::vector<nn::ParamSpec>{{"w", {3, 5}}});
  b.initialize(5);
  b.add_compute_copy(DType::BF16);
  b.materialize_compute();
  b.compute().copy_from(b.data());
  const Tensor x = Tensor::full({2, 5}, 0.5, DType::BF16);
  auto pass = [&] {
    Tensor y = ops::linear(x, b.params()[0].compute_value);
    autograd::backward(autograd::current_tape(), {y}, {Tensor::full(y.shape(), 1.0, DType::BF16)});
  };
  fill_parameters_gradients(b, 11.0);
  b.zero_grad();
  pass();
  // dW = dy^T x: every element 2 x 0.5 = 1.
  EXPECT_EQ(b.params()[0].grad().to_vector(), std::vector<double>(15, 1.0));
  pass();
  EXPECT_EQ(b.params()[0].grad().to_vector(), std::vector<double>(15, 2.0));
  // Padding would leave the copy's views, and the gradients they pass on, on the old buffers.
  EXPECT_NE(
      error_of([&] { b.pad_to_multiple(16); }).find("cannot pad a sharded block or one with a compute copy"),
      std::string::npos);
}

namespace {

// The bf16 values of `t`, as a cast gives them.
std::vector<double> cast_to_bf16(const Tensor& t) {
  return t.to(DType::BF16).to(DType::F32).to_vector();
}
std::vector<double> values(const Tensor& t) {
  return t.to(DType::F32).to_vector();
}

}  // namespace

// A trained block of a bf16 job keeps a bf16 copy of its weights (what the forward and backward
// read), which every write of the weights the block knows of rewrites: the initial draw, a load's
// writes, and the optimizer's updates (ops::adamw_step, tests/ops/optim_test.cpp).
TEST(ParamBlock, AKeptComputeCopyIsTheWeightsCastAfterEveryWrite) {
  nn::ParamBlock b = make_block();
  b.keep_compute_shard(DType::BF16);
  ASSERT_TRUE(b.compute_resident());
  EXPECT_EQ(values(b.compute_shard()), cast_to_bf16(b.data()));
  EXPECT_EQ(b.params()[0].compute_value.raw_data(), b.compute().raw_data())
      << "the copy is the compute copy the model reads";
  b.initialize(99);
  EXPECT_EQ(values(b.compute_shard()), cast_to_bf16(b.data()));
  b.write_elements(17, Tensor::full({9}, 0.123456, DType::F32));
  EXPECT_EQ(values(b.compute_shard()), cast_to_bf16(b.data()));
  EXPECT_EQ(values(b.compute_shard().narrow(0, 17, 9)), std::vector<double>(9, double(Bf16(0.123456f))));
  // The copy lives as long as the block: nothing may release, remove, pad or shard it away.
  EXPECT_NE(error_of([&] { b.release_compute(); }).find("kept for the whole run"), std::string::npos);
  EXPECT_NE(error_of([&] { b.remove_compute_copy(); }).find("kept for the whole run"), std::string::npos);
  EXPECT_NE(error_of([&] { b.pad_to_multiple(7); }).find("one with a compute copy"), std::string::npos);
  EXPECT_NE(error_of([&] { b.shard(0, 2); }).find("shard it before keep_compute_shard"), std::string::npos);
  EXPECT_NE(error_of([&] { b.keep_compute_shard(DType::BF16); }).find("keeps a compute copy already"),
            std::string::npos);
  nn::ParamBlock f32 = make_block();
  EXPECT_NE(error_of([&] { f32.keep_compute_shard(DType::F32); }).find("would copy them for nothing"),
            std::string::npos);
}

// A sharded block keeps the bf16 copy of its own slice only (what its all-gathers send); its whole
// compute copy is the gathers' target, resident only while gathered.
TEST(ParamBlock, ASlicesKeptComputeCopyCoversTheSliceAlone) {
  const std::vector<nn::ParamSpec> specs{{"w", {3, 5}}, {"g", {5}}, {"table", {6, 5}}};
  nn::ParamBlock b("block", specs, Device::CPU, nn::BlockShard{1, 2});
  b.initialize(3);
  b.keep_compute_shard(DType::BF16);
  EXPECT_FALSE(b.compute_resident());
  ASSERT_EQ(b.compute_shard().numel(), b.shard().numel());
  EXPECT_EQ(values(b.compute_shard()), cast_to_bf16(b.shard()));
  // A write across the slices' boundary reaches this slice's copy for its own part only.
  const int64_t boundary = b.shard_begin();
  b.write_elements(boundary - 3, Tensor::full({6}, -2.5, DType::F32));
  EXPECT_EQ(values(b.compute_shard()), cast_to_bf16(b.shard()));
  EXPECT_EQ(values(b.compute_shard().narrow(0, 0, 3)), std::vector<double>(3, -2.5));
  EXPECT_NE(values(b.compute_shard().narrow(0, 3, 1))[0], -2.5);
  b.release_compute();  // the gathers' whole copy comes and goes
}

// A slice that does not exist is an error naming the block, never silently a whole block.
TEST(ParamBlock, ASliceThatDoesNotExistIsAnError) {
  const std::vector<nn::ParamSpec> specs = {{"w", {4, 4}}};
  for (const nn::BlockShard shard : {nn::BlockShard{0, 0}, nn::BlockShard{3, 1}, nn::BlockShard{-1, 2}}) {
    const std::string e =
        titan::testing::error_of([&] { nn::ParamBlock("block", specs, Device::CPU, shard); });
    EXPECT_NE(e.find("ParamBlock 'block': slice " + std::to_string(shard.index) + " of " +
                     std::to_string(shard.count) + " does not exist"),
              std::string::npos)
        << e;
  }
}
