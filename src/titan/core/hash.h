#pragma once
// FNV-1a, 64 bits: the same value on every compiler, standard library and run (std::hash promises
// none of that), for what must not change between runs or machines: parameter seeds, config and
// machine fingerprints, the batch hash of a step.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
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

// A hash as titan writes it in files and file names: 16 lowercase hex digits.
inline std::string hash_hex(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The checksum of a run of bytes fed in pieces of any size: FNV-1a's basis and prime over its
// 8-byte little-endian words (8x fewer multiplies than bytes), its last (length % 8) bytes byte by
// byte. What checkpoint manifests record of each file (train::file_checksum), computable as the
// file is written (io::AtomicFile) instead of reading it back.
class WordChecksum {
 public:
  explicit WordChecksum(uint64_t basis = kFnv1aStart) : h_(basis) {}
  void update(const void* data, size_t n);
  uint64_t value() const { return fnv1a(tail_, tail_bytes_, h_); }  // of the bytes so far

 private:
  uint64_t h_;
  unsigned char tail_[8] = {};  // bytes of the word not yet complete
  size_t tail_bytes_ = 0;
};

inline void WordChecksum::update(const void* data, size_t n) {
  if (n == 0) return;  // data may be null
  const auto* p = static_cast<const unsigned char*>(data);
  auto word = [this](const unsigned char* w) {
    uint64_t x;
    std::memcpy(&x, w, 8);
    h_ = (h_ ^ x) * kFnv1aPrime;
  };
  if (tail_bytes_ > 0) {  // complete the word begun by the last piece
    const size_t k = n < 8 - tail_bytes_ ? n : 8 - tail_bytes_;
    std::memcpy(tail_ + tail_bytes_, p, k);
    tail_bytes_ += k;
    p += k;
    n -= k;
    if (tail_bytes_ < 8) return;
    word(tail_);
    tail_bytes_ = 0;
  }
  for (; n >= 8; p += 8, n -= 8) word(p);
  std::memcpy(tail_, p, n);
  tail_bytes_ = n;
}

}  // namespace titan
