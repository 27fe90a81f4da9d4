#pragma once
// FNV-1a, 64 bits: the same value on every compiler, standard library and run (std::hash promises
// none of that), for what must not change between runs or machines: parameter seeds, config and
// machine fingerprints, the batch hash of a step.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace titan {

// FNV's 64-bit offset basis (0xcbf29ce484222325) and prime: any FNV-1a tool reproduces the hashes
// titan records (tensor checksums of an export, the batch hash).
constexpr uint64_t kFnv1aStart = 14695981039346656037ull;
constexpr uint64_t kFnv1aPrime = 1099511628211ull;
// The name files record beside hashes that start from kFnv1aStart ("hash": "fnv1a64").
constexpr const char* kFnv1aName = "fnv1a64";
// Until 2026-12-01 titan started from a basis one digit short of FNV's. Checkpoint manifests,
// export checksums and dataset fingerprints written then name no hash; they are verified with it.
constexpr uint64_t kFnv1aStartBefore20261201 = 1469598103934665603ull;

// The basis of the hashes a file records under `name` ("": it names none, it was written before
// 2026-12-01); nullopt for a name this titan does not know.
inline std::optional<uint64_t> fnv1a_basis_named(std::string_view name) {
  if (name.empty()) return kFnv1aStartBefore20261201;
  if (name == kFnv1aName) return kFnv1aStart;
  return std::nullopt;
}

// Continues the hash `h` over `n` bytes (start with kFnv1aStart).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnv1aStart) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aStart) { return fnv1a(s.data(), s.size(), h); }

}  // namespace titan
