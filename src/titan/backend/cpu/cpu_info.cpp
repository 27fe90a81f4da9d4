#include "titan/backend/cpu/cpu_info.h"

#include <cpuid.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>
#include <utility>

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
std::pair<int, int> count_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return {int(std::max(1L, n)), int(std::max(1L, n))};
  }
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

// A chain of dependent register adds retires one add per cycle, so cycles/second is the clock the
// core runs at right now. The first run is a warm-up that lets the clock governor ramp up; the
// fastest of the rest discards runs that were preempted.
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
  run(kIters * 5);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) best = std::min(best, run(kIters));
  return double(kIters) * 16 / best / 1e9;
}

CpuInfo probe() {
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
  info.cores = std::max(1, std::min(physical, omp_get_max_threads()));

  if (const char* env = std::getenv("TITAN_CPU_GHZ"); env && std::atof(env) > 0) {
    info.ghz = std::atof(env);
    info.ghz_from_env = true;
  } else {
    info.ghz = measure_ghz();
  }

  bool zen4 = info.vendor == "AuthenticAMD" && info.family == 0x19;
  if (info.avx512f) {
    info.f32_flops_per_cycle = zen4 ? 32 : 64;
  } else if (info.avx2 && info.fma) {
    info.f32_flops_per_cycle = 32;
  } else {
    info.f32_flops_per_cycle = 8;
  }
  if (info.amx_usable && info.amx_bf16) {
    info.bf16_flops_per_cycle = 1024;
  } else if (info.avx512_bf16) {
    info.bf16_flops_per_cycle = 2 * info.f32_flops_per_cycle;
  } else {
    info.bf16_flops_per_cycle = info.f32_flops_per_cycle;
  }
  return info;
}

}  // namespace

double CpuInfo::peak_flops(DType dt) const {
  double per_cycle = f32_flops_per_cycle;
  if (dt == DType::BF16) per_cycle = bf16_flops_per_cycle;
  if (dt == DType::F64) per_cycle = f32_flops_per_cycle / 2;
  return double(cores) * ghz * 1e9 * per_cycle;
}

std::string CpuInfo::summary() const {
  std::ostringstream os;
  char fam[16];
  std::snprintf(fam, sizeof(fam), "0x%x", family);
  os << (brand.empty() ? vendor : brand) << " (" << vendor << " family " << fam << "): " << cores
     << " cores (" << logical_cpus << " cpus) @ " << std::fixed << std::setprecision(2) << ghz << " GHz" << (ghz_from_env ? " (TITAN_CPU_GHZ)" : "")
     << ";";
  if (avx2) os << " avx2";
  if (fma) os << " fma";
  if (avx512_core()) os << " avx512";
  if (avx512_bf16) os << " avx512_bf16";
  if (amx_tile) os << (amx_usable ? " amx" : " amx(denied)");
  os << std::setprecision(0) << "; peak f32 " << peak_flops(DType::F32) / 1e9 << " GFLOP/s, bf16 " << peak_flops(DType::BF16) / 1e9
     << " GFLOP/s";
  return os.str();
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = probe();
  return info;
}

}  // namespace titan::cpu
