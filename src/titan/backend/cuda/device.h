#pragma once
// Device queries of the CUDA backend (built only with it: callers guard on TITAN_HAVE_CUDA). The
// device services (cuda_services.h) use them for their description.
#include <string>
#include <string_view>

#include "titan/core/dtype.h"

namespace titan::cuda {

int device_count();              // 0 when the driver or a GPU is missing (never throws)
std::string device_summary(int device);  // "NVIDIA H200, sm_90, 139.8 GiB"
// "runtime 12.4, driver 12.6" (the driver part reads "none" without a driver; never throws).
std::string runtime_versions();

// The dense peak of NVIDIA's datasheet for `dtype` matmuls in FLOP/s (the MFU denominator): the
// tensor cores' for bf16/f16, the CUDA cores' for f32 (titan's f32 GEMMs run with TF32 off), found
// by the name the driver gives the device ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL"); 0 for a
// GPU or a dtype the table lacks, so that MFU asks for metrics.peak_tflops instead of dividing by a
// guess (so is a MIG slice: its part's name, a share of its SMs). The datasheets' figures
// (torchtitan's table, tools/utils.py get_peak_flops, rounds the same ones: 989, 835, 756, ...).
double datasheet_peak_flops(std::string_view device_name, DType dtype);

}  // namespace titan::cuda
