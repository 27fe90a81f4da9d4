#include "titan/data/table_file.h"

#include <cerrno>
#include <cstring>

#include "titan/core/check.h"

namespace titan::data {

TableFile::TableFile(const std::filesystem::path& path) : path_(path) {
  errno = 0;
  file_ = std::fopen(path_.c_str(), "rb");
  if (!file_) fail(std::string("cannot be opened: ") + (errno ? std::strerror(errno) : "unknown error"));
  std::error_code ec;
  size_ = std::filesystem::file_size(path_, ec);
  if (ec) {
    std::fclose(file_);
    fail("cannot be sized: " + ec.message());
  }
}

TableFile::~TableFile() {
  std::fclose(file_);
}

std::string too_many_row_bytes(uint64_t bytes) {
  return "its strings add up to " + std::to_string(bytes) + " bytes or more, past the " +
         std::to_string(kMaxRowBytes >> 30) +
         " GiB titan assembles into one row (no document is that large; a file can reach it by naming one "
         "string many times): split the document into smaller rows, or leave the row out";
}

void TableFile::fail(const std::string& what) const {
  TITAN_FAIL("dataset: ", path_.string(), ": ", what);
}

void TableFile::read_at(uint64_t offset, void* out, size_t n) const {
  if (offset > size_ || n > size_ - offset)
    fail("a read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
         " runs past the end of the " + std::to_string(size_) + "-byte file (truncated?)");
  if (n == 0) return;
  errno = 0;
  if (fseeko(file_, off_t(offset), SEEK_SET) != 0 || std::fread(out, 1, n, file_) != n)
    fail(std::string("read error at byte ") + std::to_string(offset) + ": " +
         (errno ? std::strerror(errno) : "short read"));
}

}  // namespace titan::data
