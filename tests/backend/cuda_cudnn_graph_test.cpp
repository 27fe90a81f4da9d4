// The cuDNN graphs titan runs, checked without a GPU: the fused attention's forward and backward
// (backend/cuda/cudnn_attention.h) and the MoE grouped matmul (backend/cuda/cudnn_moe.h). cuDNN's
// heuristics are asked, for an H200 described by its device properties
// (tests/fixtures/cudnn_device_h200.json, cuDNN 9.8's deviceless device description), how many of
// its engine configurations pass their support checks for the exact graphs the "cudnn" variants
// run. A graph cuDNN's engines do not recognise (a wrong dtype, a missing mask op, a stride they
// refuse) gets none. Which engine then builds a plan, and its numbers, only a GPU can tell
// (cuda_attention_test's and cuda_moe_test's Cudnn cases).
//
// Without a CUDA driver the test loads a stand-in libcuda.so.1 first (fake_cuda_driver.c): cuDNN's
// runtime-compiled engines look one up before answering. With a real driver (a GPU machine) it
// uses that.
#include <gtest/gtest.h>

#ifndef TITAN_HAVE_CUDA
TEST(CudaAttentionGraph, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without the CUDA backend (TITAN_CUDA off, or no nvcc)";
}
#else

#include <dlfcn.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cuda_test_util.h"
#include "test_util.h"
#include "titan/backend/cuda/cudnn_attention.h"
#include "titan/backend/cuda/cudnn_graph.h"
#include "titan/backend/cuda/cudnn_moe.h"

namespace titan::cuda {
namespace {

// Empty when cuDNN can answer a deviceless query here, else why not (the test then skips).
std::string prepare() {
  static const std::string why = [] {
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) &&
        !dlopen(TITAN_FAKE_CUDA_DRIVER, RTLD_NOW | RTLD_GLOBAL))
      return std::string("neither a CUDA driver nor the stand-in loads: ") + dlerror();
    const std::string version = cudnn_version_text();
    if (version.empty() || !std::isdigit(static_cast<unsigned char>(version[0]))) return version;  // why not
    return std::string();
  }();
  return why;
}

std::string h200() {
  std::ifstream in(testing::fixtures_dir() / "cudnn_device_h200.json");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Shape {
  const char* name;
  SdpaShape s;
};

// The peer jobs' attention shapes (Qwen3-0.6B 8 x 2048, Qwen3-4B 2 x 2048, the 30B-A3B-dims MoE
// 8 x 2048) and small ones: head_dim 64 and 128, one to eight query heads per kv head.
const Shape kShapes[] = {
    {"qwen3-0.6B", {8, 2048, 16, 8, 128, 0.0883883f}},
    {"qwen3-4B", {2, 2048, 32, 8, 128, 0.0883883f}},
    {"30B-A3B dims", {8, 2048, 32, 4, 128, 0.0883883f}},
    {"MHA d64", {2, 256, 4, 4, 64, 0.125f}},
    {"MQA d64", {2, 384, 8, 1, 64, 0.125f}},
};

TEST(CudaAttentionGraph, CudnnEnginesTakeOurForwardAndBackwardGraphsOnAnH200) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string device = h200();
  for (const Shape& shape : kShapes) {
    EXPECT_GE(cudnn_attention_engine_count(shape.s, false, device), 1) << shape.name << " forward";
    EXPECT_GE(cudnn_attention_engine_count(shape.s, true, device), 1) << shape.name << " backward";
  }
}

// The control: a head_dim no engine takes (12: not a multiple of 8) gets no configuration, so the
// counts above are cuDNN's answer about our graphs, not a count that is never zero.
TEST(CudaAttentionGraph, CudnnEnginesRefuseAHeadDimTheyCannotRun) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  const SdpaShape s{2, 256, 4, 4, 12, 0.25f};
  EXPECT_EQ(cudnn_attention_engine_count(s, false, h200()), 0);
  EXPECT_EQ(cudnn_attention_engine_count(s, true, h200()), 0);
}

// The MoE job's expert GEMMs (30B-A3B dims: D 2048, F 768, 64 experts, top-4 of 8 x 2048 tokens):
// forward gate and up as one [rows, 2048] x [1536, 2048]^T (each expert's gate and up rows stacked),
// down [rows, 768] x [2048, 768]^T; backward dx over [dg | du] [rows, 1536] x [2048, 1536]^T into
// f32; and a small shape of cuda_moe_test. (The backward's dh reads dy rows gathered by token, which
// cuDNN's contiguous rows do not: it runs mma_sync.)
TEST(CudaMoeGraph, CudnnEnginesTakeTheGroupedMatmulsOfTheMoeJobOnAnH200) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  if (const std::string v = cudnn_grouped_matmul_unavailable(); !v.empty()) GTEST_SKIP() << v;
  const std::string device = h200();
  const int64_t rows = 8 * 2048 * 4;
  EXPECT_GE(cudnn_grouped_matmul_engine_count({rows, 2048, 1536, 64, 1536, DType::BF16}, device), 1)
      << "gate|up";
  EXPECT_GE(cudnn_grouped_matmul_engine_count({rows, 768, 2048, 64, 2048, DType::BF16}, device), 1) << "down";
  EXPECT_GE(cudnn_grouped_matmul_engine_count({rows, 1536, 2048, 64, 2048, DType::F32}, device), 1) << "dx";
  EXPECT_GE(cudnn_grouped_matmul_engine_count({600, 264, 136, 8, 272, DType::BF16}, device), 1) << "small";
}

