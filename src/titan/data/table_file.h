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
// What `stored` compressed bytes are believed to unpack to before anything proves it: 1024 times
// them plus 1 MiB. A page or buffer whose header claims no more is allocated at that size and
// decoded into it at once; most data compresses far less (Snappy cannot pass 21.3:1, LZ4 255:1,
// deflate about 1030:1). A larger claim is not refused, for zstd and Brotli data of one pattern
// repeated (a document copied into every row of a page) goes to thousands to one: its data is first
// decoded through a small buffer, counting what it produces (zstd_decoded_size), and the claim is
// allocated only when the count equals it. So a forged claim allocates no more than this guess, or
// than its data really decodes to. A bound read from the codec's framing would not do:
// ZSTD_decompressBound believes a frame's declared content size, which is forged as easily as the
// header, allows 128 KiB for every 3-byte block header of a frame declaring none (a forged frame of
// empty blocks claims 40,000:1), and Brotli declares nothing at all.
inline uint64_t believed_unpacked_bytes(uint64_t stored) {
  return 1024 * stored + (uint64_t(1) << 20);
}
// What one column may hold at once of data past believed_unpacked_bytes (counted before it is
// allocated): a Parquet column's pages of one row group (every leaf's dictionary and current page), an
// Arrow IPC column's buffers of one record batch. Without it a few KB claim 2 GiB for each Parquet
// leaf at once (a valid page is at most 2^31 - 1 bytes, its header's sizes being int32s), and an
// Arrow buffer's int64 length any amount. 4 GiB: one leaf's largest dictionary and largest page
// together, which spares any column of one leaf, while valid data this compressible (one pattern
// repeated: a document copied into every row) is far smaller: pyarrow's page of 1024 rows of a 64 KiB
// document is 64 MiB, and writers end pages at about 1 MiB and record batches at thousands of rows.
// Data within believed_unpacked_bytes is not counted here: the stored bytes back it.
inline constexpr uint64_t kMaxCountedBytes = uint64_t(4) << 30;
// The rule a load breaks past kMaxCountedBytes, and what to do, `load` being "row group" or "record
// batch": "more than the 4 GiB titan decodes past that ratio at once for one `load` of a column (...)".
std::string past_counted_bytes(const char* load);
// What the zstd frames of `n` bytes at `src` decode to, counted through a 64 KiB buffer and stopped
// once past `limit` (the count is then more than `limit`); nothing the size of the output is held,
// only zstd's window, written no further than the data decodes. `error` says what is wrong with data
// that does not decode whole (empty when it does).
uint64_t zstd_decoded_size(const uint8_t* src, size_t n, uint64_t limit, std::string& error);

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
