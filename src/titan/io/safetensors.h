#pragma once
// safetensors files: a validating mmap reader and an atomic writer. Works on raw bytes, a DType and
// a shape so it sits below the Tensor class. Format rules enforced: docs/safetensors.md.
//
// File layout: u64 little-endian N | N bytes of UTF-8 JSON header (space padded) | data.
// Header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}, ...}; offsets are relative to the start of data.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/io/atomic_file.h"

namespace titan::io {

// Largest header accepted; the reference implementation uses the same bound. It keeps a corrupt
// length field from making us parse (or allocate) gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) tensor
  size_t offset_begin;         // byte offsets relative to the start of the data section
  size_t offset_end;
  // Points into the mapping (no copy). Only 8-byte aligned when the writer padded the header to 8
  // bytes and the offsets are multiples of the element size (true for titan's and torch's files);
  // check alignment before reinterpreting, or memcpy.
  const std::byte* data;

  size_t nbytes() const { return offset_end - offset_begin; }
  int64_t numel() const;
};

using Metadata = std::map<std::string, std::string>;

// The result of validating a whole file image. Pointers refer into the bytes that were parsed.
struct ParsedSafetensors {
  std::vector<TensorInfo> tensors;  // in data order (ascending offset_begin)
  Metadata metadata;                // the "__metadata__" map; empty when absent
  uint64_t header_bytes = 0;        // N
};

// Validates a complete file image; throws titan::Error naming `origin` (a path, for messages), the
// tensor or field, and the rule broken. This is the single parser: the reader, the fuzz target and
// the tests all go through it.
ParsedSafetensors parse_safetensors(std::span<const std::byte> file, std::string_view origin);

// A read-only memory-mapped safetensors file. Movable; the mapping lives until the object and every
// keep_alive() handle are gone, so tensors may alias the mapped bytes without copying.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  // Not copyable: index_ holds views into this object's names (share keep_alive() instead).
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const TensorInfo& at(std::string_view name) const;    // throws naming the file and the tensor
  const std::vector<TensorInfo>& tensors() const { return parsed_.tensors; }
  const Metadata& metadata() const { return parsed_.metadata; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  uint64_t header_bytes() const { return parsed_.header_bytes; }

  // Shares ownership of the mapping, for storage that aliases TensorInfo::data.
  std::shared_ptr<const void> keep_alive() const { return mapping_; }
  // Asks the kernel to read the whole file ahead (MADV_WILLNEED); worth it before loading every
  // tensor, wasteful when only a few are needed.
  void prefetch() const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  uint64_t size_ = 0;
  std::shared_ptr<const void> mapping_;
  ParsedSafetensors parsed_;
  std::unordered_map<std::string_view, size_t> index_;  // views into parsed_.tensors[i].name
};

// One tensor to write. `data` holds numel elements of `source_dtype` (default: `dtype`), C-contiguous.
// When source_dtype differs it is converted while writing, in small chunks (no full copy):
// F32 -> BF16/F16 round to nearest even; BF16/F16 -> F32 are exact.
struct TensorWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  std::optional<DType> source_dtype = std::nullopt;
  // With `data` null: called once, when the writer reaches this tensor (tensors are written in
  // order), for the bytes `data` would hold; they need stay valid only until the next tensor's are
  // asked for. Tensors that are never in memory all at once stream this way (an export of experts
  // split over ranks receives them a layer at a time).
  std::function<const void*()> fetch = nullptr;
};

// Writes tensors in the given order, header space-padded to a multiple of 8 bytes and
// "__metadata__" = `metadata` plus {"format": "pt"} (unless the caller sets "format"). Atomic: the
// file appears complete or not at all. Returns the file size. `how`: around the page cache or
// through it, and who sees the bytes as they are written (a checkpoint's checksum and progress line).
uint64_t write_safetensors(const std::filesystem::path& path, std::span<const TensorWrite> tensors,
                           const Metadata& metadata = {}, const FileWriting& how = {});

// Byte size a TensorWrite occupies in the file (numel x dtype_size(dtype)); throws on overflow.
uint64_t tensor_write_bytes(const TensorWrite& t);

}  // namespace titan::io
