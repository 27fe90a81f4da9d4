#include "titan/data/text_stream.h"

#include <zlib.h>
#include <zstd.h>

#include <cctype>
#include <vector>

#include "titan/core/check.h"

namespace titan::data {
namespace fs = std::filesystem;

// A decompressor reads compressed chunks from the file as it needs them.
struct TextStream::Decompressor {
  virtual ~Decompressor() = default;
  // Up to `n` decompressed bytes into `out`; 0 at the end of the file's last frame or member.
  virtual size_t read(std::FILE* file, const fs::path& path, char* out, size_t n) = 0;

 protected:
  // The next compressed chunk into `in` (its size; 0 at the end of the file).
  size_t refill(std::FILE* file, const fs::path& path) {
    const size_t got = std::fread(in.data(), 1, in.size(), file);
    TITAN_CHECK(!std::ferror(file), "dataset: read error in ", path);
    consumed += got;
    return got;
  }
  std::vector<unsigned char> in = std::vector<unsigned char>(1 << 18);
  uint64_t consumed = 0;  // compressed bytes read from the file so far (`in`'s current chunk included)
};

namespace {

// gzip (RFC 1952) with zlib; several members in one file (`cat a.gz b.gz`, bgzip) read as one stream.
// Zero bytes after a member are padding (tape blocks, preallocated files), skipped as GNU gzip and
// Python's gzip skip them; anything else there must be another member.
struct Gzip final : TextStream::Decompressor {
  z_stream z{};
  bool member_end = false;  // the last inflate() finished a member (another may follow)
  bool done = false;
  Gzip() {
    // 15 + 32: a gzip (or zlib) header, detected; the largest window.
    TITAN_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, "dataset: zlib cannot initialise");
  }
  ~Gzip() override { inflateEnd(&z); }
  uint64_t compressed_offset() const { return consumed - z.avail_in; }

  size_t read(std::FILE* file, const fs::path& path, char* out, size_t n) override {
    z.next_out = reinterpret_cast<unsigned char*>(out);
    z.avail_out = unsigned(n);
    while (z.avail_out > 0 && !done) {
      if (z.avail_in == 0) {
        const size_t got = refill(file, path);
        if (got == 0) {
          TITAN_CHECK(member_end, "dataset: ", path,
                      " is truncated: its gzip stream ends early, at compressed byte ", consumed);
          done = true;
          break;
        }
        z.next_in = in.data();
        z.avail_in = unsigned(got);
      }
      if (member_end) {  // more bytes after a finished member: padding, or the next member
        while (z.avail_in > 0 && *z.next_in == 0) {
          ++z.next_in;
          --z.avail_in;
        }
        if (z.avail_in == 0) continue;  // only zeros so far: the end of the file may follow
        TITAN_CHECK(inflateReset(&z) == Z_OK, "dataset: zlib cannot reset for ", path);
        member_end = false;
      }
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_end = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        TITAN_FAIL("dataset: ", path, " is not valid gzip data at compressed byte ", compressed_offset(),
                   ": ", z.msg ? z.msg : zError(rc));
      }
    }
    return n - z.avail_out;
  }
};

// zstd (RFC 8878) with libzstd's streaming decoder; several frames in one file (`cat a.zst b.zst`,
// zstd's multi-threaded output) read as one stream, skippable frames skipped.
struct Zstd final : TextStream::Decompressor {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ZSTD_inBuffer input{nullptr, 0, 0};
  size_t frame_left = 0;  // ZSTD_decompressStream's last result: 0 when a frame is decoded and flushed
  bool end_of_file = false, done = false;
  Zstd() {
    TITAN_CHECK(ctx, "dataset: libzstd cannot allocate a decompression context");
    // The format's largest window (2 GiB): files written with --long=31 read too.
    ZSTD_DCtx_setParameter(ctx, ZSTD_d_windowLogMax, 31);
  }
  ~Zstd() override { ZSTD_freeDCtx(ctx); }
  uint64_t compressed_offset() const { return consumed - (input.size - input.pos); }

  size_t read(std::FILE* file, const fs::path& path, char* out, size_t n) override {
    ZSTD_outBuffer output{out, n, 0};
    while (output.pos < n && !done) {
      if (input.pos == input.size && !end_of_file) {
        const size_t got = refill(file, path);
        end_of_file = got == 0;
        input = {in.data(), got, 0};
      }
      if (end_of_file && frame_left == 0) {
        TITAN_CHECK(consumed > 0, "dataset: ", path, " is empty: a zstd file holds at least one frame");
        done = true;
        break;
      }
      // At the end of the file the decoder may still hold decoded bytes: it flushes them with no
      // input; a frame that then still wants bytes is cut short.
      const size_t before = output.pos;
      const size_t rc = ZSTD_decompressStream(ctx, &output, &input);
      // libzstd reports from the start of the frame it was decoding (a checksum mismatch shows only
      // at the frame's end): the fault lies at or after that byte.
      if (ZSTD_isError(rc))
        TITAN_FAIL("dataset: ", path, " is not valid zstd data in the frame at compressed byte ",
                   compressed_offset(), " (or after it): ", ZSTD_getErrorName(rc));
      frame_left = rc;
      TITAN_CHECK(!end_of_file || frame_left == 0 || output.pos > before, "dataset: ", path,
                  " is truncated: its zstd stream ends early, at compressed byte ", consumed);
    }
    return output.pos;
  }
};

enum class Compression { None, Gzip, Zstd };

Compression compression_of(const fs::path& path) {
  std::string ext = path.extension().string();  // ".gz" or ".GZ" alike
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".gz") return Compression::Gzip;
  if (ext == ".zst") return Compression::Zstd;
  return Compression::None;
}

}  // namespace

TextStream::TextStream() = default;
TextStream::~TextStream() { close(); }

fs::path TextStream::uncompressed_name(const fs::path& path) {
  return compression_of(path) == Compression::None ? path : path.parent_path() / path.stem();
}

void TextStream::open(const fs::path& path, uint64_t offset) {
  close();
  path_ = path;
  file_ = std::fopen(path.c_str(), "rb");
  TITAN_CHECK(file_, "dataset: cannot open ", path);
  switch (compression_of(path)) {
    case Compression::None:
      TITAN_CHECK(std::fseek(file_, long(offset), SEEK_SET) == 0, "dataset: cannot seek to byte ", offset,
                  " of ", path);
      return;
    case Compression::Gzip:
      decompressor_ = std::make_unique<Gzip>();
      break;
    case Compression::Zstd:
      decompressor_ = std::make_unique<Zstd>();
      break;
  }
  std::vector<char> skip(1 << 16);
  for (uint64_t left = offset; left > 0;) {
    const size_t got = read(skip.data(), size_t(std::min<uint64_t>(left, skip.size())));
    TITAN_CHECK(got > 0, "dataset: ", path, " decompresses to fewer than ", offset,
                " bytes: the saved position does not belong to this file");
    left -= got;
  }
}

void TextStream::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
  decompressor_.reset();
}

size_t TextStream::read(char* out, size_t n) {
  if (decompressor_) return decompressor_->read(file_, path_, out, n);
  const size_t got = std::fread(out, 1, n, file_);
  TITAN_CHECK(!std::ferror(file_), "dataset: read error in ", path_);
  return got;
}

}  // namespace titan::data
