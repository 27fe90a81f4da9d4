#pragma once
// The bytes of one dataset file, read forward in chunks: a plain file as it is, a gzip file (name
// ending in .gz) or a zstd file (.zst) decompressed on the fly with zlib or libzstd, so none is
// ever held whole in memory. Offsets count the bytes the reader sees (decompressed ones for a
// compressed file), so a saved position resumes exactly inside a compressed shard: opening at an
// offset seeks in a plain file and decompresses and discards up to it in a compressed one (neither
// format has random access).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace titan::data {

// Owns its open file (and decompressor state), so it is not copyable.
class TextStream {
 public:
  TextStream();
  ~TextStream();  // closes the file

  // Opens `path` positioned at byte `offset` of its (decompressed) content; an offset past
  // the end is an error naming the file.
  void open(const std::filesystem::path& path, uint64_t offset);
  void close();
  bool is_open() const { return file_ != nullptr; }
  // Up to `n` bytes into `out`; 0 at the end. A corrupted or truncated compressed file is an
  // error naming the file, the format and the compressed byte where it went wrong.
  size_t read(char* out, size_t n);

  // A file's name without its compression suffix (".gz", ".zst"): what names its format.
  static std::filesystem::path uncompressed_name(const std::filesystem::path& path);

  struct Decompressor;  // gzip or zstd, fed from the open file (text_stream.cpp)

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Decompressor> decompressor_;  // set for compressed files
};

}  // namespace titan::data
