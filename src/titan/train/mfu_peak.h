#pragma once
// The denominator of MFU: a figure fixed per machine so that MFU compares runs.
#include <string>

#include "titan/core/device.h"
#include "titan/core/dtype.h"

namespace titan::train {

struct MfuPeak {
  double tflops = 0;   // 0: unknown (a GPU the backend's table lacks); the metrics then report no MFU
  std::string source;  // "metrics.peak_tflops", the CPU formula with where its clock comes from, ...
};

// `peak_tflops_override` (metrics.peak_tflops) when > 0, else the device's peak for matmuls in
// `compute_dtype`: on the CPU cores x GHz x FLOP/cycle (backend/cpu/cpu_info.h says where each factor
// comes from); on another device what its services report (0 when unknown, `source` saying how to
// give one).
MfuPeak mfu_peak(double peak_tflops_override, Device device, DType compute_dtype);

}  // namespace titan::train
