#include "titan/train/mfu_peak.h"

#include "titan/core/device_services.h"

#include "titan/backend/cpu/cpu_info.h"

namespace titan::train {

MfuPeak mfu_peak(double peak_tflops_override, Device device, DType compute_dtype) {
  if (peak_tflops_override > 0) return {peak_tflops_override, "metrics.peak_tflops"};
  if (device != Device::CPU) {
    const DeviceServices& dev = device_services(device);
    const double peak = dev.peak_flops(compute_dtype);
    if (peak <= 0)
      return {0, "unknown for " + dev.description() + " in " + std::string(dtype_name(compute_dtype)) +
                     ": set metrics.peak_tflops (its dense TFLOP/s) for MFU"};
    return {peak / 1e12, dev.description() + " (its datasheet)"};
  }
  const auto& cpu = cpu::cpu_info();
  return {cpu.peak_flops(compute_dtype) / 1e12, cpu.peak_formula(compute_dtype)};
}

}  // namespace titan::train
