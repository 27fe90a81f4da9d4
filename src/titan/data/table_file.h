#pragma once
// A dataset file read at offsets, as the table formats (Parquet, Arrow IPC) are read: by their
// footers and the offsets these give, not front to back. Every error names the file.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace titan::data {

// The limits both table readers hold a file to, so that a small forged file claims no memory its
// bytes do not back. A row assembled as JSON holds at most 2^24 values (leaf entries in Parquet,
// JSON values in Arrow IPC): a conversation of 16 million strings is no document to train on.
inline constexpr uint64_t kMaxRowValues = uint64_t(1) << 24;
// A row holds at most 1 GiB of strings: the sum of the lengths of the string values copied into it,
// counted before they are copied (a Parquet row's values page by page, an Arrow row's all at once).
// Without it a small file assembles a row of any size: a Parquet row may name one dictionary string
// (or one DELTA_BYTE_ARRAY prefix, page after page) thousands of times, an Arrow row point thousands
// of string views at the same bytes: 10,000 references to a 1 MiB string are 10 GiB from 1 MiB.
// No document is that large (a whole book is a few MiB), and a row of 1 GiB already takes a few GiB
// as it is assembled, rendered and tokenized. A text column's one value per row is held to it too;
// before that the page or buffer holding it bounds it (docs/data.md). Files other than these tables
// (JSON Lines, CSV, plain text split by training.text_split) are not read through these readers.
inline constexpr uint64_t kMaxRowBytes = uint64_t(1) << 30;
// The rule a row breaks whose strings reach `bytes`, past kMaxRowBytes, and what to do: as both
// readers say it, after the file, the column and the row.
std::string too_many_row_bytes(uint64_t bytes);
// What `stored` compressed bytes are believed to unpack to: 1024 times them plus 1 MiB. Snappy and LZ4
// compress far less than 1024:1, deflate (gzip) at most about 1032:1, which the 1 MiB allows up to
// 129 MiB; zstd and Brotli go further only on one pattern repeated over megabytes.
inline uint64_t max_unpacked_bytes(uint64_t stored) {
  return 1024 * stored + (uint64_t(1) << 20);
}

class TableFile {
 public:
  explicit TableFile(const std::filesystem::path& path);  // an error when it cannot be opened or sized
  ~TableFile();
  TableFile(const TableFile&) = delete;
  TableFile& operator=(const TableFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  // `n` bytes at `offset` into `out`; a read past the end is an error saying the file may be truncated.
  void read_at(uint64_t offset, void* out, size_t n) const;
  // Throws "dataset: FILE: what".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace titan::data
