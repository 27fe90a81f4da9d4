#include "titan/data/text_stream.h"

#include <vector>
#include <zlib.h>

#include "titan/core/check.h"

namespace titan::data {
namespace fs = std::filesystem;

struct TextStream::Gzip {
  z_stream z{};
  std::vector<unsigned char> in = std::vector<unsigned char>(1 << 18);
  uint64_t consumed = 0;     // compressed bytes read from the file before `in`'s current chunk
  bool member_end = false;   // the last inflate() finished a gzip member (another may follow)
  bool done = false;
  Gzip() {
    // 15 + 32: a gzip (or zlib) header, detected; the largest window.
    TITAN_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, "dataset: zlib cannot initialise");
  }
  ~Gzip() { inflateEnd(&z); }
  uint64_t compressed_offset() const { return consumed - z.avail_in; }
};

TextStream::TextStream() = default;
TextStream::~TextStream() { close(); }

bool TextStream::is_gzip(const fs::path& path) { return path.extension() == ".gz"; }

fs::path TextStream::uncompressed_name(const fs::path& path) {
  return is_gzip(path) ? path.parent_path() / path.stem() : path;
}

void TextStream::open(const fs::path& path, uint64_t offset) {
  close();
  path_ = path;
  file_ = std::fopen(path.c_str(), "rb");
  TITAN_CHECK(file_, "dataset: cannot open ", path);
  if (!is_gzip(path)) {
    TITAN_CHECK(std::fseek(file_, long(offset), SEEK_SET) == 0, "dataset: cannot seek to byte ", offset, " of ", path);
    return;
  }
  gzip_ = std::make_unique<Gzip>();
  std::vector<char> skip(1 << 16);
  for (uint64_t left = offset; left > 0;) {
    size_t got = read(skip.data(), size_t(std::min<uint64_t>(left, skip.size())));
    TITAN_CHECK(got > 0, "dataset: ", path, " decompresses to fewer than ", offset,
                " bytes: the saved position does not belong to this file");
    left -= got;
  }
}

void TextStream::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
  gzip_.reset();
}

size_t TextStream::read(char* out, size_t n) {
  if (!gzip_) {
    size_t got = std::fread(out, 1, n, file_);
    TITAN_CHECK(!std::ferror(file_), "dataset: read error in ", path_);
    return got;
  }
  return inflate_into(out, n);
}

size_t TextStream::inflate_into(char* out, size_t n) {
  Gzip& g = *gzip_;
  g.z.next_out = reinterpret_cast<unsigned char*>(out);
  g.z.avail_out = unsigned(n);
  while (g.z.avail_out > 0 && !g.done) {
    if (g.z.avail_in == 0) {
      size_t got = std::fread(g.in.data(), 1, g.in.size(), file_);
      TITAN_CHECK(!std::ferror(file_), "dataset: read error in ", path_);
      if (got == 0) {
        TITAN_CHECK(g.member_end, "dataset: ", path_, " is truncated: its gzip stream ends early, at compressed byte ",
                    g.consumed);
        g.done = true;
        break;
      }
      g.consumed += got;
      g.z.next_in = g.in.data();
      g.z.avail_in = unsigned(got);
    }
    if (g.member_end) {  // more bytes after a finished member: the next member (concatenated gzip)
      TITAN_CHECK(inflateReset(&g.z) == Z_OK, "dataset: zlib cannot reset for ", path_);
      g.member_end = false;
    }
    int rc = inflate(&g.z, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      g.member_end = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      TITAN_FAIL("dataset: ", path_, " is not valid gzip data at compressed byte ", g.compressed_offset(), ": ",
                 g.z.msg ? g.z.msg : zError(rc));
    }
  }
  return n - g.z.avail_out;
}

}  // namespace titan::data
