#include "titan/data/table_file.h"

#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

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

std::string past_counted_bytes(const char* load) {
  return "more than the " + std::to_string(kMaxCountedBytes >> 30) +
         " GiB titan decodes past that ratio at once for one " + load +
         " of a column (data that compresses past 1000:1 is one pattern repeated: write it in smaller " +
         load + "s)";
}

uint64_t zstd_decoded_size(const uint8_t* src, size_t n, uint64_t limit, std::string& error) {
  error.clear();
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) {
    error = "zstd cannot initialise";
    return 0;
  }
  // Any window, as ZSTD_decompress (which decodes the data once counted) accepts: the streaming
  // decoder's default refuses frames of windows past 128 MiB. Its window buffer is written only as
  // far as the data decodes.
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax,
                         ZSTD_dParam_getBounds(ZSTD_d_windowLogMax).upperBound);
  std::vector<uint8_t> scratch(size_t(64) << 10);
  ZSTD_inBuffer in{src, n, 0};
  uint64_t bytes = 0;
  size_t left = 0;  // ZSTD_decompressStream's last result: 0 once a frame is decoded and flushed
  while ((in.pos < in.size || left != 0) && bytes <= limit) {
    ZSTD_outBuffer out{scratch.data(), scratch.size(), 0};
    left = ZSTD_decompressStream(ctx.get(), &out, &in);
    if (ZSTD_isError(left)) {
      error = std::string("its zstd data is corrupt: ") + ZSTD_getErrorName(left);
      return bytes;
    }
    bytes += out.pos;
    if (left != 0 && in.pos == in.size && out.pos < out.size) {
      error = "its zstd data ends inside a frame";
      return bytes;
    }
  }
  return bytes;
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
