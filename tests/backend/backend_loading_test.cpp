// The CUDA backend is a library of its own (libtitan_cuda.so) that libtitan loads with dlopen only
// when something asks for device cuda (core/device_services.h, docs/devices.md). Checked on the
// real titan binary with the dynamic loader's own trace (LD_DEBUG=libs prints every library it
// searches for and initialises, dlopen included): a CPU training run never loads the CUDA runtime,
// cuBLAS, NCCL or the backend library, while asking for cuda loads them (the control that shows
// the trace would see them). A missing backend library and a machine without a GPU are errors
// naming what was looked for. This program links libtitan only, like the titan binary.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "train/tiny_job.h"

namespace titan {
namespace {

namespace tt = titan::testing;

// A library the dynamic loader searched for or initialised, as LD_DEBUG=libs prints it.
const std::regex kCudaLibraryLoaded(R"((find library=|calling init: \S*/)(libcudart|libcublas|libnccl|libtitan_cuda))");

std::string tiny_cpu_job(const std::string& name) {
  return tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
         tt::cli_args(tt::tiny_job(tt::temp_dir(name), {{"training.steps", "2"}}));
}

#ifdef TITAN_HAVE_CUDA
#define REQUIRE_CUDA_BUILD()
#else
#define REQUIRE_CUDA_BUILD() GTEST_SKIP() << "built without the CUDA backend (nvcc not found at configure time)"
#endif

TEST(BackendLoading, CpuTrainingNeverLoadsTheCudaLibraries) {
  std::string out;
  ASSERT_EQ(tt::run_command("LD_DEBUG=libs " + tiny_cpu_job("loading_cpu"), &out), 0) << out.substr(0, 4000);
  ASSERT_NE(out.find("step: 2"), std::string::npos) << "the run did not train 2 steps:\n" << out.substr(0, 4000);
  std::smatch m;
  EXPECT_FALSE(std::regex_search(out, m, kCudaLibraryLoaded)) << "a CPU run loaded " << m.str();
#ifdef TITAN_HAVE_CUDA
  // The versions block of the start-up log (and of checkpoints) says so too.
  EXPECT_NE(out.find("CUDA: backend not loaded"), std::string::npos) << out.substr(0, 4000);
#endif
}

TEST(BackendLoading, AskingForCudaLoadsTheBackendAndTheCudaRuntime) {
  REQUIRE_CUDA_BUILD();
  std::string out;
  ASSERT_EQ(tt::run_command("LD_DEBUG=libs " + tt::titan_binary().string() + " version --cuda", &out), 0) << out;
  for (const char* lib : {"libtitan_cuda", "libcudart", "libcublasLt"})
    EXPECT_TRUE(std::regex_search(out, std::regex(std::string("calling init: \\S*/") + lib)))
        << lib << " was not loaded by `titan version --cuda`";
  EXPECT_NE(out.find("CUDA: runtime "), std::string::npos) << out.substr(out.size() > 2000 ? out.size() - 2000 : 0);
}

TEST(BackendLoading, LoadingRegistersTheServicesAndTheCudaKernelsInProcess) {
  REQUIRE_CUDA_BUILD();
  auto cuda_kernels = [] {
    size_t n = 0;
    for (const auto& e : kernels::all_kernels()) n += e.device == Device::CUDA;
    return n;
  };
  ASSERT_EQ(loaded_device_services(Device::CUDA), nullptr) << "loaded before anything asked for cuda";
  ASSERT_EQ(cuda_kernels(), 0u);
  ASSERT_EQ(load_device_backend(Device::CUDA), "");
  const DeviceServices* cuda = loaded_device_services(Device::CUDA);
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->device(), Device::CUDA);
  EXPECT_GT(cuda_kernels(), 0u);
  // The kernels every CUDA training step needs, among others.
  for (const char* op : {"linear", "attention", "rms_norm", "adamw"})
    EXPECT_TRUE(kernels::has_kernel(op, Device::CUDA, DType::BF16, "default") ||
                kernels::has_kernel(op, Device::CUDA, DType::F32, "default"))
        << op;
}

TEST(BackendLoading, AMissingBackendLibraryIsAnErrorNamingIt) {
  REQUIRE_CUDA_BUILD();
  const std::string missing = (tt::temp_dir("loading_missing") / "no" / "libtitan_cuda.so").string();
  const std::string env = "TITAN_CUDA_BACKEND='" + missing + "' ";
  std::string out;
  EXPECT_NE(tt::run_command(env + tiny_cpu_job("loading_missing_job") + " --job.device=cuda", &out), 0) << out;
  EXPECT_NE(out.find("job.device = \"cuda\""), std::string::npos) << out;
  EXPECT_NE(out.find("the CUDA backend library '" + missing + "' could not be loaded"), std::string::npos) << out;
  EXPECT_NE(tt::run_command(env + tt::titan_binary().string() + " kernels parity --device cuda", &out), 0) << out;
  EXPECT_NE(out.find("kernels parity --device cuda: the CUDA backend library '" + missing + "'"), std::string::npos)
      << out;
}

TEST(BackendLoading, CudaWithoutAGpuIsAnErrorNamingTheDevice) {
  REQUIRE_CUDA_BUILD();
  if (device_available(Device::CUDA)) GTEST_SKIP() << "this machine has a GPU";
  std::string out;
  EXPECT_NE(tt::run_command(tiny_cpu_job("loading_no_gpu") + " --job.device=cuda", &out), 0) << out;
  EXPECT_NE(out.find("job.device = \"cuda\""), std::string::npos) << out;
  EXPECT_NE(out.find("device 'cuda' is unavailable: no CUDA device found"), std::string::npos) << out;
}

}  // namespace
}  // namespace titan
