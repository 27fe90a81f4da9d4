#pragma once
// The bytes of one dataset file, read forward in chunks: a plain file as it is, a gzip file
// (name ending in .gz) decompressed on the fly with zlib, so neither is ever held whole in memory.
// Offsets count the bytes the reader sees (decompressed ones for gzip), so a saved position
// resumes exactly inside a compressed shard: opening at an offset seeks in a plain file and
// decompresses and discards up to it in a gzip file (gzip has no random access).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace titan::data {

// Owns its open file (and zlib state), so it is not copyable.
class TextStream {
 public:
  TextStream();
  ~TextStream();  // closes the file

  // Opens `path` positioned at byte `offset` of its (decompressed) content; an offset past
  // the end is an error naming the file.
  void open(const std::filesystem::path& path, uint64_t offset);
  void close();
  bool is_open() const { return file_ != nullptr; }
  // Up to `n` bytes into `out`; 0 at the end. A corrupted or truncated gzip file is an error
  // naming the file and the compressed byte where it went wrong.
  size_t read(char* out, size_t n);

  // Whether `path` names a gzip file (".gz"), and its name without that suffix (for the format).
  static bool is_gzip(const std::filesystem::path& path);
  static std::filesystem::path uncompressed_name(const std::filesystem::path& path);

 private:
  size_t inflate_into(char* out, size_t n);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  struct Gzip;
  std::unique_ptr<Gzip> gzip_;  // set for gzip files
};

}  // namespace titan::data
