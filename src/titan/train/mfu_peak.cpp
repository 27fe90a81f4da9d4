#include "titan/train/mfu_peak.h"

#include "titan/backend/cpu/cpu_info.h"

namespace titan::train {

MfuPeak mfu_peak(double peak_tflops_override, DType compute_dtype) {
  if (peak_tflops_override > 0) return {peak_tflops_override, "metrics.peak_tflops"};
  const auto& cpu = cpu::cpu_info();
  return {cpu.peak_flops(compute_dtype) / 1e12, cpu.peak_formula(compute_dtype)};
}

}  // namespace titan::train
