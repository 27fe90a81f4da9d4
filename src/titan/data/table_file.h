#pragma once
// A dataset file read at offsets, as the table formats (Parquet, Arrow IPC) are read: by their
// footers and the offsets these give, not front to back. Every error names the file.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace titan::data {

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
