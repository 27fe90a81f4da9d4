#pragma once
// FNV-1a, 64 bits: the same value on every compiler, standard library and run (std::hash promises
// none of that), for what must not change between runs or machines: parameter seeds, config and
// machine fingerprints, the batch hash of a step.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace titan {

constexpr uint64_t kFnv1aStart = 1469598103934665603ull;
constexpr uint64_t kFnv1aPrime = 1099511628211ull;

// Continues the hash `h` over `n` bytes (start with kFnv1aStart).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnv1aStart) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aStart) { return fnv1a(s.data(), s.size(), h); }

}  // namespace titan
