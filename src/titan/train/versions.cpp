#include "titan/train/versions.h"

#include <cblas.h>
#include <mpi.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdio>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/device_services.h"

namespace titan::train {
namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown compiler";
#endif
}

std::string onednn() {
  const dnnl_version_t* v = dnnl_version();
  std::string runtime = v->cpu_runtime == DNNL_RUNTIME_OMP         ? "OpenMP"
                        : v->cpu_runtime == DNNL_RUNTIME_TBB       ? "TBB"
                        : v->cpu_runtime == DNNL_RUNTIME_SEQ       ? "sequential"
                        : v->cpu_runtime == DNNL_RUNTIME_THREADPOOL ? "threadpool"
                                                                    : "runtime " + std::to_string(v->cpu_runtime);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d.%d.%d (commit %s, CPU runtime %s)", v->major, v->minor, v->patch, v->hash,
                runtime.c_str());
  return buf;
}

// OpenBLAS's build configuration ("OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64") and
// the kernels it picked for this CPU, which decide its speed (see backend/cpu/gemm.cpp).
std::string openblas() {
  std::string config = openblas_get_config(), core = openblas_get_corename();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  return config.find(core) == std::string::npos ? config + " (core " + core + ")" : config;
}

std::string mpi() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf);  // `len` may count the terminating NUL
  // Open MPI's string continues with package and build lines: the first line names the release.
  s = s.substr(0, s.find_first_of("\r\n"));
  while (!s.empty() && (s.back() == ' ' || s.back() == ',')) s.pop_back();
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return s + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

}  // namespace

std::vector<VersionEntry> collect_versions() {
  const auto& cpu = cpu::cpu_info();
  std::vector<VersionEntry> v = {
      {"titan", titan_git_describe()},
      {"compiler", compiler()},
      {"oneDNN", onednn()},
      {"OpenBLAS", openblas()},
      {"MPI", mpi()},
  };
#ifdef TITAN_HAVE_CUDA
  // The CUDA runtime and GPUs as the backend library reports them once something loaded it (a
  // job on device cuda, `titan version --cuda`); never loaded from here, so a CPU run says so.
  if (const DeviceServices* cuda = loaded_device_services(Device::CUDA)) {
    for (auto& [component, version] : cuda->versions()) v.push_back({component, version});
  } else {
    v.push_back({"CUDA", "backend not loaded (libtitan_cuda.so is loaded on first use of device cuda)"});
  }
#endif
  char family_model[64];
  std::snprintf(family_model, sizeof family_model, " (%s family 0x%x model 0x%x)", cpu.vendor.c_str(), cpu.family,
                cpu.model);
  v.push_back({"CPU", (cpu.brand.empty() ? cpu.vendor : cpu.brand) + family_model});
  v.push_back({"ISA", cpu.isa()});
  return v;
}

nlohmann::json versions_json(const std::vector<VersionEntry>& versions) {
  nlohmann::json j = nlohmann::json::object();
  for (auto& e : versions) j[e.component] = e.version;
  return j;
}

std::string versions_text(const std::vector<VersionEntry>& versions, const std::string& indent) {
  std::string s;
  for (auto& e : versions) s += (s.empty() ? "" : "\n") + indent + e.component + ": " + e.version;
  return s;
}

}  // namespace titan::train
