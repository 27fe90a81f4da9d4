#include "titan/backend/cpu/cpu_info.h"

#include <cpuid.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "titan/core/cgroup.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/io/atomic_file.h"

namespace titan::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d);
  return r;
}
bool bit(unsigned v, int i) { return (v >> i) & 1u; }

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux (5.16+) hands out the 8 KiB AMX tile state only on request; without it the first tile
// instruction kills the process with SIGILL. oneDNN asks too; asking twice is harmless.
bool request_amx_permission() {
#ifdef __linux__
  constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask >> kXfeatureXtiledata) & 1ul;
#else
  return false;
#endif
}

// Physical cores among the CPUs this process may use: SMT siblings share (package, core) ids.
// {physical cores, logical CPUs} of `set` (the affinity mask, or every online CPU).
std::pair<int, int> count_cores(const cpu_set_t& set) {
  int logical = 0;
  bool topology_ok = true;
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++logical;
    std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core_f(dir + "core_id"), pkg_f(dir + "physical_package_id");
    int core = -1, pkg = -1;
    if (!(core_f >> core) || !(pkg_f >> pkg)) topology_ok = false;
    cores.insert({pkg, core});
  }
  logical = std::max(logical, 1);
  int physical = topology_ok ? int(cores.size()) : logical;
  return {std::max(physical, 1), logical};
}

// {physical cores, logical CPUs} this process may run on (its affinity mask).
std::pair<int, int> count_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return {int(std::max(1L, n)), int(std::max(1L, n))};
  }
  return count_cores(set);
}

// Physical cores of every online CPU of the host.
int count_host_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = std::min<long>(sysconf(_SC_NPROCESSORS_ONLN), CPU_SETSIZE);
  for (long cpu = 0; cpu < online; ++cpu) CPU_SET(int(cpu), &set);
  return count_cores(set).first;
}

// A chain of dependent register adds retires one add per cycle, so cycles/second is the clock the
// core runs at right now. A long first run lets the clock governor ramp up; the fastest of many
// short runs discards those that were preempted. It varies from run to run (turbo headroom, other
// tenants of the host), which is why it is measured once per machine and recorded (below).
double measure_ghz() {
  auto run = [](uint64_t iters) {
    uint64_t acc = 0, one = 1;
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < iters; ++i) {
      __asm__ volatile(
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          : "+r"(acc)
          : "r"(one));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  constexpr uint64_t kIters = 250000;  // 4M cycles, ~1 ms at 4 GHz
  run(kIters * 20);
  double best = 1e30;
  for (int r = 0; r < 30; ++r) best = std::min(best, run(kIters));
  return double(kIters) * 16 / best / 1e9;
}

// What identifies a kind of CPU for the recorded clock.
std::string cpu_identity(const CpuInfo& info) {
  char fm[48];
  std::snprintf(fm, sizeof fm, "family 0x%x model 0x%x", info.family, info.model);
  return info.vendor + " / " + info.brand + " / " + fm;
}

// The highest clock the kernel lets any CPU of this process reach (cpufreq, kHz): absent in most
// virtual machines.
double cpufreq_max_ghz() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  double best = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cpufreq/cpuinfo_max_freq");
    double khz = 0;
    if (f >> khz) best = std::max(best, khz / 1e6);
  }
  return best;
}

// Where the clock measured on this kind of CPU is recorded: $XDG_CACHE_HOME/titan (else
// ~/.cache/titan), one file per CPU identity. Empty when neither variable is set.
std::filesystem::path clock_record_path(const CpuInfo& info) {
  std::filesystem::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::filesystem::path(x) / "titan";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::filesystem::path(h) / ".cache" / "titan";
  else return {};
  return dir / ("cpu-clock-" + hash_hex(fnv1a(cpu_identity(info))) + ".json");
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The clock of the peak must be a property of the machine, not of the moment: MFU compares runs.
// First found: TITAN_CPU_GHZ; cpufreq's maximum; CPUID leaf 0x16's maximum; the clock measured the
// first time titan ran on this CPU and recorded since. Nominal clocks (/proc/cpuinfo's "cpu MHz", the
// "@ 2.70GHz" of a brand string) are not used: they are base or TSC clocks, below what the cores
// reach under turbo (on the Zen4 VM this was written on: 2.6 GHz nominal, 3.6 GHz measured), and
// a peak below the real one overstates MFU.
void set_clock(CpuInfo& info, unsigned max_leaf) {
  if (const char* env = std::getenv("TITAN_CPU_GHZ"); env && std::atof(env) > 0) {
    info.ghz = std::atof(env);
    info.ghz_source = "TITAN_CPU_GHZ";
    return;
  }
  if (double ghz = cpufreq_max_ghz(); ghz > 0) {
    info.ghz = ghz;
    info.ghz_source = "cpufreq cpuinfo_max_freq";
    return;
  }
  if (max_leaf >= 0x16) {
    if (unsigned mhz = cpuid(0x16).b & 0xffff; mhz > 0) {
      info.ghz = mhz / 1000.0;
      info.ghz_source = "CPUID leaf 0x16 maximum frequency";
      return;
    }
  }
  const std::filesystem::path record = clock_record_path(info);
  if (!record.empty()) {
    std::ifstream f(record);
    nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("cpu", "") == cpu_identity(info) && j.contains("ghz") && j["ghz"].is_number() &&
        j["ghz"].get<double>() > 0) {
      info.ghz = j["ghz"].get<double>();
      info.ghz_source = "measured " + j.value("measured", "") + ", recorded in " + record.string();
      return;
    }
  }
  info.ghz = measure_ghz();
  if (record.empty()) {
    info.ghz_source = "measured now (not recorded: neither XDG_CACHE_HOME nor HOME is set)";
    return;
  }
  const std::string when = utc_now();
  try {
    std::filesystem::create_directories(record.parent_path());
    io::write_file_atomic(record, nlohmann::json{{"cpu", cpu_identity(info)}, {"ghz", info.ghz}, {"measured", when}}
                                          .dump(2) + "\n");
    info.ghz_source = "measured " + when + ", recorded in " + record.string();
  } catch (const std::exception& e) {
    info.ghz_source = std::string("measured now (not recorded: ") + e.what() + ")";
  }
}

}  // namespace