// The control: the same operation with each expert's weight stored [K, N] (N contiguous, a layout
// the engines do not take) gets no configuration, so the counts above are cuDNN's answer about
// the layout titan passes ([E, N, K], K contiguous), not a count that is never zero.
TEST(CudaMoeGraph, CudnnEnginesRefuseWeightsStoredWithNContiguous) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  if (const std::string v = cudnn_grouped_matmul_unavailable(); !v.empty()) GTEST_SKIP() << v;
  const int64_t rows = 600, K = 264, N = 136, E = 8;
  cudnn::GraphBuilder g;
  const cudnn::Desc& tokens = g.tensor(1, {1, rows, K}, {rows * K, K, 1}, CUDNN_DATA_BFLOAT16);
  const cudnn::Desc& weights = g.tensor(2, {E, K, N}, {K * N, N, 1}, CUDNN_DATA_BFLOAT16);
  const cudnn::Desc& first = g.tensor(3, {E, 1, 1}, {1, 1, 1}, CUDNN_DATA_INT32);
  const cudnn::Desc& out = g.tensor(4, {1, rows, N}, {rows * N, N, 1}, CUDNN_DATA_BFLOAT16);
  cudnn::Desc op(CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR, "MoE grouped matmul (control)");
  cudnnMoeGroupedMatmulMode_t mode = CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
  op.set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, 1, &mode)
      .set_type(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, CUDNN_DATA_FLOAT)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, tokens)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, weights)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, first)
      .set_desc(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, out);
  op.finalize();
  g.add_operation(std::move(op));
  EXPECT_EQ(cudnn::deviceless_engine_count(g, h200(), "control"), 0);
}

// On a GPU: the real device as cuDNN serializes it (printed, for the fixture's next revision); on an
// H200, the fields the fixture sets equal the real ones, and our graphs get engines for the real
// device description too.
TEST(CudaCudnnDevice, TheH200FixtureDescribesTheRealDevice) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  TITAN_REQUIRE_CUDA();
  const std::string real = cudnn::device_properties_json();
  std::cout << "cuDNN's device properties of this GPU: " << real << "\n";
  const nlohmann::json r = nlohmann::json::parse(real), fixture = nlohmann::json::parse(h200());
  EXPECT_GE(cudnn_attention_engine_count(kShapes[0].s, false, real), 1);
  EXPECT_GE(cudnn_attention_engine_count(kShapes[0].s, true, real), 1);
  if (r.value("deviceName", std::string()).find("H200") == std::string::npos)
    GTEST_SKIP() << "not an H200: " << r.value("deviceName", std::string("?"));
  // Another cuDNN than the fixture's (9.19) may serialize other fields: those are named, not failed;
  // every field both have must agree.
  int compared = 0;
  for (auto it = fixture.begin(); it != fixture.end(); ++it) {
    if (it.key() == "driverVer" || it.key() == "pciDeviceId" || it.key() == "totalGlobalMem" ||
        it.key() == "smClockRateKHz" || it.key() == "memClockRateKHz" || it.key() == "cudaDeviceId")
      continue;  // the driver, board and clocks may differ between H200s
    if (!r.contains(it.key())) {
      std::cout << "the loaded cuDNN does not describe the fixture's field " << it.key() << "\n";
      continue;
    }
    EXPECT_EQ(r.at(it.key()), it.value()) << it.key();
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no field of the fixture is in the real device's description";
}

TEST(CudaAttentionGraph, ABadDeviceDescriptionIsAnErrorNamingIt) {
  const std::string why = prepare();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string error = testing::error_of(
      [] { cudnn_attention_engine_count(kShapes[0].s, false, R"({"deviceName": "NVIDIA H200"})"); });
  EXPECT_NE(error.find("device properties"), std::string::npos) << error;
}

// The cache of execution plans both cuDNN users share: the most recently used `capacity` plans
// stay, a plan handed out outlives its eviction, and a failed build keeps its error. (Empty plans:
// the cache's bookkeeping needs neither cuDNN nor a GPU.)
TEST(CudnnPlanCache, KeepsTheMostRecentPlansAndTheErrorsOfFailedBuilds) {
  cudnn::PlanCache cache(2);
  int built = 0;
  auto build = [&] {
    ++built;
    return std::make_unique<cudnn::Plan>();
  };
  const auto a = cache.get("S=128", build);
  const auto b = cache.get("S=256", build);
  EXPECT_EQ(cache.get("S=128", build), a) << "a cached shape is not built again";
  EXPECT_EQ(built, 2);
  // A third shape evicts the least recently used (S=256: S=128 was used last).
  const auto c = cache.get("S=384", build);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get("S=128", build), a);
  EXPECT_EQ(built, 3);
  EXPECT_NE(cache.get("S=256", build), b) << "S=256 was evicted and built again";
  EXPECT_EQ(built, 4);
  EXPECT_NE(b.get(), nullptr) << "a plan held by its caller outlives the eviction";

  int failed = 0;
  auto refuse = [&]() -> std::unique_ptr<cudnn::Plan> {
    ++failed;
    TITAN_FAIL("attention (cudnn): no engine finalizes backward B=1 S=77");
  };
  for (int call = 0; call < 3; ++call) {
    const std::string err = testing::error_of([&] { cache.get("backward S=77", refuse); });
    EXPECT_NE(err.find("no engine finalizes backward B=1 S=77"), std::string::npos) << err;
  }
  EXPECT_EQ(failed, 1) << "a shape whose build failed fails at once when asked again";
  EXPECT_EQ(cache.builds(), 5);
  EXPECT_NE(testing::error_of([] { cudnn::PlanCache none(0); }).find("capacity must be at least 1"),
            std::string::npos);
}

}  // namespace
}  // namespace titan::cuda

#endif  // TITAN_HAVE_CUDA
