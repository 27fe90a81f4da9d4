#pragma once
// What the host CPU can do, probed once at run time (the binary is built for generic x86-64 and
// CI may be an Intel with AMX while development machines are AMD Zen4 without it).
//
// Peak FLOP/s, used as the denominator of MFU:
//   peak(dtype) = cores * ghz * 1e9 * flops_per_cycle(dtype)
// - cores: physical cores this process may run on (affinity mask, SMT siblings counted once),
//   capped by the OpenMP thread count, because that is what the kernels use, and by the CPU time its
//   cgroup's quota allows (core/cgroup.h: a Kubernetes pod's CPU limit), rounded up.
// - ghz: a clock that belongs to the machine, not to the moment (MFU compares runs), the first of:
//   TITAN_CPU_GHZ (e.g. a known all-core clock); cpufreq's cpuinfo_max_freq; CPUID leaf 0x16's
//   maximum frequency; else the clock measured (a chain of dependent register adds, 1 cycle each on
//   every x86 core since the Pentium 4) the first time titan ran on this kind of CPU, recorded in
//   $XDG_CACHE_HOME/titan/cpu-clock-<hash>.json (~/.cache/titan without XDG_CACHE_HOME) and read
//   back ever since. `ghz_source` says which. Delete the record to measure again.
// - flops_per_cycle, per core (an FMA counts 2):
//     f32 : AVX-512 with two 512-bit FMA pipes (Intel Xeon, AMD Zen5) = 64; AMD Zen4 (512-bit ops
//           on two 256-bit pipes) = 32; AVX2+FMA = 32; otherwise SSE = 8.
//     bf16: AMX (TDPBF16PS, 16x16x32 MACs per 16 cycles) = 1024; AVX512_BF16 (VDPBF16PS, 32 MACs
//           = 64 FLOP per instruction) on AMD, which issues one per cycle = 2 x f32 (Zen4: 64).
//           Elsewhere the f32 rate: bf16 GEMMs run as f32 GEMMs on widened inputs (gemm.h), which
//           is also the faster way on Intel's AVX512-BF16 without AMX (VDPBF16PS issues once per
//           two cycles there: 32, half the zmm FMA's 64).
//     f64 : half of f32.
// Measured on Zen4 (EPYC, 2 cores, ~3.6 GHz): zmm FMA loop 115 GFLOP/s/core = 32 x 3.6,
// VDPBF16PS loop 229 GFLOP/s/core = 64 x 3.6, which is where the Zen4 entries come from. On an
// Intel Xeon model 0xcf (2.98 GHz by the add chain): zmm FMA loop 169-171 GFLOP/s/core, VDPBF16PS
// loop 80-84 (24 independent accumulators), half: where the Intel entry comes from.
#include <string>

#include "titan/core/dtype.h"

namespace titan::cpu {

struct CpuInfo {
  std::string vendor;  // "AuthenticAMD", "GenuineIntel", ...
  std::string brand;   // CPUID brand string
  int family = 0;      // CPUID display family (Zen4 = 0x19, Zen5 = 0x1A)
  int model = 0;
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;  // CPUID says the unit exists
  bool amx_usable = false;                  // ... and Linux granted this process the tile state
  int cores = 1;                            // see the formula above
  int logical_cpus = 1;                     // CPUs in the affinity mask
  int host_cores = 1;    // physical cores of the whole host (every online CPU, SMT siblings once): what
                         // the processes of the host share, whatever their affinity masks (capped by
                         // the cgroup's CPU quota, which they share too)
  double cpu_quota = 0;  // CPUs the cgroup's quota allows (0: none), and its file
  std::string cpu_quota_file;
  double ghz = 0;                           // see above
  std::string ghz_source;                   // where `ghz` comes from
  double f32_flops_per_cycle = 0, bf16_flops_per_cycle = 0;
  // bf16 products run faster on bf16 instructions (AMX, AMD's AVX512-BF16) than as f32 FMAs on
  // widened inputs: what the bf16 GEMM's default path follows (gemm.h).
  bool bf16_dot_beats_fma = false;

  bool avx512_core() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  // Peak FLOP/s of the whole process for matmuls whose inputs have this dtype (F32, BF16, F64;
  // F16 is counted like BF16 without native support, i.e. at the f32 rate).
  double peak_flops(DType dt) const;
  // How peak_flops(dt) is made: "2 cores x 3.66 GHz (<ghz_source>) x 64 FLOP/cycle (bf16 on AVX512-BF16)".
  std::string peak_formula(DType dt) const;
  std::string isa() const;      // the vector extensions the kernels may use: "avx2 fma avx512 avx512_bf16"
  std::string summary() const;  // one line for logs and benchmark context
};

// Probed on first use (about 50 ms the first time titan runs on a machine without a rated clock:
// the measurement), then cached for the process; thread-safe.
const CpuInfo& cpu_info();
// A fresh probe (tests: the figure must not move between probes); everything else uses cpu_info().
CpuInfo probe_cpu();
// The FLOP/cycle rates and bf16_dot_beats_fma from the vendor, family and ISA flags (the table
// above): probe_cpu calls it; tests call it on made-up CPUs.
void assign_flop_rates(CpuInfo& info);

// The instruction-set tiers of the hand-vectorised kernels (attention, cross-entropy), lowest
// first. A kernel runs the highest tier it has at or below kernel_isa(); where the compiler
// vectorises plain loops (target_clones), the loader picks instead and this cap does not apply.
//   kPortable   plain loops, baseline x86-64
//   kAvx2       AVX2 + FMA, 8 f32 lanes (Zen 1-3, Intel since Haswell)
//   kAvx512     AVX-512 F/BW/DQ/VL, 16 f32 lanes (Zen4, Intel Xeon since Skylake)
//   kAvx512Bf16 AVX-512 plus the AVX512-BF16 dot product (Zen4, Sapphire Rapids)
//   kAmx        all of that plus AMX bf16 tiles that Linux lets this process use (Sapphire Rapids
//               and later Xeons; CpuInfo::amx_usable)
enum class KernelIsa { kPortable, kAvx2, kAvx512, kAvx512Bf16, kAmx };
// The top tier: a cap at it is no cap.
constexpr KernelIsa kHighestKernelIsa = KernelIsa::kAmx;
const char* kernel_isa_name(KernelIsa isa);  // "portable", "avx2", "avx512", "avx512_bf16", "amx"
// The best tier this CPU runs, lowered to the cap of limit_kernel_isa (at start: the environment's
// TITAN_KERNEL_ISA, a tier name; an unknown name is an error naming the variable).
KernelIsa kernel_isa();
// The best tier this CPU runs, whatever the cap.
KernelIsa cpu_kernel_isa();
// Testing hook: caps the tier every intrinsic kernel uses, so that each tier is checked on any
// machine that has it. kHighestKernelIsa lifts the cap. Set it while no kernel is running.
void limit_kernel_isa(KernelIsa cap);

}  // namespace titan::cpu
