#pragma once
// Writing gzip and zstd files for the compressed-dataset tests (zlib as `gzip` writes them, libzstd
// as `zstd` does: one frame with its checksum).
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <string>

namespace titan::testing {

// `bytes` as one gzip member.
inline std::string gzip_bytes(const std::string& bytes) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);  // +16: gzip wrapper
  std::string out(deflateBound(&z, bytes.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = uInt(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// `bytes` as one zstd frame (content size and checksum recorded, as the zstd tool writes them).
inline std::string zstd_bytes(const std::string& bytes, int level = 3) {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1);
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const size_t n = ZSTD_compress2(ctx, out.data(), out.size(), bytes.data(), bytes.size());
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  ZSTD_freeCCtx(ctx);
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out;
}

}  // namespace titan::testing
