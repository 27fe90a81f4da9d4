#include "titan/data/parquet.h"

#include <brotli/decode.h>
#include <lz4.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/data/table_file.h"

// The layout read here is the Parquet format specification's (github.com/apache/parquet-format:
// Encodings.md, Compression.md and the Thrift definitions in parquet.thrift, whose field ids the
// readers below name).
namespace titan::data {
namespace fs = std::filesystem;

namespace {

// Something in the file breaks the format; the reader adds the file and where.
struct Corrupt {
  std::string what;
};
// A Thrift value runs past the bytes at hand: a page header is read again with more of them.
struct NeedMore {};

// ---------------------------------------------------------------------------------------------
// Thrift's compact protocol, the encoding of the footer and of every page header.

enum ThriftType : int {
  kTrue = 1,
  kFalse = 2,
  kByte = 3,
  kI16 = 4,
  kI32 = 5,
  kI64 = 6,
  kF64 = 7,  // a double
  kBinary = 8,
  kList = 9,
  kSet = 10,
  kMap = 11,
  kStruct = 12
};

class Thrift {
 public:
  Thrift(const uint8_t* data, size_t size) : begin_(data), p_(data), end_(data + size) {}
  size_t consumed() const { return size_t(p_ - begin_); }

  uint8_t byte() {
    if (p_ == end_) throw NeedMore{};
    return *p_++;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Corrupt{"a Thrift varint runs past 10 bytes"};
  }
  int64_t zigzag() {
    const uint64_t v = varint();
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  int32_t i32() {
    const int64_t v = zigzag();
    if (v < INT32_MIN || v > INT32_MAX) throw Corrupt{"a Thrift i32 out of range"};
    return int32_t(v);
  }
  int64_t i64() { return zigzag(); }
  std::string binary() {
    const uint64_t n = varint();
    if (n > uint64_t(end_ - p_)) throw NeedMore{};
    std::string s(reinterpret_cast<const char*>(p_), size_t(n));
    p_ += n;
    return s;
  }
  // A boolean struct field: its value is its type.
  static bool boolean(int type) { return type == kTrue; }

  // Calls field(id, type) for each field of the struct that starts here, up to its stop byte. The
  // callback reads the value or calls skip(type).
  template <class Field>
  void read_struct(Field&& field) {
    if (++depth_ > 64) throw Corrupt{"Thrift structs nested more than 64 deep"};
    int last = 0;
    while (true) {
      const uint8_t header = byte();
      if (header == 0) break;
      const int type = header & 0x0f, delta = header >> 4;
      const int id = delta ? last + delta : int(int16_t(zigzag()));
      last = id;
      field(id, type);
    }
    --depth_;
  }
  struct ListHeader {
    uint64_t size;
    int type;
  };
  ListHeader list() {
    const uint8_t h = byte();
    uint64_t size = h >> 4;
    if (size == 15) size = varint();
    if (size > uint64_t(end_ - p_)) throw NeedMore{};  // every element takes a byte at least
    return {size, h & 0x0f};
  }
  // Calls element() `size` times for the list that starts here, whose elements are `type`.
  template <class Element>
  void read_list(int expected_type, Element&& element) {
    const ListHeader h = list();
    if (h.size > 0 && h.type != expected_type)
      throw Corrupt{"a Thrift list holds type " + std::to_string(h.type) + " where the format has " +
                    std::to_string(expected_type)};
    for (uint64_t i = 0; i < h.size; ++i) element();
  }

  void skip(int type, bool in_list = false) {
    switch (type) {
      case kTrue:
      case kFalse:
        if (in_list) byte();  // a list's booleans are a byte each; a field's is its type
        return;
      case kByte:
        byte();
        return;
      case kI16:
      case kI32:
      case kI64:
        varint();
        return;
      case kF64:
        for (int i = 0; i < 8; ++i) byte();
        return;
      case kBinary: {
        const uint64_t n = varint();
        if (n > uint64_t(end_ - p_)) throw NeedMore{};
        p_ += n;
        return;
      }
      case kList:
      case kSet: {
        const ListHeader h = list();
        if (++depth_ > 64) throw Corrupt{"Thrift values nested more than 64 deep"};
        for (uint64_t i = 0; i < h.size; ++i) skip(h.type, true);
        --depth_;
        return;
      }
      case kMap: {
        const uint64_t n = varint();
        if (n == 0) return;
        const uint8_t kv = byte();
        if (++depth_ > 64) throw Corrupt{"Thrift values nested more than 64 deep"};
        for (uint64_t i = 0; i < n; ++i) {
          skip(kv >> 4, true);
          skip(kv & 0x0f, true);
        }
        --depth_;
        return;
      }
      case kStruct:
        read_struct([&](int, int t) { skip(t); });
        return;
      default:
        throw Corrupt{"unknown Thrift type " + std::to_string(type)};
    }
  }

 private:
  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The footer (parquet.thrift's FileMetaData), the parts a string column needs.

enum PhysicalType { kBoolean = 0, kInt32 = 1, kInt64 = 2, kFloat = 4, kDouble = 5, kByteArray = 6 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum Codec {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4 = 5,
  kZstd = 6,
  kLz4Raw = 7
};
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Encoding {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kBitPacked = 4,
  kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7,
  kRleDictionary = 8,
  kByteStreamSplit = 9
};

const char* physical_type_name(int t) {
  static const char* names[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? names[t] : "an unknown type";
}

std::string codec_name(int c) {
  static const char* names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? names[c] : "codec " + std::to_string(c);
}

std::string encoding_name(int e) {
  static const char* names[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? names[e] : "encoding " + std::to_string(e);
}

struct SchemaElement {
  int type = -1;  // physical type; -1 for a group
  int repetition = kRequired;
  std::string name;
  int num_children = 0;
  int converted_type = -1;
  int logical_type = 0;  // the LogicalType union's field id; 0 when absent
};

// What the logical annotation of a BYTE_ARRAY leaf makes of it: empty when it is text (STRING,
// ENUM, JSON, or no annotation: plain binary, which the text guard then judges).
std::string non_text_annotation(const SchemaElement& e) {
  switch (e.logical_type) {
    case 0:
    case 1:   // STRING
    case 4:   // ENUM
    case 12:  // JSON
      break;
    case 5:
      return "DECIMAL";
    case 13:
      return "BSON";
    case 14:
      return "UUID";
    default:
      return "logical type " + std::to_string(e.logical_type);
  }
  switch (e.converted_type) {
    case -1:
    case 0:   // UTF8
    case 4:   // ENUM
    case 19:  // JSON
      return "";
    case 5:
      return "DECIMAL";
    case 20:
      return "BSON";
    default:
      return "converted type " + std::to_string(e.converted_type);
  }
}

struct ChunkMeta {
  int type = -1;
  int codec = kUncompressed;
  int64_t num_values = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;
  std::vector<std::string> path;
  bool external = false;   // file_path: the chunk lives in another file
  bool encrypted = false;  // crypto_metadata / encrypted_column_metadata
};

struct RowGroup {
  int64_t num_rows = 0;
  std::vector<ChunkMeta> columns;
};

struct FileMeta {
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::string created_by;
};

SchemaElement read_schema_element(Thrift& t) {
  SchemaElement e;
  t.read_struct([&](int id, int type) {
    if (id == 1 && type == kI32)
      e.type = t.i32();
    else if (id == 3 && type == kI32)
      e.repetition = t.i32();
    else if (id == 4 && type == kBinary)
      e.name = t.binary();
    else if (id == 5 && type == kI32) {
      e.num_children = t.i32();
      if (e.num_children < 0)
        throw Corrupt{"a schema element with " + std::to_string(e.num_children) + " children"};
    } else if (id == 6 && type == kI32)
      e.converted_type = t.i32();
    else if (id == 10 && type == kStruct)
      t.read_struct([&](int kind, int kind_type) {  // a union: the one field set names the type
        e.logical_type = kind;
        t.skip(kind_type);
      });
    else
      t.skip(type);
  });
  return e;
}

ChunkMeta read_column_chunk(Thrift& t) {
  ChunkMeta c;
  t.read_struct([&](int id, int type) {
    if (id == 1 && type == kBinary) {
      c.external = !t.binary().empty();
    } else if (id == 3 && type == kStruct) {
      t.read_struct([&](int mid, int mtype) {
        if (mid == 1 && mtype == kI32)
          c.type = t.i32();
        else if (mid == 3 && mtype == kList)
          t.read_list(kBinary, [&] { c.path.push_back(t.binary()); });
        else if (mid == 4 && mtype == kI32)
          c.codec = t.i32();
        else if (mid == 5 && mtype == kI64)
          c.num_values = t.i64();
        else if (mid == 7 && mtype == kI64)
          c.total_compressed_size = t.i64();
        else if (mid == 9 && mtype == kI64)
          c.data_page_offset = t.i64();
        else if (mid == 11 && mtype == kI64)
          c.dictionary_page_offset = t.i64();
        else
          t.skip(mtype);
      });
    } else if (id == 8 || id == 9) {
      c.encrypted = true;
      t.skip(type);
    } else {
      t.skip(type);
    }
  });
  return c;
}

FileMeta read_file_meta(Thrift& t) {
  FileMeta m;
  t.read_struct([&](int id, int type) {
    if (id == 2 && type == kList) {
      t.read_list(kStruct, [&] { m.schema.push_back(read_schema_element(t)); });
    } else if (id == 3 && type == kI64) {
      m.num_rows = t.i64();
    } else if (id == 4 && type == kList) {
      t.read_list(kStruct, [&] {
        RowGroup g;
        t.read_struct([&](int gid, int gtype) {
          if (gid == 1 && gtype == kList)
            t.read_list(kStruct, [&] { g.columns.push_back(read_column_chunk(t)); });
          else if (gid == 3 && gtype == kI64)
            g.num_rows = t.i64();
          else
            t.skip(gtype);
        });
        m.row_groups.push_back(std::move(g));
      });
    } else if (id == 6 && type == kBinary) {
      m.created_by = t.binary();
    } else {
      t.skip(type);
    }
  });
  return m;
}

// A page header (parquet.thrift's PageHeader), the fields a reader acts on.
struct PageHeader {
  int type = -1;
  int32_t uncompressed_size = -1, compressed_size = -1;
  bool has_crc = false;
  uint32_t crc = 0;
  int32_t num_values = 0;  // values, nulls included (rows, for a flat column)
  int32_t num_rows = -1;   // v2
  int encoding = kPlain;
  int level_encoding = kRle;             // v1's definition levels
  int rep_level_encoding = kRle;         // v1's repetition levels
  int32_t def_bytes = 0, rep_bytes = 0;  // v2
  bool values_compressed = true;         // v2
};

PageHeader read_page_header(Thrift& t) {
  PageHeader h;
  t.read_struct([&](int id, int type) {
    if (id == 1 && type == kI32)
      h.type = t.i32();
    else if (id == 2 && type == kI32)
      h.uncompressed_size = t.i32();
    else if (id == 3 && type == kI32)
      h.compressed_size = t.i32();
    else if (id == 4 && type == kI32) {
      h.has_crc = true;
      h.crc = uint32_t(t.i32());
    } else if (id == 5 && type == kStruct) {  // DataPageHeader
      t.read_struct([&](int f, int ft) {
        if (f == 1 && ft == kI32)
          h.num_values = t.i32();
        else if (f == 2 && ft == kI32)
          h.encoding = t.i32();
        else if (f == 3 && ft == kI32)
          h.level_encoding = t.i32();
        else if (f == 4 && ft == kI32)
          h.rep_level_encoding = t.i32();
        else
          t.skip(ft);
      });
    } else if (id == 7 && type == kStruct) {  // DictionaryPageHeader
      t.read_struct([&](int f, int ft) {
        if (f == 1 && ft == kI32)
          h.num_values = t.i32();
        else if (f == 2 && ft == kI32)
          h.encoding = t.i32();
        else
          t.skip(ft);
      });
    } else if (id == 8 && type == kStruct) {  // DataPageHeaderV2
      t.read_struct([&](int f, int ft) {
        if (f == 1 && ft == kI32)
          h.num_values = t.i32();
        else if (f == 3 && ft == kI32)
          h.num_rows = t.i32();
        else if (f == 4 && ft == kI32)
          h.encoding = t.i32();
        else if (f == 5 && ft == kI32)
          h.def_bytes = t.i32();
        else if (f == 6 && ft == kI32)
          h.rep_bytes = t.i32();
        else if (f == 7 && (ft == kTrue || ft == kFalse))
          h.values_compressed = Thrift::boolean(ft);
        else
          t.skip(ft);
      });
    } else {
      t.skip(type);
    }
  });
  return h;
}

// ---------------------------------------------------------------------------------------------
// Value encodings.

// Bytes [p, end) as a bounded cursor.
struct Bytes {
  const uint8_t* p;
  const uint8_t* end;
  size_t left() const { return size_t(end - p); }
  void need(size_t n, const char* what) const {
    if (n > left()) throw Corrupt{std::string(what) + " runs past the end of the page"};
  }
  uint64_t uleb(const char* what) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1, what);
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Corrupt{std::string(what) + ": a varint runs past 10 bytes"};
  }
  int64_t zigzag(const char* what) {
    const uint64_t v = uleb(what);
    return int64_t(v >> 1) ^ -int64_t(v & 1);
  }
  uint32_t u32le(const char* what) {
    need(4, what);
    uint32_t v;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
  }
};

// Value i of a run of little-endian `width`-bit values packed from `base` (width <= 64).
uint64_t unpack(const uint8_t* base, int width, uint64_t i) {
  if (width == 0) return 0;
  uint64_t bit = i * uint64_t(width), v = 0;
  for (int got = 0; got < width;) {
    const uint8_t b = base[bit / 8];
    const int offset = int(bit % 8), take = std::min(8 - offset, width - got);
    v |= uint64_t((b >> offset) & ((1u << take) - 1)) << got;
    got += take;
    bit += uint64_t(take);
  }
  return v;
}

// `count` values of the RLE / bit-packed hybrid encoding (levels, dictionary indices) into `out`.
void decode_hybrid(Bytes& in, int width, size_t count, std::vector<uint32_t>& out, const char* what) {
  if (width < 0 || width > 32)
    throw Corrupt{std::string(what) + " has a bit width of " + std::to_string(width)};
  out.clear();
  out.reserve(std::min<size_t>(count, 1u << 16));  // a corrupt count must not allocate ahead
  const size_t value_bytes = size_t(width + 7) / 8;
  while (out.size() < count) {
    const uint64_t header = in.uleb(what);
    if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
      const uint64_t values = (header >> 1) * 8;
      const size_t take = size_t(std::min<uint64_t>(values, count - out.size()));
      // The last run may stop after the values it holds (writers differ on padding it).
      const size_t bytes = (take * size_t(width) + 7) / 8;
      in.need(bytes, what);
      for (size_t i = 0; i < take; ++i) out.push_back(uint32_t(unpack(in.p, width, i)));
      const size_t run_bytes = size_t((header >> 1) * uint64_t(width));
      in.p += std::min(run_bytes, in.left());
    } else {  // RLE: one value repeated (header >> 1) times
      const uint64_t repeat = header >> 1;
      in.need(value_bytes, what);
      uint32_t v = 0;
      for (size_t b = 0; b < value_bytes; ++b) v |= uint32_t(in.p[b]) << (8 * b);
      in.p += value_bytes;
      if (repeat == 0) throw Corrupt{std::string(what) + " has an empty run"};
      const size_t take = size_t(std::min<uint64_t>(repeat, count - out.size()));
      out.insert(out.end(), take, v);
    }
  }
}

// DELTA_BINARY_PACKED integers (the lengths of the DELTA_* byte-array encodings) into `out`.
// The page says how many values it holds (`expected`): a header claiming another count is corrupt.
void decode_delta_binary_packed(Bytes& in, size_t expected, std::vector<int64_t>& out, const char* what) {
  const uint64_t block_size = in.uleb(what), miniblocks = in.uleb(what), total = in.uleb(what);
  int64_t value = in.zigzag(what);
  // Writers use blocks of 128 to 1024 values; a cap keeps the sizes below from overflowing.
  if (block_size == 0 || block_size > (1u << 16) || block_size % 128 != 0 || miniblocks == 0 ||
      block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0)
    throw Corrupt{std::string(what) + " has blocks of " + std::to_string(block_size) + " values in " +
                  std::to_string(miniblocks) +
                  " miniblocks (the format needs a multiple of 128 in miniblocks of "
                  "a multiple of 32)"};
  if (total != expected)
    throw Corrupt{std::string(what) + " hold " + std::to_string(total) + " values where the page has " +
                  std::to_string(expected)};
  out.clear();
  out.reserve(size_t(std::min<uint64_t>(total, 1u << 16)));
  if (total == 0) return;
  out.push_back(value);
  const uint64_t per_miniblock = block_size / miniblocks;
  while (out.size() < total) {
    const int64_t min_delta = in.zigzag(what);
    in.need(size_t(miniblocks), what);
    const uint8_t* widths = in.p;
    in.p += miniblocks;
    for (uint64_t m = 0; m < miniblocks && out.size() < total; ++m) {
      const int width = widths[m];
      if (width > 64)
        throw Corrupt{std::string(what) + " has a miniblock " + std::to_string(width) + " bits wide"};
      const size_t bytes = size_t(per_miniblock * uint64_t(width) / 8);
      in.need(bytes, what);
      const size_t take = size_t(std::min<uint64_t>(per_miniblock, total - out.size()));
      for (size_t i = 0; i < take; ++i) {
        // Wrapping arithmetic, as the format specifies.
        value = int64_t(uint64_t(value) + uint64_t(min_delta) + unpack(in.p, width, i));
        out.push_back(value);
      }
      in.p += bytes;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Page decompression, into exactly `size` bytes.

Corrupt wrong_size(int codec, size_t got, size_t size) {
  return Corrupt{"its " + codec_name(codec) + " data decompresses to " + std::to_string(got) +
                 " bytes where the page header says " + std::to_string(size)};
}

// The size the compressed data declares itself, where its codec records one (Snappy always, a zstd
// frame when its writer knew it), against the page header's `size`: checked before the page is
// allocated, so a header that lies is refused without the memory it claims.
void check_declared_size(int codec, const uint8_t* src, size_t n, size_t size) {
  if (codec == kSnappy) {
    size_t length = 0;
    if (snappy_uncompressed_length(reinterpret_cast<const char*>(src), n, &length) != SNAPPY_OK)
      throw Corrupt{"its Snappy data is corrupt"};
    if (length != size) throw wrong_size(codec, length, size);
  } else if (codec == kZstd) {
    // The first frame's: a page of several frames holds at least it. (Data that is no zstd frame at
    // all is named by the decoder.)
    const unsigned long long frame = ZSTD_getFrameContentSize(src, n);
    if (frame != ZSTD_CONTENTSIZE_UNKNOWN && frame != ZSTD_CONTENTSIZE_ERROR && frame > size)
      throw Corrupt{"its zstd frame declares " + std::to_string(frame) +
                    " bytes where the page header says " + std::to_string(size)};
  }
}

// What `n` bytes of `codec` data at `src` decode to, counted through a small buffer and stopped once
// past `limit` (the count is then more than `limit`): the proof a page claiming more than
// believed_unpacked_bytes gives before it is allocated (table_file.h says why). Snappy and LZ4 data
// cannot reach such a claim (their most is 64 bytes for a copy of 3 bytes, 255 bytes for each byte
// of an LZ4 match length), so it is refused for them uncounted.
uint64_t decoded_size(int codec, const uint8_t* src, size_t n, uint64_t limit) {
  if (codec == kZstd) {
    std::string error;
    const uint64_t bytes = zstd_decoded_size(src, n, limit, error);
    if (!error.empty()) throw Corrupt{error};
    return bytes;
  }
  if (codec != kGzip && codec != kBrotli)
    throw Corrupt{"its " + codec_name(codec) + " data of " + std::to_string(n) +
                  " bytes cannot unpack to the " + std::to_string(limit) + " its page header says (at most " +
                  (codec == kSnappy ? "22" : "255") + " times its bytes)"};
  std::vector<uint8_t> scratch(size_t(64) << 10);
  uint64_t bytes = 0;
  if (codec == kGzip) {
    z_stream z{};
    if (inflateInit2(&z, 15 + 32) != Z_OK) throw Corrupt{"zlib cannot initialise"};
    z.next_in = const_cast<uint8_t*>(src);
    z.avail_in = unsigned(n);
    int rc = Z_OK;
    while (rc == Z_OK && bytes <= limit) {
      z.next_out = scratch.data();
      z.avail_out = unsigned(scratch.size());
      rc = inflate(&z, Z_NO_FLUSH);
      bytes += scratch.size() - z.avail_out;
    }
    const std::string msg = z.msg ? z.msg : zError(rc);
    inflateEnd(&z);
    // (Z_BUF_ERROR with room to write: no progress, the data has ended.)
    if (rc == Z_BUF_ERROR) throw Corrupt{"its GZIP data ends before its stream does"};
    if (rc != Z_STREAM_END && rc != Z_OK) throw Corrupt{"its GZIP data is corrupt: " + msg};
    return bytes;
  }
  const std::unique_ptr<BrotliDecoderState, void (*)(BrotliDecoderState*)> state(
      BrotliDecoderCreateInstance(nullptr, nullptr, nullptr), BrotliDecoderDestroyInstance);
  if (!state) throw Corrupt{"Brotli cannot initialise"};
  size_t in_left = n;
  const uint8_t* in = src;
  BrotliDecoderResult rc = BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT;
  while (rc == BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT && bytes <= limit) {
    size_t out_left = scratch.size();
    uint8_t* out = scratch.data();
    rc = BrotliDecoderDecompressStream(state.get(), &in_left, &in, &out_left, &out, nullptr);
    bytes += scratch.size() - out_left;
  }
  if (rc == BROTLI_DECODER_RESULT_ERROR)
    throw Corrupt{std::string("its Brotli data is corrupt: ") +
                  BrotliDecoderErrorString(BrotliDecoderGetErrorCode(state.get()))};
  if (rc == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT)
    throw Corrupt{"its Brotli data ends before its stream does"};
  return bytes;
}

// Decompresses into `dst`, of the `size` that check_declared_size accepted.
void decompress(int codec, const uint8_t* src, size_t n, uint8_t* dst, size_t size) {
  switch (codec) {
    case kSnappy: {
      size_t length = size;
      if (snappy_uncompress(reinterpret_cast<const char*>(src), n, reinterpret_cast<char*>(dst), &length) !=
          SNAPPY_OK)
        throw Corrupt{"its Snappy data is corrupt"};
      if (length != size) throw wrong_size(codec, length, size);
      return;
    }
    case kGzip: {
      z_stream z{};
      if (inflateInit2(&z, 15 + 32) != Z_OK) throw Corrupt{"zlib cannot initialise"};
      z.next_in = const_cast<uint8_t*>(src);
      z.avail_in = unsigned(n);
      z.next_out = dst;
      z.avail_out = unsigned(size);
      int rc = Z_OK;
      while (rc == Z_OK) rc = inflate(&z, Z_FINISH);
      const size_t got = size - z.avail_out;
      const std::string msg = z.msg ? z.msg : zError(rc);
      inflateEnd(&z);
      if (rc != Z_STREAM_END) {
        if (rc == Z_BUF_ERROR && z.avail_out == 0)
          throw Corrupt{"its GZIP data decompresses to more than the " + std::to_string(size) +
                        " bytes its page header says"};
        throw Corrupt{"its GZIP data is corrupt: " + msg};
      }
      if (got != size) throw wrong_size(codec, got, size);
      return;
    }
    case kZstd: {
      const size_t got = ZSTD_decompress(dst, size, src, n);
      if (ZSTD_isError(got))
        throw Corrupt{std::string("its zstd data is corrupt: ") + ZSTD_getErrorName(got)};
      if (got != size) throw wrong_size(codec, got, size);
      return;
    }
    case kBrotli: {
      size_t got = size;
      if (BrotliDecoderDecompress(n, src, &got, dst) != BROTLI_DECODER_RESULT_SUCCESS)
        throw Corrupt{"its Brotli data is corrupt (or larger than the page header says)"};
      if (got != size) throw wrong_size(codec, got, size);
      return;
    }
    case kLz4Raw: {
      if (n > size_t(INT32_MAX) || size > size_t(INT32_MAX)) throw Corrupt{"an LZ4 page over 2 GiB"};
      const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                          int(n), int(size));
      if (got < 0) throw Corrupt{"its LZ4 data is corrupt (or larger than the page header says)"};
      if (size_t(got) != size) throw wrong_size(codec, size_t(got), size);
      return;
    }
    default:
      throw Corrupt{"codec " + codec_name(codec) + " is not read"};  // refused when the file opens
  }
}

bool codec_supported(int codec) {
  return codec == kUncompressed || codec == kSnappy || codec == kGzip || codec == kZstd || codec == kBrotli ||
         codec == kLz4Raw;
}

// ---------------------------------------------------------------------------------------------
// The file, and one leaf column's pages.

// The open file and its footer, shared by the leaves read from it.
struct ParquetFile {
  std::unique_ptr<TableFile> io;
  uint64_t size = 0;
  FileMeta meta;

  [[noreturn]] void fail(const std::string& what) const { io->fail(what); }
  void read_at(uint64_t offset, void* out, size_t n) const { io->read_at(offset, out, n); }

  void open(const fs::path& p) {
    io = std::make_unique<TableFile>(p);
    size = io->size();
    if (size < 12)
      fail("is " + std::to_string(size) + " bytes, too short to be Parquet (it needs 12 at least)");
    char head[4], tail[8];
    read_at(0, head, 4);
    read_at(size - 8, tail, 8);
    if (std::memcmp(tail + 4, "PARE", 4) == 0)
      fail("is an encrypted Parquet file; titan reads unencrypted files only");
    if (std::memcmp(head, "PAR1", 4) != 0 || std::memcmp(tail + 4, "PAR1", 4) != 0)
      fail(std::string("is not a Parquet file: it does not ") +
           (std::memcmp(head, "PAR1", 4) != 0 ? "start" : "end") +
           " with the magic bytes PAR1 (a truncated copy, or another format named .parquet)");
    uint32_t footer_size;
    std::memcpy(&footer_size, tail, 4);
    if (uint64_t(footer_size) + 12 > size)
      fail("its footer claims " + std::to_string(footer_size) + " bytes of a " + std::to_string(size) +
           "-byte file (truncated or corrupt)");
    std::vector<uint8_t> footer(footer_size);
    read_at(size - 8 - footer_size, footer.data(), footer_size);
    try {
      Thrift t(footer.data(), footer.size());
      meta = read_file_meta(t);
    } catch (const Corrupt& c) {
      fail("its footer is corrupt: " + c.what);
    } catch (const NeedMore&) {
      fail("its footer is corrupt: it ends inside a value");
    }
    if (meta.schema.empty() || meta.schema[0].num_children < 0) fail("its footer holds no schema");
  }
};

// Where a chunk's pages start: its dictionary page when it has one. (Some writers set
// dictionary_page_offset to 0 when there is none.)
int64_t chunk_start(const ChunkMeta& c) {
  if (c.dictionary_page_offset > 0 && c.dictionary_page_offset < c.data_page_offset)
    return c.dictionary_page_offset;
  return c.data_page_offset;
}

// What the row being read (`row`, of the file) may still hold over all of its field's leaves: entries
// and string bytes.
struct RowBudget {
  uint64_t row;
  uint64_t values = kMaxRowValues, bytes = kMaxRowBytes;
};

// One leaf column's values with their repetition and definition levels (Dremel's triplets), read
// page by page through the chunks of successive row groups.
struct LeafReader {
  const ParquetFile* file = nullptr;
  size_t leaf = 0;   // index among the schema's leaves: the leaf's chunk in every row group
  std::string name;  // its path, dotted, for messages
  int max_def = 0, max_rep = 0;
  int type = kByteArray;  // physical type: strings, or (Json columns) integers, floats and booleans
  ParquetColumn::Layout* layout = nullptr;

  // The row group being read.
  size_t group = 0;
  uint64_t chunk_pos = 0, chunk_end = 0;  // file offsets of the next page header and of the chunk's end
  int64_t chunk_values_left = 0;          // values (nulls included) of the chunk in pages not yet read
  std::vector<uint8_t> dictionary_bytes;
  std::vector<std::string_view> dictionary;
  std::vector<nlohmann::ordered_json> dictionary_scalars;  // a non-string leaf's dictionary
  bool has_dictionary = false;
  // The bytes the column's leaves hold past believed_unpacked_bytes (the column's count, shared), and
  // this leaf's part of them: its page's and its dictionary's.
  uint64_t* counted = nullptr;
  uint64_t counted_page = 0, counted_dictionary = 0;
  uint64_t skip = 0;  // rows still to skip after a seek

  // The page being read.
  std::vector<uint8_t> page_bytes;       // the decompressed page
  std::vector<uint32_t> defs, reps;      // levels of each entry (empty where the maximum is 0)
  std::vector<std::string_view> values;  // the page's values, in order (DELTA_BYTE_ARRAY's: their suffixes)
  // DELTA_BYTE_ARRAY: how many bytes each value takes from the start of the one before it (empty for
  // the other encodings), and the value last taken, rebuilt in place from the one before it.
  std::vector<uint32_t> prefixes;
  std::string rebuilt;
  std::vector<nlohmann::ordered_json> scalars;  // a non-string leaf's
  size_t entries = 0, entry = 0, value = 0;
  uint64_t page_offset = 0;  // of the page's header, for errors

  std::string where() const {
    return "column '" + name + "', row group " + std::to_string(group) + ", page at byte " +
           std::to_string(page_offset);
  }
  [[noreturn]] void fail_page(const std::string& what) const {
    file->fail(where() + ": " + what + " (the file is corrupt or truncated)");
  }
  const ChunkMeta& chunk() const { return file->meta.row_groups[group].columns[leaf]; }

  void start_group(size_t g, uint64_t rows_to_skip) {
    group = g;
    entries = entry = value = 0;
    has_dictionary = false;
    release(page_bytes, counted_page);
    release(dictionary_bytes, counted_dictionary);
    skip = rows_to_skip;
    if (g >= file->meta.row_groups.size()) return;
    chunk_values_left = chunk().num_values;
    if (chunk_values_left == 0) return;  // an empty row group's chunk may hold no page, nor an offset
    chunk_pos = uint64_t(chunk_start(chunk()));
    chunk_end = chunk_pos + uint64_t(chunk().total_compressed_size);
    chunk_values_left = chunk().num_values;
    ++layout->row_groups;
    layout->codecs.insert(codec_name(chunk().codec));
  }

  // The header of the page at `at` (in the chunk), and its size in bytes.
  PageHeader read_header(uint64_t at, size_t& header_bytes) {
    std::vector<uint8_t> buf;
    for (size_t want = 256;; want *= 4) {
      const size_t n = size_t(std::min<uint64_t>(want, chunk_end - at));
      buf.resize(n);
      file->read_at(at, buf.data(), n);
      try {
        Thrift t(buf.data(), n);
        PageHeader h = read_page_header(t);
        header_bytes = t.consumed();
        return h;
      } catch (const NeedMore&) {
        if (n == chunk_end - at) fail_page("its header runs past the end of the column chunk");
      } catch (const Corrupt& c) {
        fail_page("its header is corrupt: " + c.what);
      }
    }
  }

  // The page's stored bytes, CRC-checked where the writer stored a CRC.
  std::vector<uint8_t> read_page_body(const PageHeader& h, uint64_t body_at) {
    std::vector<uint8_t> stored(size_t(h.compressed_size));
    file->read_at(body_at, stored.data(), stored.size());
    if (h.has_crc) {
      const uint32_t crc = uint32_t(crc32(0, stored.data(), uInt(stored.size())));
      if (crc != h.crc) fail_page("its CRC does not match its bytes");
    }
    return stored;
  }

  // What the page of header `h` claims past believed_unpacked_bytes of its stored bytes (to be counted,
  // and held to kMaxCountedBytes with the column's other such pages), or 0.
  uint64_t claim_past_belief(const PageHeader& h) const {
    if (chunk().codec == kUncompressed || (h.type == kDataPageV2 && !h.values_compressed) ||
        h.compressed_size < 0 || h.uncompressed_size < 0)
      return 0;
    const uint64_t size = uint64_t(h.uncompressed_size);
    return size > believed_unpacked_bytes(uint64_t(h.compressed_size)) ? size : 0;
  }

  // The pages the row group's first row needs of this leaf (its dictionary and first data page):
  // what they claim past believed_unpacked_bytes, from their headers, before anything is decoded.
  uint64_t first_pages_claim() {
    if (group >= file->meta.row_groups.size() || chunk_values_left == 0) return 0;
    uint64_t claim = 0;
    for (uint64_t at = chunk_pos; at < chunk_end;) {
      page_offset = at;
      size_t header_bytes = 0;
      const PageHeader h = read_header(at, header_bytes);
      claim += claim_past_belief(h);
      if ((h.type != kIndexPage && h.type != kDictionaryPage) || h.compressed_size < 0) break;
      at += header_bytes + uint64_t(h.compressed_size);
    }
    return claim;
  }

  // Frees `bytes` if they were counted past believed_unpacked_bytes (`charge` of them), taking them off
  // the column's count.
  void release(std::vector<uint8_t>& bytes, uint64_t& charge) {
    if (charge == 0) return;
    bytes = {};  // not cleared: its capacity is what was counted
    *counted -= charge;
    charge = 0;
  }

  // `stored` decompressed (from `from` on; bytes before it are copied as they are) into `out`, which
  // `charge` counts. The header's size is checked before the page is allocated: believed up to
  // believed_unpacked_bytes of the stored bytes, past it only once the data, decoded and counted,
  // proves it (table_file.h) and the column holds no more than kMaxCountedBytes of such pages with it,
  // and as far as the codec's own framing agrees.
  void decompress_into(std::vector<uint8_t>& out, uint64_t& charge, const std::vector<uint8_t>& stored,
                       size_t from, bool compressed, int32_t size) {
    release(out, charge);
    if (from > stored.size() || from > size_t(size)) fail_page("its level bytes run past the page");
    const int codec = chunk().codec;
    const bool as_stored = !compressed || codec == kUncompressed;
    if (as_stored && stored.size() != size_t(size))
      fail_page("it stores " + std::to_string(stored.size()) + " bytes uncompressed but its header says " +
                std::to_string(size));
    // A page of nulls may store no value bytes at all, though "compressed" (parquet-mr's v2 pages).
    const bool no_values = stored.size() == from && size_t(size) == from;
    if (!as_stored && !no_values) {
      const uint8_t* src = stored.data() + from;
      const size_t n = stored.size() - from, want = size_t(size) - from;
      const bool past_belief = uint64_t(size) > believed_unpacked_bytes(stored.size());
      if (past_belief && *counted + uint64_t(size) > kMaxCountedBytes)
        file->fail(where() + ": its header says " + std::to_string(size) +
                   " bytes uncompressed, past 1024 times its stored bytes plus 1 MiB; with the " +
                   std::to_string(*counted) + " bytes past that ratio its column holds already, that is " +
                   past_counted_bytes("row group"));
      try {
        check_declared_size(codec, src, n, want);
        if (past_belief) {
          const uint64_t got = decoded_size(codec, src, n, want);
          if (got > want)
            throw Corrupt{"its " + codec_name(codec) + " data decompresses to more than the " +
                          std::to_string(want) + " bytes its page header says"};
          if (got != want) throw wrong_size(codec, size_t(got), want);
        }
      } catch (const Corrupt& c) {
        fail_page(c.what);
      }
      if (past_belief) {
        charge = uint64_t(size);
        *counted += charge;
      }
    }
    out.resize(size_t(size));
    if (as_stored || no_values) {
      if (!stored.empty()) std::memcpy(out.data(), stored.data(), stored.size());
      return;
    }
    if (from) std::memcpy(out.data(), stored.data(), from);
    try {
      decompress(codec, stored.data() + from, stored.size() - from, out.data() + from, out.size() - from);
    } catch (const Corrupt& c) {
      fail_page(c.what);
    }
  }

  // `count` dictionary-encoded values from `in` (a bit width, then RLE / bit-packed indices), each
  // the `dictionary` entry it indexes, appended to `out`.
  template <class T>
  void look_up(Bytes& in, size_t count, const std::vector<T>& dictionary, std::vector<T>& out) const {
    if (!has_dictionary) throw Corrupt{"a dictionary-encoded page without a dictionary page before it"};
    in.need(1, "the dictionary indices' bit width");
    const int width = *in.p++;
    std::vector<uint32_t> indices;
    decode_hybrid(in, width, count, indices, "the dictionary indices");
    for (uint32_t i : indices) {
      if (i >= dictionary.size())
        throw Corrupt{"dictionary index " + std::to_string(i) + " of a dictionary of " +
                      std::to_string(dictionary.size())};
      out.push_back(dictionary[i]);
    }
  }

  // `count` PLAIN byte-array values from `in` into `out` (views into its bytes).
  static void decode_plain(Bytes in, size_t count, std::vector<std::string_view>& out) {
    out.clear();
    if (count > in.left() / 4) throw Corrupt{"it claims more PLAIN values than its bytes can hold"};
    out.reserve(std::min<size_t>(count, 1u << 16));
    for (size_t i = 0; i < count; ++i) {
      const uint32_t n = in.u32le("a PLAIN value's length");
      in.need(n, "a PLAIN value");
      out.emplace_back(reinterpret_cast<const char*>(in.p), n);
      in.p += n;
    }
  }

  // The page's `count` byte-array values of `encoding` from `in` into `values` (views into page_bytes
  // or the dictionary; DELTA_BYTE_ARRAY's suffixes, with their prefixes, each value rebuilt as
  // take_value() takes it).
  void decode_values(Bytes in, int encoding, size_t count) {
    values.clear();
    prefixes.clear();
    rebuilt.clear();
    if (count == 0) return;  // a page of nulls may hold no value bytes at all
    switch (encoding) {
      case kPlain:
        decode_plain(in, count, values);
        return;
      case kPlainDictionary:
      case kRleDictionary: {
        values.reserve(std::min<size_t>(count, 1u << 16));
        look_up(in, count, dictionary, values);
        return;
      }
      case kDeltaLengthByteArray: {
        std::vector<int64_t> lengths;
        decode_delta_binary_packed(in, count, lengths, "the DELTA_LENGTH_BYTE_ARRAY lengths");
        values.reserve(lengths.size());
        for (int64_t n : lengths) {
          if (n < 0) throw Corrupt{"a negative value length"};
          in.need(size_t(n), "a DELTA_LENGTH_BYTE_ARRAY value");
          values.emplace_back(reinterpret_cast<const char*>(in.p), size_t(n));
          in.p += n;
        }
        return;
      }
      case kDeltaByteArray: {
        // Each value is the first `prefix` bytes of the one before it, then its own suffix. The values
        // are not rebuilt here, only their lengths checked. A page of 20,000 copies of one 1 MB document
        // (parquet-mr ends a v2 page at 20,000 values or 1 MiB of encoded bytes, which these stay under)
        // is 20 GB of values from 1 MB, each a row of its own: no bound on a page's rebuilt values
        // spares such valid files, not even 2^31 - 1 (the most its values could be as PLAIN). The rows
        // bound them: each value is rebuilt in place of the one before it when its row takes it
        // (take_value), and a row is held to kMaxRowBytes, counted from these lengths before any of it
        // is copied (read_row). Rebuilt in place, a value needs no more than the page's bytes: it is
        // at most the sum of the suffixes up to it, all in the page (whose size is an int32), which
        // also keeps every length within a uint32_t.
        std::vector<int64_t> lengths, suffixes;
        decode_delta_binary_packed(in, count, lengths, "the DELTA_BYTE_ARRAY prefix lengths");
        decode_delta_binary_packed(in, count, suffixes, "the DELTA_BYTE_ARRAY suffix lengths");
        prefixes.reserve(count);
        values.reserve(count);
        size_t previous_size = 0;
        for (size_t i = 0; i < count; ++i) {
          if (lengths[i] < 0 || uint64_t(lengths[i]) > previous_size)
            throw Corrupt{"DELTA_BYTE_ARRAY value " + std::to_string(i) + " has a prefix of " +
                          std::to_string(lengths[i]) + " bytes where the value before it has " +
                          std::to_string(previous_size) + " (a prefix is part of the value before it)"};
          if (suffixes[i] < 0)
            throw Corrupt{"DELTA_BYTE_ARRAY value " + std::to_string(i) + " has a negative suffix length"};
          in.need(size_t(suffixes[i]), "a DELTA_BYTE_ARRAY suffix");
          prefixes.push_back(uint32_t(lengths[i]));
          values.emplace_back(reinterpret_cast<const char*>(in.p), size_t(suffixes[i]));
          in.p += suffixes[i];
          previous_size = size_t(lengths[i]) + size_t(suffixes[i]);
        }
        return;
      }
      default:
        throw Corrupt{"its values are " + encoding_name(encoding) +
                      "-encoded, which a string column cannot be"};
    }
  }

  // The size of the page's value `v`, without rebuilding it.
  size_t value_size(size_t v) const { return values[v].size() + (prefixes.empty() ? 0 : prefixes[v]); }

  // The page's next value: a DELTA_BYTE_ARRAY one rebuilt from the one before it (valid until the
  // next is taken), any other a view into the page or the dictionary.
  std::string_view take_value() {
    const std::string_view v = values[value];
    if (prefixes.empty()) {
      ++value;
      return v;
    }
    rebuilt.resize(prefixes[value++]);  // at most its size: never moves the bytes kept
    rebuilt.append(v);
    return rebuilt;
  }

  // Values of a non-string leaf (a Json column's numbers and booleans) of `encoding` from `in`:
  // `count` of them into `out`.
  void decode_scalars(Bytes in, int encoding, size_t count, std::vector<nlohmann::ordered_json>& out) {
    out.clear();
    if (count == 0) return;
    const size_t width = type == kInt32 || type == kFloat ? 4 : 8;
    auto fixed = [&](const uint8_t* bytes) -> nlohmann::ordered_json {
      if (type == kInt32) {
        int32_t v;
        std::memcpy(&v, bytes, 4);
        return v;
      }
      if (type == kInt64) {
        int64_t v;
        std::memcpy(&v, bytes, 8);
        return v;
      }
      if (type == kFloat) {
        float v;
        std::memcpy(&v, bytes, 4);
        return double(v);
      }
      double v;
      std::memcpy(&v, bytes, 8);
      return v;
    };
    switch (encoding) {
      case kPlain:
        if (type == kBoolean) {  // one bit each, least significant first
          in.need((count + 7) / 8, "PLAIN booleans");
          for (size_t i = 0; i < count; ++i) out.push_back(bool((in.p[i / 8] >> (i % 8)) & 1));
          return;
        }
        if (count > in.left() / width) throw Corrupt{"it claims more PLAIN values than its bytes can hold"};
        for (size_t i = 0; i < count; ++i) out.push_back(fixed(in.p + i * width));
        return;
      case kPlainDictionary:
      case kRleDictionary: {
        look_up(in, count, dictionary_scalars, out);
        return;
      }
      case kRle: {  // booleans, after their 4-byte size
        if (type != kBoolean) break;
        const uint32_t n = in.u32le("the RLE booleans' size");
        in.need(n, "the RLE booleans");
        Bytes bits{in.p, in.p + n};
        std::vector<uint32_t> flags;
        decode_hybrid(bits, 1, count, flags, "the RLE booleans");
        for (uint32_t f : flags) out.push_back(f != 0);
        return;
      }
      case kDeltaBinaryPacked: {
        if (type != kInt32 && type != kInt64) break;
        std::vector<int64_t> ints;
        decode_delta_binary_packed(in, count, ints, "the DELTA_BINARY_PACKED integers");
        for (int64_t v : ints)
          out.push_back(type == kInt32 ? nlohmann::ordered_json(int32_t(v)) : nlohmann::ordered_json(v));
        return;
      }
      case kByteStreamSplit: {  // byte k of every value, then byte k + 1, ...
        if (type == kBoolean) break;
        if (count > in.left() / width) throw Corrupt{"it claims more values than its bytes can hold"};
        uint8_t bytes[8];
        for (size_t i = 0; i < count; ++i) {
          for (size_t k = 0; k < width; ++k) bytes[k] = in.p[k * count + i];
          out.push_back(fixed(bytes));
        }
        return;
      }
      default:
        break;
    }
    throw Corrupt{"its " + std::string(physical_type_name(type)) + " values are " + encoding_name(encoding) +
                  "-encoded, which titan does not read"};
  }

  // Reads the next data page of the chunk (a dictionary page before it into the dictionary). While
  // rows are to be skipped, a page whose row count its header gives (a flat column's, or any v2
  // page, which starts at a row) and that lies wholly before the row sought is passed over unread.
  // False when the chunk has no page left.
  bool load_page() {
    while (chunk_values_left > 0) {
      if (chunk_pos >= chunk_end)
        file->fail("column '" + name + "', row group " + std::to_string(group) + ": its pages end " +
                   std::to_string(chunk_values_left) + " values short of the chunk's " +
                   std::to_string(chunk().num_values) + " (the file is corrupt or truncated)");
      page_offset = chunk_pos;
      size_t header_bytes = 0;
      const PageHeader h = read_header(chunk_pos, header_bytes);
      if (h.compressed_size < 0 || h.uncompressed_size < 0) fail_page("its header gives a negative size");
      const uint64_t body_at = chunk_pos + header_bytes;
      if (uint64_t(h.compressed_size) > chunk_end - body_at)
        fail_page("it runs past the end of the column chunk");
      chunk_pos = body_at + uint64_t(h.compressed_size);
      if (h.type == kIndexPage) continue;
      if (h.type == kDictionaryPage) {
        load_dictionary(h, body_at);
        continue;
      }
      if (h.type != kDataPage && h.type != kDataPageV2)
        fail_page("unknown page type " + std::to_string(h.type));
      if (h.num_values < 0 || int64_t(h.num_values) > chunk_values_left)
        fail_page("it holds " + std::to_string(h.num_values) + " values, more than the " +
                  std::to_string(chunk_values_left) + " its column chunk has left");
      chunk_values_left -= h.num_values;
      if (h.num_values > (1 << 28)) fail_page("it claims " + std::to_string(h.num_values) + " values");
      // A flat column's page holds a row per value: passed over by its header while rows are skipped. A
      // nested column's is decoded to count its rows (a v2 header's num_rows would tell, but Arrow C++
      // before 12.0 wrote the value count there, apache/arrow#34086).
      if (max_rep == 0) {
        if (h.type == kDataPageV2 && h.num_rows >= 0 && h.num_rows != h.num_values)
          fail_page("a flat column's page holds " + std::to_string(h.num_values) + " values in " +
                    std::to_string(h.num_rows) + " rows");
      }
      const int64_t rows = max_rep == 0 ? h.num_values : -1;
      if (rows > 0 && skip >= uint64_t(rows)) {
        skip -= uint64_t(rows);
        continue;
      }
      try {
        load_data_page(h, body_at);
      } catch (const Corrupt& c) {
        fail_page(c.what);
      }
      return true;
    }
    return false;
  }

  void load_dictionary(const PageHeader& h, uint64_t body_at) {
    if (h.encoding != kPlain && h.encoding != kPlainDictionary)
      fail_page("its dictionary is " + encoding_name(h.encoding) + "-encoded (the format stores it PLAIN)");
    if (h.num_values < 0) fail_page("its dictionary has a negative size");
    const std::vector<uint8_t> stored = read_page_body(h, body_at);
    decompress_into(dictionary_bytes, counted_dictionary, stored, 0, true, h.uncompressed_size);
    try {
      const Bytes in{dictionary_bytes.data(), dictionary_bytes.data() + dictionary_bytes.size()};
      if (type == kByteArray)
        decode_plain(in, size_t(h.num_values), dictionary);
      else
        decode_scalars(in, kPlain, size_t(h.num_values), dictionary_scalars);
    } catch (const Corrupt& c) {
      fail_page("its dictionary: " + c.what);
    }
    has_dictionary = true;
    ++layout->dictionary_pages;
  }

  static int bit_width(int max_level) {
    int w = 0;
    while ((1 << w) <= max_level) ++w;
    return w;
  }

  void load_data_page(const PageHeader& h, uint64_t body_at) {
    const std::vector<uint8_t> stored = read_page_body(h, body_at);
    const size_t n = size_t(h.num_values);
    Bytes in{nullptr, nullptr};
    // Levels: v2 stores them uncompressed before the values, with their sizes in the header; v1
    // inside the compressed page, each after its 4-byte size.
    auto levels = [&](Bytes& bytes, int max_level, std::vector<uint32_t>& out, const char* what) {
      out.clear();
      if (max_level == 0) return;
      decode_hybrid(bytes, bit_width(max_level), n, out, what);
      for (uint32_t l : out)
        if (l > uint32_t(max_level))
          throw Corrupt{std::string(what) + " hold " + std::to_string(l) + " where the maximum is " +
                        std::to_string(max_level)};
    };
    if (h.type == kDataPageV2) {
      if (h.def_bytes < 0 || h.rep_bytes < 0) throw Corrupt{"a negative level size"};
      if ((max_rep == 0 && h.rep_bytes != 0) || (max_def == 0 && h.def_bytes != 0))
        throw Corrupt{"levels where the column has none"};
      const size_t level_bytes = size_t(h.rep_bytes) + size_t(h.def_bytes);
      decompress_into(page_bytes, counted_page, stored, level_bytes, h.values_compressed,
                      h.uncompressed_size);
      in = Bytes{page_bytes.data(), page_bytes.data() + page_bytes.size()};
      Bytes rep_in{in.p, in.p + h.rep_bytes}, def_in{in.p + h.rep_bytes, in.p + level_bytes};
      levels(rep_in, max_rep, reps, "the repetition levels");
      levels(def_in, max_def, defs, "the definition levels");
      in.p += level_bytes;
    } else {
      decompress_into(page_bytes, counted_page, stored, 0, true, h.uncompressed_size);
      in = Bytes{page_bytes.data(), page_bytes.data() + page_bytes.size()};
      if ((max_def > 0 && h.level_encoding != kRle) || (max_rep > 0 && h.rep_level_encoding != kRle))
        throw Corrupt{
            "its levels are " +
            encoding_name(max_def > 0 && h.level_encoding != kRle ? h.level_encoding : h.rep_level_encoding) +
            "-encoded (titan reads RLE)"};
      for (auto [max_level, out, what] : {std::tuple{max_rep, &reps, "the repetition levels"},
                                          std::tuple{max_def, &defs, "the definition levels"}}) {
        if (max_level == 0) {
          out->clear();
          continue;
        }
        const uint32_t size = in.u32le(what);
        in.need(size, what);
        Bytes level_in{in.p, in.p + size};
        levels(level_in, max_level, *out, what);
        in.p += size;
      }
    }
    size_t present = n;
    if (max_def > 0) present = size_t(std::count(defs.begin(), defs.end(), uint32_t(max_def)));
    if (max_rep > 0 && n > 0 && reps[0] != 0 && chunk_values_left + h.num_values == chunk().num_values)
      throw Corrupt{"the column chunk's first value continues a row"};
    if (type == kByteArray)
      decode_values(in, h.encoding, present);
    else
      decode_scalars(in, h.encoding, present, scalars);
    entries = n;
    entry = value = 0;
    ++(h.type == kDataPageV2 ? layout->v2_pages : layout->v1_pages);
    layout->encodings.insert(encoding_name(h.encoding));
  }

  // Whether an entry is at hand (a page loaded as needed); false at the end of the chunk.
  bool ready() {
    while (entry >= entries)
      if (!load_page()) return false;
    return true;
  }
  // The repetition level of the next entry; -1 at the end of the chunk (a row never spans chunks).
  int peek_rep() {
    if (!ready()) return -1;
    return max_rep == 0 ? 0 : int(reps[entry]);
  }
  struct Entry {
    int rep, def;
    std::string_view value;  // a string leaf's, valid until the next take(); empty where def < max_def
    const nlohmann::ordered_json* scalar = nullptr;  // another leaf's, where def == max_def
  };
  Entry take() {
    Entry e{max_rep == 0 ? 0 : int(reps[entry]), max_def == 0 ? 0 : int(defs[entry]), {}};
    if (e.def == max_def) {
      if (value >= (type == kByteArray ? values.size() : scalars.size()))
        fail_page("it holds fewer values than its definition levels say");
      if (type == kByteArray)
        e.value = take_value();
      else
        e.scalar = &scalars[value++];
    }
    ++entry;
    return e;
  }

  // One row's entries (copied: a row may span pages); false at the end of the chunk.
  struct Owned {
    int rep, def;
    std::string value;
    nlohmann::ordered_json scalar;  // a non-string leaf's value
  };
  // `budget`: what the row may still hold, over all of a field's leaves, counted in each page before
  // any of it is copied: a forged page that makes one row of 2^28 entries, or of 10,000 copies of one
  // 1 MiB dictionary string, fails before it is assembled.
  bool read_row(std::vector<Owned>& row, RowBudget& budget) {
    row.clear();
    if (peek_rep() < 0) return false;
    if (peek_rep() != 0) fail_page("a row starts with repetition level " + std::to_string(peek_rep()));
    do {
      size_t end = entry + 1;  // past the row's last entry in this page
      if (max_rep > 0)
        while (end < entries && reps[end] > 0) ++end;
      if (end - entry > budget.values)
        file->fail("column '" + name + "', row group " + std::to_string(group) + ", page at byte " +
                   std::to_string(page_offset) +
                   ": a row holds more than 2^24 values, the most titan assembles into one row (as in Arrow "
                   "IPC files)");
      budget.values -= end - entry;
      if (type == kByteArray) {
        uint64_t bytes = 0;  // of the values these entries copy (take() names a page short of values)
        for (size_t k = entry, v = value; k < end && v < values.size(); ++k)
          if (max_def == 0 || defs[k] == uint32_t(max_def)) bytes += value_size(v++);
        if (bytes > budget.bytes)
          file->fail("column '" + name + "', row group " + std::to_string(group) + ", page at byte " +
                     std::to_string(page_offset) + ": row " + std::to_string(budget.row + 1) + ": " +
                     too_many_row_bytes(kMaxRowBytes - budget.bytes + bytes));
        budget.bytes -= bytes;
      }
      while (entry < end) {
        const Entry e = take();
        row.push_back({e.rep, e.def, std::string(e.value), e.scalar ? *e.scalar : nlohmann::ordered_json()});
      }
    } while (peek_rep() > 0);
    return true;
  }

  // Passes over the `skip` rows start_group asked for: whole pages by their headers where they can
  // be (load_page), the rest entry by entry.
  void skip_rows() {
    while (skip > 0) {
      if (peek_rep() < 0)
        file->fail("column '" + name + "' has fewer rows in row group " + std::to_string(group) +
                   " than the row group");
      if (skip == 0) break;  // load_page passed over the rest
      take();
      --skip;  // before the row's further entries: a page after them starts a row
      while (peek_rep() > 0) take();
    }
  }
};

// The schema below a top-level field, as the JSON a row of it becomes. Each leaf's path is a list
// of steps from the field's slot to the leaf's value.
struct Step {
  enum Kind { kNullable, kRepeated, kKey, kValue } kind;
  int def = 0;      // kNullable / kRepeated: the definition level at which the node is present
  int rep = 0;      // kRepeated: the node's repetition level
  std::string key;  // kKey
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct ParquetColumn::Impl {
  ParquetFile file;
  std::string column;
  bool as_text = true;  // the field is one string per row (next()); else any shape (next_json())
  std::vector<std::string> top_level;     // the file's columns
  std::vector<LeafReader> leaves;         // the field's leaves, in schema order
  std::vector<std::vector<Step>> paths;   // each leaf's steps
  std::vector<uint64_t> group_first_row;  // row of the file each row group starts at
  size_t group = 0;
  uint64_t group_rows_left = 0;
  uint64_t row = 0;  // of the file, the next next() returns
  Layout layout;
  std::vector<std::vector<LeafReader::Owned>> row_entries;  // per leaf, for the row being read
  uint64_t counted = 0;              // what the leaves hold past believed_unpacked_bytes
  bool first_pages_checked = false;  // in the row group being read (check_first_pages)

  [[noreturn]] void fail(const std::string& what) const { file.fail(what); }

  // Builds the steps of the leaves under schema element `at` (whose slot the steps so far reach);
  // returns the index after its subtree. `leaf` counts the schema's leaves before `at`.
  size_t walk(size_t at, std::vector<Step> steps, int def, int rep, size_t& leaf, const std::string& dotted,
              bool repetition_done = false, int depth = 0) {
    const auto& schema = file.meta.schema;
    if (at >= schema.size()) fail("its schema is corrupt: a group names more children than it lists");
    if (depth > 64) fail("column '" + column + "' nests more than 64 levels deep");
    const SchemaElement& e = schema[at];
    const std::string name = dotted.empty() ? e.name : dotted + "." + e.name;
    if (!repetition_done) {
      if (e.repetition == kOptional) {
        steps.push_back({Step::kNullable, ++def, 0, ""});
      } else if (e.repetition == kRepeated) {  // a bare repeated field: a list of its values
        steps.push_back({Step::kRepeated, ++def, ++rep, ""});
      }
    }
    if (e.num_children == 0) {  // a leaf
      // Strings; a Json column's numbers and booleans too (a field null in every row is written as
      // INT32 of logical type UNKNOWN: its values are all null).
      const bool scalar =
          e.type == kBoolean || e.type == kInt32 || e.type == kInt64 || e.type == kFloat || e.type == kDouble;
      if (e.type != kByteArray && (as_text || !scalar))
        fail("column '" + column + "' holds " + physical_type_name(e.type) + " values in '" + name +
             "'; titan reads " +
             (as_text ? "strings" : "strings, integers, floats and booleans in a conversation's fields"));
      if (e.type == kByteArray)
        if (const std::string other = non_text_annotation(e); !other.empty())
          fail("column '" + name + "' is annotated " + other + ", not text");
      steps.push_back({Step::kValue, 0, 0, ""});
      LeafReader r;
      r.file = &file;
      r.leaf = leaf++;
      r.name = name;
      r.max_def = def;
      r.max_rep = rep;
      r.type = e.type;
      r.layout = &layout;
      r.counted = &counted;
      leaves.push_back(std::move(r));
      paths.push_back(std::move(steps));
      return at + 1;
    }
    const bool is_list = e.converted_type == 3 || e.logical_type == 3;
    const bool is_map = e.converted_type == 1 || e.converted_type == 2 || e.logical_type == 2;
    if (is_map) fail("column '" + name + "' is a map; titan reads strings, lists and structs of them");
    if (is_list) {
      // LIST: one repeated child; its one child is the element (three levels), or it is the element
      // itself (the older two-level lists: several fields, or named "array" or "<list>_tuple").
      if (e.num_children != 1 || at + 1 >= schema.size() || schema[at + 1].repetition != kRepeated)
        fail("column '" + name + "' is a LIST whose child is not one repeated field");
      const SchemaElement& r = schema[at + 1];
      steps.push_back({Step::kRepeated, ++def, ++rep, ""});
      // LogicalTypes.md's backward-compatibility rules: a repeated group of one field is the element
      // itself when it is named "array" or "<list>_tuple", or when that field is repeated.
      const bool three_level = r.num_children == 1 && r.name != "array" && r.name != e.name + "_tuple" &&
                               !(at + 2 < schema.size() && schema[at + 2].repetition == kRepeated);
      if (three_level) return walk(at + 2, steps, def, rep, leaf, name + "." + r.name, false, depth + 1);
      return walk(at + 1, steps, def, rep, leaf, name, /*repetition_done=*/true, depth + 1);
    }
    size_t next = at + 1;
    for (int c = 0; c < e.num_children; ++c) {
      if (next >= schema.size()) fail("its schema is corrupt: a group names more children than it lists");
      std::vector<Step> child = steps;
      child.push_back({Step::kKey, 0, 0, schema[next].name});
      next = walk(next, child, def, rep, leaf, name, false, depth + 1);
    }
    return next;
  }

  // The end of the subtree at `at`, counting its leaves into `leaves_before`.
  size_t skip_subtree(size_t at, size_t& leaves_before, int depth = 0) const {
    const auto& schema = file.meta.schema;
    if (at >= schema.size()) fail("its schema is corrupt: a group names more children than it lists");
    if (depth > 64) fail("its schema nests more than 64 levels deep");
    if (schema[at].num_children == 0) {
      ++leaves_before;
      return at + 1;
    }
    size_t next = at + 1;
    for (int c = 0; c < schema[at].num_children; ++c) next = skip_subtree(next, leaves_before, depth + 1);
    return next;
  }

  void find_column() {
    const auto& schema = file.meta.schema;
    size_t leaves_before = 0, i = 1;
    std::optional<size_t> found;
    size_t found_leaf = 0;
    for (int c = 0; c < schema[0].num_children; ++c) {
      if (i >= schema.size()) fail("its schema is corrupt: the root names more children than it lists");
      top_level.push_back(schema[i].name);
      if (schema[i].name == column && !found) {
        found = i;
        found_leaf = leaves_before;
      }
      i = skip_subtree(i, leaves_before);
    }
    if (!found) {
      fail("has no column '" + column + "' (" +
           (as_text ? "training.text_field names the column to read"
                    : "training.chat_field names the messages") +
           "; its columns are " + quoted_names(top_level) + ")");
    }
    const SchemaElement& e = schema[*found];
    if (as_text) {
      if (e.num_children > 0)
        fail(
            "column '" + column +
            "' is a nested group (a list, map or struct), not a string per row; titan reads a string column");
      if (e.type != kByteArray)
        fail("column '" + column + "' holds " + physical_type_name(e.type) + " values, not strings");
      if (e.repetition == kRepeated)
        fail("column '" + column + "' is repeated (a list of strings per row), not one string per row");
    }
    size_t leaf = found_leaf;
    walk(*found, {}, 0, 0, leaf, "");
    if (leaves.empty()) fail("column '" + column + "' is a group without a field");
    row_entries.resize(leaves.size());
  }

  void check_row_groups() {
    uint64_t rows = 0;
    const auto& meta = file.meta;
    for (size_t g = 0; g < meta.row_groups.size(); ++g) {
      const RowGroup& rg = meta.row_groups[g];
      auto bad = [&](const std::string& what) { fail("row group " + std::to_string(g) + ": " + what); };
      if (rg.num_rows < 0) bad("a negative row count");
      for (const LeafReader& l : leaves) {
        if (l.leaf >= rg.columns.size()) bad("lists fewer column chunks than the schema has leaves");
        const ChunkMeta& c = rg.columns[l.leaf];
        if (c.encrypted) fail("column '" + l.name + "' is encrypted; titan reads unencrypted files only");
        if (c.external)
          bad("column '" + l.name + "' is stored in another file; titan reads self-contained files");
        std::string dotted;
        for (const std::string& part : c.path) dotted += (dotted.empty() ? "" : ".") + part;
        if (dotted != l.name)
          bad("its column chunk " + std::to_string(l.leaf) + " is '" + dotted + "', not '" + l.name + "'");
        if (!codec_supported(c.codec))
          fail("column '" + l.name + "' is compressed with " + codec_name(c.codec) +
               ", which titan does not read (it reads UNCOMPRESSED, SNAPPY, GZIP, ZSTD, BROTLI and LZ4_RAW; "
               "rewrite the file with one of them)");
        if (l.max_rep == 0 ? c.num_values != rg.num_rows : c.num_values < rg.num_rows)
          bad("column '" + l.name + "' holds " + std::to_string(c.num_values) + " values for " +
              std::to_string(rg.num_rows) + " rows");
        const int64_t start = chunk_start(c);
        if (c.num_values == 0) continue;  // an empty row group's chunk may hold no page, nor an offset
        if (start < 4 || c.total_compressed_size < 0 || uint64_t(start) > file.size ||
            uint64_t(c.total_compressed_size) > file.size - uint64_t(start))
          bad("column '" + l.name + "' lies outside the file (bytes " + std::to_string(start) + " + " +
              std::to_string(c.total_compressed_size) + " of " + std::to_string(file.size) + ")");
      }
      group_first_row.push_back(rows);
      rows += uint64_t(rg.num_rows);
    }
    if (rows != uint64_t(meta.num_rows))
      fail("its row groups hold " + std::to_string(rows) + " rows, its footer says " +
           std::to_string(meta.num_rows));
    group_first_row.push_back(rows);
  }

  uint64_t rows() const { return uint64_t(file.meta.num_rows); }

  void start_group(size_t g, uint64_t skip) {
    group = g;
    group_rows_left = g < file.meta.row_groups.size() ? uint64_t(file.meta.row_groups[g].num_rows) - skip : 0;
    for (LeafReader& l : leaves) l.start_group(g, skip);
    first_pages_checked = false;
    if (g < file.meta.row_groups.size() && skip > 0) {
      check_first_pages();
      for (LeafReader& l : leaves) l.skip_rows();
    }
  }

  // Before any page of the row group is decoded: the pages its first row needs of every leaf at once
  // (each one's dictionary and first data page), held to kMaxCountedBytes past believed_unpacked_bytes
  // from their headers, so that leaves decoded one after the other claim no memory before the last is
  // refused. A later page is held to it as it loads, with what the other leaves hold then.
  void check_first_pages() {
    first_pages_checked = true;
    uint64_t claim = 0;
    std::string names;
    for (LeafReader& l : leaves)
      if (const uint64_t c = l.first_pages_claim()) {
        claim += c;
        names += (names.empty() ? "'" : ", '") + l.name + "'";
      }
    if (claim > kMaxCountedBytes)
      fail("column '" + column + "', row group " + std::to_string(group) +
           ": the first pages of its leaves " + names + " claim " + std::to_string(claim) +
           " bytes uncompressed, each past 1024 times its stored bytes plus 1 MiB: " +
           past_counted_bytes("row group"));
  }

  void seek(uint64_t target) {
    if (target > rows())
      fail("row " + std::to_string(target) + " is past its " + std::to_string(rows()) + " rows");
    const size_t groups = file.meta.row_groups.size();
    const size_t g =
        std::min(size_t(std::upper_bound(group_first_row.begin(), group_first_row.end(), target) -
                        group_first_row.begin()) -
                     1,
                 groups);
    start_group(g, target - group_first_row[g]);
    row = target;
  }

  // The next row's entries of every leaf into row_entries; false at the end of the file.
  bool next_row() {
    while (group_rows_left == 0) {
      if (group >= file.meta.row_groups.size()) return false;
      start_group(group + 1, 0);
      if (group >= file.meta.row_groups.size()) return false;
    }
    if (!first_pages_checked) check_first_pages();
    RowBudget budget{row};
    for (size_t i = 0; i < leaves.size(); ++i)
      if (!leaves[i].read_row(row_entries[i], budget))
        fail("column '" + leaves[i].name + "' has fewer rows in row group " + std::to_string(group) +
             " than the row group");
    --group_rows_left;
    ++row;
    return true;
  }

  bool next_text(std::string& value, bool& null) {
    if (!next_row()) return false;
    LeafReader::Owned& e = row_entries[0].front();
    null = e.def < leaves[0].max_def;
    value = std::move(e.value);
    return true;
  }

  // Dremel's record assembly: each leaf's entries placed along its steps. A repeated node's
  // element is chosen by a counter per repetition level, which an entry's repetition level
  // advances (and resets below it), so the leaves of one struct land in the same elements.
  bool next_json(nlohmann::ordered_json& out) {
    if (!next_row()) return false;
    out = nullptr;
    for (size_t i = 0; i < leaves.size(); ++i) {
      std::vector<size_t> index(size_t(leaves[i].max_rep) + 1, 0);
      for (LeafReader::Owned& e : row_entries[i]) {
        if (e.rep > 0) {
          ++index[size_t(e.rep)];
          std::fill(index.begin() + e.rep + 1, index.end(), 0);
        }
        nlohmann::ordered_json* slot = &out;
        for (const Step& s : paths[i]) {
          if (s.kind == Step::kNullable) {
            if (e.def < s.def) break;  // null here (and so below)
          } else if (s.kind == Step::kRepeated) {
            if (!slot->is_array()) *slot = nlohmann::ordered_json::array();
            if (e.def < s.def) break;  // an empty list
            const size_t k = index[size_t(s.rep)];
            while (slot->size() <= k) slot->push_back(nullptr);
            slot = &(*slot)[k];
          } else if (s.kind == Step::kKey) {
            if (!slot->is_object()) *slot = nlohmann::ordered_json::object();
            slot = &(*slot)[s.key];
          } else if (leaves[i].type == kByteArray) {
            *slot = std::move(e.value);  // moved: the row's strings are held once, not twice
          } else {
            *slot = std::move(e.scalar);
          }
        }
      }
    }
    return true;
  }
};

ParquetColumn::ParquetColumn(const fs::path& file, const std::string& column, Shape shape)
    : impl_(std::make_unique<Impl>()) {
  impl_->file.open(file);
  impl_->column = column;
  impl_->as_text = shape == Shape::Text;
  impl_->find_column();
  impl_->check_row_groups();
  impl_->seek(0);
}

ParquetColumn::~ParquetColumn() = default;
uint64_t ParquetColumn::rows() const {
  return impl_->rows();
}
uint64_t ParquetColumn::row() const {
  return impl_->row;
}
void ParquetColumn::seek(uint64_t row) {
  impl_->seek(row);
}
bool ParquetColumn::next(std::string& value, bool& null) {
  TITAN_CHECK(impl_->as_text, "ParquetColumn::next: column '", impl_->column, "' was opened as JSON");
  return impl_->next_text(value, null);
}
bool ParquetColumn::next_json(nlohmann::ordered_json& value) {
  return impl_->next_json(value);
}
const std::vector<std::string>& ParquetColumn::columns() const {
  return impl_->top_level;
}
const ParquetColumn::Layout& ParquetColumn::layout() const {
  return impl_->layout;
}

}  // namespace titan::data
