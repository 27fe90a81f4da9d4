#pragma once
// The denominator of MFU: a figure fixed per machine so that MFU compares runs.
#include <string>

#include "titan/core/dtype.h"

namespace titan::train {

struct MfuPeak {
  double tflops = 0;
  std::string source;  // "metrics.peak_tflops", or the CPU formula with where its clock comes from
};

// `peak_tflops_override` (metrics.peak_tflops) when > 0, else the CPU's peak for matmuls in
// `compute_dtype`: cores x GHz x FLOP/cycle (backend/cpu/cpu_info.h says where each factor comes from).
MfuPeak mfu_peak(double peak_tflops_override, DType compute_dtype);

}  // namespace titan::train