CpuInfo probe_cpu() {
  CpuInfo info;
  Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  info.vendor = vendor;
  unsigned max_leaf = v.a;

  Regs ext = cpuid(0x80000000);
  if (ext.a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    info.brand = brand;
    info.brand.erase(0, info.brand.find_first_not_of(' '));
    info.brand.erase(info.brand.find_last_not_of(' ') + 1);
  }

  Regs l1 = cpuid(1);
  unsigned base_family = (l1.a >> 8) & 0xf, base_model = (l1.a >> 4) & 0xf;
  info.family = int(base_family == 0xf ? base_family + ((l1.a >> 20) & 0xff) : base_family);
  info.model = int(base_family == 0x6 || base_family == 0xf ? base_model | (((l1.a >> 16) & 0xf) << 4)
                                                             : base_model);
  // The OS must save the wide registers on context switch (XCR0) or the instructions fault.
  bool osxsave = bit(l1.c, 27);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;
  bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);

  if (max_leaf >= 7) {
    Regs l7 = cpuid(7, 0);
    info.fma = os_avx && bit(l1.c, 12);
    info.avx2 = os_avx && bit(l7.b, 5);
    info.avx512f = os_avx512 && bit(l7.b, 16);
    info.avx512dq = os_avx512 && bit(l7.b, 17);
    info.avx512bw = os_avx512 && bit(l7.b, 30);
    info.avx512vl = os_avx512 && bit(l7.b, 31);
    info.amx_bf16 = os_amx && bit(l7.d, 22);
    info.amx_tile = os_amx && bit(l7.d, 24);
    if (l7.a >= 1) info.avx512_bf16 = info.avx512f && bit(cpuid(7, 1).a, 5);
  }
  if (info.amx_tile) info.amx_usable = request_amx_permission();

  auto [physical, logical] = count_cores();
  info.logical_cpus = logical;
  // A cgroup's CPU quota (a pod's CPU limit) is CPU time: threads past it take turns.
  int quota_cores = std::numeric_limits<int>::max();
  if (const std::optional<CgroupCpuLimit> quota = cgroup_cpu_limit()) {
    info.cpu_quota = quota->cpus;
    info.cpu_quota_file = quota->file;
    quota_cores = std::max(1, int(std::ceil(quota->cpus)));
  }
  info.cores = std::max(1, std::min({physical, omp_get_max_threads(), quota_cores}));
  info.host_cores = std::min(std::max(count_host_cores(), physical), quota_cores);

  set_clock(info, max_leaf);

  assign_flop_rates(info);
  return info;
}

void assign_flop_rates(CpuInfo& info) {
  // Zen4 (family 0x19) splits a zmm FMA into two 256-bit halves; Zen5 (0x1a) and Intel run it whole,
  // two per cycle (measured on Zen5 with register-only loops: zmm FMA 62.7, ymm 31.5 FLOP/cycle).
  bool zen4 = info.vendor == "AuthenticAMD" && info.family == 0x19;
  if (info.avx512f) {
    info.f32_flops_per_cycle = zen4 ? 32 : 64;
  } else if (info.avx2 && info.fma) {
    info.f32_flops_per_cycle = 32;
  } else {
    info.f32_flops_per_cycle = 8;
  }
  // AMD (Zen4, Zen5) issues VDPBF16PS as fast as a zmm FMA (twice the FLOPs: 116 FLOP/cycle measured
  // on Zen5, where oneDNN's bf16 matmul runs 1.6-2.2x its widened f32 one); Intel's takes two cycles,
  // so there the f32 FMA on widened inputs is the faster way to multiply bf16 matrices.
  info.bf16_dot_beats_fma =
      (info.amx_usable && info.amx_bf16) || (info.avx512_bf16 && info.vendor != "GenuineIntel");
  if (info.amx_usable && info.amx_bf16) {
    info.bf16_flops_per_cycle = 1024;
  } else if (info.bf16_dot_beats_fma) {
    info.bf16_flops_per_cycle = 2 * info.f32_flops_per_cycle;
  } else {
    info.bf16_flops_per_cycle = info.f32_flops_per_cycle;
  }
}

