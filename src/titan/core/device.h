#pragma once
// The devices a tensor can live on. `Meta` holds shapes, dtypes and byte counts but no data: a
// whole training step run on it gives the exact allocation profile and FLOPs of a model in
// milliseconds (see core/device_services.h and docs/kernels.md).
#include <cstdint>
#include <string_view>

namespace titan {

enum class Device : uint8_t { CPU, CUDA, Meta };

inline std::string_view device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::Meta: return "meta";
  }
  return "?";
}

}  // namespace titan
