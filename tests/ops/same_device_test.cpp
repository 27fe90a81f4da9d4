// An op whose tensors are on different devices is refused before any kernel runs, naming the op and
// each tensor with its device (ops/same_device.h). The meta device stands in for a second device on
// any machine: a CPU kernel handed a meta tensor, or a GPU kernel a host pointer, would otherwise run.
#include "titan/ops/same_device.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/linear/linear.h"
#include "titan/ops/moe/moe.h"
#include "titan/ops/rms_norm/rms_norm.h"

using namespace titan;
using titan::testing::error_of;

namespace {

Tensor on(Device device, const Shape& shape, DType dtype = DType::F32) {
  return device == Device::CPU ? Tensor::zeros(shape, dtype) : Tensor::empty(shape, dtype, device);
}

void expect_refused(const std::function<void()>& call, const std::string& op, const std::string& meta_tensor) {
  const std::string e = error_of(call);
  EXPECT_NE(e.find(op + ": "), std::string::npos) << e;
  EXPECT_NE(e.find(meta_tensor + " on meta"), std::string::npos) << e;
  EXPECT_NE(e.find(" on cpu"), std::string::npos) << e;
  EXPECT_NE(e.find("must all be on one device"), std::string::npos) << e;
}

}  // namespace

TEST(SameDevice, OpsRefuseTensorsOnTwoDevicesNamingEach) {
  const Device cpu = Device::CPU, meta = Device::Meta;
  expect_refused([&] { ops::linear(on(cpu, {4, 8}), on(meta, {6, 8})); }, "linear", "w f32[6, 8]");
  expect_refused([&] { ops::rms_norm(on(meta, {4, 8}), on(cpu, {8}), 1e-6); }, "rms_norm", "x f32[4, 8]");
  expect_refused([&] { ops::attention(on(cpu, {1, 3, 2, 8}), on(cpu, {1, 3, 1, 8}), on(meta, {1, 3, 1, 8}), 0.3); },
                 "attention", "v f32[1, 3, 1, 8]");
  expect_refused([&] { ops::cross_entropy(on(cpu, {3, 5}), on(meta, {3}, DType::I64)); }, "cross_entropy",
                 "labels i64[3]");
  expect_refused([&] { ops::linear_cross_entropy(on(cpu, {3, 4}), on(meta, {5, 4}), on(cpu, {3}, DType::I64)); },
                 "linear_cross_entropy", "weight f32[5, 4]");
  expect_refused([&] { ops::linear_cross_entropy(on(cpu, {3, 4}), on(cpu, {5, 4}), on(meta, {3}, DType::I64)); },
                 "linear_cross_entropy", "labels i64[3]");
  expect_refused([&] { ops::router_topk(on(cpu, {3, 4}), 2, true, on(meta, {4})); }, "router_topk",
                 "expert_bias f32[4]");
  expect_refused(
      [&] {
        ops::moe_experts(on(cpu, {3, 4}), on(cpu, {3, 2}), on(cpu, {3, 2}, DType::I64), on(cpu, {5, 6, 4}),
                         on(meta, {5, 6, 4}), on(cpu, {5, 4, 6}));
      },
      "moe_experts", "w_up f32[5, 6, 4]");
}

TEST(SameDevice, UndefinedTensorsAreSkippedAndOneDeviceIsAccepted) {
  const Tensor a = Tensor::zeros({2}, DType::F32), b = Tensor::zeros({3}, DType::F32), none;
  EXPECT_NO_THROW(ops::check_same_device("op", {{"a", &a}, {"none", &none}, {"b", &b}}));
  const Tensor m = Tensor::empty({2}, DType::F32, Device::Meta);
  EXPECT_NO_THROW(ops::check_same_device("op", {{"none", &none}, {"m", &m}}));
  const std::string e = error_of([&] { ops::check_same_device("op", {{"a", &a}, {"none", &none}, {"m", &m}}); });
  EXPECT_EQ(e.find("none"), std::string::npos) << "an undefined tensor is not listed: " << e;
}
