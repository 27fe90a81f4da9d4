#pragma once
#include <cstdint>
#include <string_view>

namespace titan {

enum class Device : uint8_t { CPU, CUDA };

inline std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

}  // namespace titan