double CpuInfo::peak_flops(DType dt) const {
  double per_cycle = f32_flops_per_cycle;
  if (dt == DType::BF16) per_cycle = bf16_flops_per_cycle;
  if (dt == DType::F64) per_cycle = f32_flops_per_cycle / 2;
  return double(cores) * ghz * 1e9 * per_cycle;
}

std::string CpuInfo::peak_formula(DType dt) const {
  const char* unit = avx512f ? "AVX-512 FMA" : avx2 && fma ? "AVX2 FMA" : "SSE";
  double per_cycle = f32_flops_per_cycle;
  if (dt == DType::BF16) {
    per_cycle = bf16_flops_per_cycle;
    if (amx_usable && amx_bf16) unit = "AMX";
    else if (bf16_dot_beats_fma)
      unit = "AVX512-BF16";
    else
      unit = avx512f ? "AVX-512 FMA, widened" : avx2 && fma ? "AVX2 FMA, widened" : "SSE, widened";
  }
  if (dt == DType::F64) per_cycle = f32_flops_per_cycle / 2;
  std::ostringstream os;
  os << cores << " cores x " << std::fixed << std::setprecision(2) << ghz << " GHz (" << ghz_source << ") x "
     << std::setprecision(0) << per_cycle << " FLOP/cycle (" << dtype_name(dt) << " on " << unit << ")";
  return os.str();
}

std::string CpuInfo::isa() const {
  std::string s;
  auto add = [&](bool has, const char* name) {
    if (has) s += (s.empty() ? "" : " ") + std::string(name);
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512_core(), "avx512");
  add(avx512_bf16, "avx512_bf16");
  add(amx_tile, amx_usable ? "amx" : "amx(denied)");
  return s.empty() ? "sse" : s;
}

std::string CpuInfo::summary() const {
  std::ostringstream os;
  char fam[16];
  std::snprintf(fam, sizeof(fam), "0x%x", family);
  os << (brand.empty() ? vendor : brand) << " (" << vendor << " family " << fam << "): " << cores
     << " cores (" << logical_cpus << " cpus) @ " << std::fixed << std::setprecision(2) << ghz << " GHz"
     << ";";
  os << " " << isa();
  os << std::setprecision(0) << "; peak f32 " << peak_flops(DType::F32) / 1e9 << " GFLOP/s, bf16 " << peak_flops(DType::BF16) / 1e9
     << " GFLOP/s; clock: " << ghz_source;
  return os.str();
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = probe_cpu();
  return info;
}

namespace {
// The cap the process starts with: TITAN_KERNEL_ISA (a user checking a lower tier, e.g.
// `TITAN_KERNEL_ISA=portable titan kernels parity`), else none.
KernelIsa cap_from_env() {
  const char* env = std::getenv("TITAN_KERNEL_ISA");
  if (!env || !*env) return kHighestKernelIsa;
  for (KernelIsa isa :
       {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512, KernelIsa::kAvx512Bf16, KernelIsa::kAmx})
    if (std::string_view(env) == kernel_isa_name(isa)) return isa;
  TITAN_FAIL("TITAN_KERNEL_ISA=", env,
             " is not a kernel tier (use portable, avx2, avx512, avx512_bf16 or amx)");
}

std::atomic<KernelIsa>& kernel_isa_cap() {
  static std::atomic<KernelIsa> cap{cap_from_env()};
  return cap;
}
}  // namespace

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kPortable: return "portable";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
    case KernelIsa::kAvx512Bf16: return "avx512_bf16";
    case KernelIsa::kAmx:
      return "amx";
  }
  return "?";
}

KernelIsa cpu_kernel_isa() {
  static const KernelIsa best = [] {
    const CpuInfo& c = cpu_info();
    if (c.avx512_core() && c.avx512_bf16 && c.amx_usable && c.amx_bf16) return KernelIsa::kAmx;
    if (c.avx512_core() && c.avx512_bf16) return KernelIsa::kAvx512Bf16;
    if (c.avx512_core()) return KernelIsa::kAvx512;
    if (c.avx2 && c.fma) return KernelIsa::kAvx2;
    return KernelIsa::kPortable;
  }();
  return best;
}

KernelIsa kernel_isa() {
  return std::min(cpu_kernel_isa(), kernel_isa_cap().load(std::memory_order_relaxed));
}

void limit_kernel_isa(KernelIsa cap) {
  kernel_isa_cap().store(cap, std::memory_order_relaxed);
}

}  // namespace titan::cpu
