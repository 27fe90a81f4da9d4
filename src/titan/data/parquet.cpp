#include "titan/data/parquet.h"

#include <brotli/decode.h>
#include <lz4.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "titan/core/check.h"

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
  kDouble = 7,
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
      case kDouble:
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
        for (uint64_t i = 0; i < h.size; ++i) skip(h.type, true);
        return;
      }
      case kMap: {
        const uint64_t n = varint();
        if (n == 0) return;
        const uint8_t kv = byte();
        for (uint64_t i = 0; i < n; ++i) {
          skip(kv >> 4, true);
          skip(kv & 0x0f, true);
        }
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

enum PhysicalType { kByteArray = 6 };
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
    else if (id == 5 && type == kI32)
      e.num_children = t.i32();
    else if (id == 6 && type == kI32)
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
  out.reserve(count);
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
  if (block_size == 0 || block_size % 128 != 0 || miniblocks == 0 || block_size % miniblocks != 0 ||
      (block_size / miniblocks) % 32 != 0)
    throw Corrupt{std::string(what) + " has blocks of " + std::to_string(block_size) + " values in " +
                  std::to_string(miniblocks) +
                  " miniblocks (the format needs a multiple of 128 in miniblocks of "
                  "a multiple of 32)"};
  if (total != expected)
    throw Corrupt{std::string(what) + " hold " + std::to_string(total) + " values where the page has " +
                  std::to_string(expected)};
  out.clear();
  out.reserve(size_t(total));
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

void decompress(int codec, const uint8_t* src, size_t n, uint8_t* dst, size_t size) {
  auto wrong_size = [&](size_t got) {
    return Corrupt{"its " + codec_name(codec) + " data decompresses to " + std::to_string(got) +
                   " bytes where the page header says " + std::to_string(size)};
  };
  switch (codec) {
    case kSnappy: {
      size_t length = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(src), n, &length) != SNAPPY_OK)
        throw Corrupt{"its Snappy data is corrupt"};
      if (length != size) throw wrong_size(length);
      if (snappy_uncompress(reinterpret_cast<const char*>(src), n, reinterpret_cast<char*>(dst), &length) !=
          SNAPPY_OK)
        throw Corrupt{"its Snappy data is corrupt"};
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
      if (got != size) throw wrong_size(got);
      return;
    }
    case kZstd: {
      const size_t got = ZSTD_decompress(dst, size, src, n);
      if (ZSTD_isError(got))
        throw Corrupt{std::string("its zstd data is corrupt: ") + ZSTD_getErrorName(got)};
      if (got != size) throw wrong_size(got);
      return;
    }
    case kBrotli: {
      size_t got = size;
      if (BrotliDecoderDecompress(n, src, &got, dst) != BROTLI_DECODER_RESULT_SUCCESS)
        throw Corrupt{"its Brotli data is corrupt (or larger than the page header says)"};
      if (got != size) throw wrong_size(got);
      return;
    }
    case kLz4Raw: {
      if (n > size_t(INT32_MAX) || size > size_t(INT32_MAX)) throw Corrupt{"an LZ4 page over 2 GiB"};
      const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                          int(n), int(size));
      if (got < 0) throw Corrupt{"its LZ4 data is corrupt (or larger than the page header says)"};
      if (size_t(got) != size) throw wrong_size(size_t(got));
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

}  // namespace

// ---------------------------------------------------------------------------------------------

struct ParquetColumn::Impl {
  fs::path path;
  std::string column;
  std::FILE* file = nullptr;
  uint64_t file_size = 0;
  FileMeta meta;
  size_t leaf = 0;                        // the column's index among the leaves: its chunk in every row group
  bool optional = false;                  // definition levels 0 (null) / 1 (value)
  std::vector<uint64_t> group_first_row;  // row of the file each row group starts at

  // The row group being read.
  size_t group = 0;
  uint64_t chunk_pos = 0, chunk_end = 0;  // file offsets of the next page header and of the chunk's end
  int64_t chunk_values_left = 0;          // values (nulls included) of the chunk in pages not yet read
  std::vector<uint8_t> dictionary_bytes;
  std::vector<std::string_view> dictionary;
  bool has_dictionary = false;

  // The page being read: per row, whether it holds a value; the values; where the row stands.
  std::vector<uint8_t> page_bytes;       // the decompressed page
  std::vector<uint8_t> rebuilt;          // DELTA_BYTE_ARRAY's values, rebuilt from prefixes
  std::vector<uint32_t> defs;            // definition level of each row (optional columns)
  std::vector<std::string_view> values;  // the page's values, in order
  size_t page_rows = 0, page_row = 0, page_value = 0;
  uint64_t page_offset = 0;  // of the page's header, for errors

  Layout layout;
  uint64_t row = 0;        // of the file, the next next() returns
  uint64_t skip_rows = 0;  // rows still to skip after a seek, before the next value returned

  ~Impl() {
    if (file) std::fclose(file);
  }

  [[noreturn]] void fail_at(const std::string& what) const {
    TITAN_FAIL("dataset: ", path.string(), ": ", what);
  }
  [[noreturn]] void fail_page(const std::string& what) const {
    TITAN_FAIL("dataset: ", path.string(), ": column '", column, "', row group ", group, ", page at byte ",
               page_offset, ": ", what, " (the file is corrupt or truncated)");
  }

  void read_at(uint64_t offset, void* out, size_t n) {
    if (offset > file_size || n > file_size - offset)
      fail_at("a read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
              " runs past the end of the " + std::to_string(file_size) + "-byte file (truncated?)");
    if (n == 0) return;
    errno = 0;
    if (fseeko(file, off_t(offset), SEEK_SET) != 0 || std::fread(out, 1, n, file) != n)
      fail_at(std::string("read error at byte ") + std::to_string(offset) + ": " +
              (errno ? std::strerror(errno) : "short read"));
  }

  void open() {
    errno = 0;
    file = std::fopen(path.c_str(), "rb");
    if (!file) fail_at(std::string("cannot be opened: ") + (errno ? std::strerror(errno) : "unknown error"));
    std::error_code ec;
    file_size = fs::file_size(path, ec);
    if (ec) fail_at("cannot be sized: " + ec.message());
    if (file_size < 12)
      fail_at("is " + std::to_string(file_size) + " bytes, too short to be Parquet (it needs 12 at least)");
    char head[4], tail[8];
    read_at(0, head, 4);
    read_at(file_size - 8, tail, 8);
    if (std::memcmp(tail + 4, "PARE", 4) == 0)
      fail_at("is an encrypted Parquet file; titan reads unencrypted files only");
    if (std::memcmp(head, "PAR1", 4) != 0 || std::memcmp(tail + 4, "PAR1", 4) != 0)
      fail_at(std::string("is not a Parquet file: it does not ") +
              (std::memcmp(head, "PAR1", 4) != 0 ? "start" : "end") +
              " with the magic bytes PAR1 (a truncated copy, or another format named .parquet)");
    uint32_t footer_size;
    std::memcpy(&footer_size, tail, 4);
    if (uint64_t(footer_size) + 12 > file_size)
      fail_at("its footer claims " + std::to_string(footer_size) + " bytes of a " +
              std::to_string(file_size) + "-byte file (truncated or corrupt)");
    std::vector<uint8_t> footer(footer_size);
    read_at(file_size - 8 - footer_size, footer.data(), footer_size);
    try {
      Thrift t(footer.data(), footer.size());
      meta = read_file_meta(t);
    } catch (const Corrupt& c) {
      fail_at("its footer is corrupt: " + c.what);
    } catch (const NeedMore&) {
      fail_at("its footer is corrupt: it ends inside a value");
    }
    find_column();
    check_row_groups();
  }

  // The top-level field named `column`, and its index among the schema's leaves.
  void find_column() {
    const auto& schema = meta.schema;
    if (schema.empty() || schema[0].num_children < 0) fail_at("its footer holds no schema");
    std::vector<std::string> names;
    size_t leaves = 0, i = 1;
    // The end of the subtree at `at` (the schema lists the tree depth first), counting its leaves.
    auto subtree_end = [&](auto&& self, size_t at) -> size_t {
      if (at >= schema.size()) fail_at("its schema is corrupt: a group names more children than it lists");
      size_t next = at + 1;
      if (schema[at].num_children == 0) {
        ++leaves;
        return next;
      }
      for (int c = 0; c < schema[at].num_children; ++c) next = self(self, next);
      return next;
    };
    std::optional<size_t> found;
    size_t found_leaf = 0;
    for (int c = 0; c < schema[0].num_children; ++c) {
      names.push_back(schema[i].name);
      if (schema[i].name == column && !found) {
        found = i;
        found_leaf = leaves;
      }
      i = subtree_end(subtree_end, i);
    }
    if (!found) {
      std::string list;
      for (size_t n = 0; n < names.size() && n < 20; ++n) list += (n ? ", '" : "'") + names[n] + "'";
      if (names.size() > 20) list += ", ... (" + std::to_string(names.size()) + " in all)";
      fail_at("has no column '" + column +
              "' (training.text_field names the column to read; its columns are " +
              (names.empty() ? std::string("none") : list) + ")");
    }
    const SchemaElement& e = schema[*found];
    if (e.num_children > 0)
      fail_at(
          "column '" + column +
          "' is a nested group (a list, map or struct), not a string per row; titan reads a string column");
    if (e.type != kByteArray)
      fail_at("column '" + column + "' holds " + physical_type_name(e.type) + " values, not strings");
    if (e.repetition == kRepeated)
      fail_at("column '" + column + "' is repeated (a list of strings per row), not one string per row");
    if (const std::string other = non_text_annotation(e); !other.empty())
      fail_at("column '" + column + "' is annotated " + other + ", not text");
    leaf = found_leaf;
    optional = e.repetition == kOptional;
  }

  void check_row_groups() {
    uint64_t rows = 0;
    for (size_t g = 0; g < meta.row_groups.size(); ++g) {
      const RowGroup& rg = meta.row_groups[g];
      auto bad = [&](const std::string& what) { fail_at("row group " + std::to_string(g) + ": " + what); };
      if (rg.num_rows < 0) bad("a negative row count");
      if (leaf >= rg.columns.size()) bad("lists fewer column chunks than the schema has leaves");
      const ChunkMeta& c = rg.columns[leaf];
      if (c.encrypted) fail_at("column '" + column + "' is encrypted; titan reads unencrypted files only");
      if (c.external)
        bad("column '" + column + "' is stored in another file; titan reads self-contained files");
      if (c.path != std::vector<std::string>{column})
        bad("its column chunk " + std::to_string(leaf) + " is not column '" + column + "'");
      if (!codec_supported(c.codec))
        fail_at("column '" + column + "' is compressed with " + codec_name(c.codec) +
                ", which titan does not read (it reads UNCOMPRESSED, SNAPPY, GZIP, ZSTD, BROTLI and LZ4_RAW; "
                "rewrite the file with one of them)");
      if (c.num_values != rg.num_rows)
        bad("column '" + column + "' holds " + std::to_string(c.num_values) + " values for " +
            std::to_string(rg.num_rows) + " rows");
      const int64_t start = chunk_start(c);
      if (start < 4 || c.total_compressed_size < 0 || uint64_t(start) > file_size ||
          uint64_t(c.total_compressed_size) > file_size - uint64_t(start))
        bad("column '" + column + "' lies outside the file (bytes " + std::to_string(start) + " + " +
            std::to_string(c.total_compressed_size) + " of " + std::to_string(file_size) + ")");
      group_first_row.push_back(rows);
      rows += uint64_t(rg.num_rows);
    }
    if (rows != uint64_t(meta.num_rows))
      fail_at("its row groups hold " + std::to_string(rows) + " rows, its footer says " +
              std::to_string(meta.num_rows));
    group_first_row.push_back(rows);
  }

  // Where a chunk's pages start: its dictionary page when it has one. (Some writers set
  // dictionary_page_offset to 0 when there is none.)
  static int64_t chunk_start(const ChunkMeta& c) {
    if (c.dictionary_page_offset > 0 && c.dictionary_page_offset < c.data_page_offset)
      return c.dictionary_page_offset;
    return c.data_page_offset;
  }

  void start_group(size_t g) {
    group = g;
    page_rows = page_row = 0;
    values.clear();
    has_dictionary = false;
    if (g >= meta.row_groups.size()) return;
    const ChunkMeta& c = meta.row_groups[g].columns[leaf];
    chunk_pos = uint64_t(chunk_start(c));
    chunk_end = chunk_pos + uint64_t(c.total_compressed_size);
    chunk_values_left = c.num_values;
    ++layout.row_groups;
    layout.codecs.insert(codec_name(c.codec));
  }

  // The header of the page at chunk_pos, and its size in bytes.
  PageHeader read_header(size_t& header_bytes) {
    std::vector<uint8_t> buf;
    for (size_t want = 256;; want *= 4) {
      const size_t n = size_t(std::min<uint64_t>(want, chunk_end - chunk_pos));
      buf.resize(n);
      read_at(chunk_pos, buf.data(), n);
      try {
        Thrift t(buf.data(), n);
        PageHeader h = read_page_header(t);
        header_bytes = t.consumed();
        return h;
      } catch (const NeedMore&) {
        if (n == chunk_end - chunk_pos) fail_page("its header runs past the end of the column chunk");
      } catch (const Corrupt& c) {
        fail_page("its header is corrupt: " + c.what);
      }
    }
  }

  // The page's stored bytes, CRC-checked where the writer stored a CRC.
  std::vector<uint8_t> read_page_body(const PageHeader& h, uint64_t body_at) {
    std::vector<uint8_t> stored(size_t(h.compressed_size));
    read_at(body_at, stored.data(), stored.size());
    if (h.has_crc) {
      const uint32_t crc = uint32_t(crc32(0, stored.data(), uInt(stored.size())));
      if (crc != h.crc) fail_page("its CRC does not match its bytes");
    }
    return stored;
  }

  // `stored` decompressed (from `from` on; bytes before it are copied as they are) into page_bytes.
  void decompress_into_page(const std::vector<uint8_t>& stored, size_t from, bool compressed, int32_t size) {
    page_bytes.resize(size_t(size));
    if (from > stored.size() || from > page_bytes.size()) fail_page("its level bytes run past the page");
    std::memcpy(page_bytes.data(), stored.data(), from);
    const int codec = meta.row_groups[group].columns[leaf].codec;
    if (!compressed || codec == kUncompressed) {
      if (stored.size() != page_bytes.size())
        fail_page("it stores " + std::to_string(stored.size()) + " bytes uncompressed but its header says " +
                  std::to_string(size));
      std::memcpy(page_bytes.data() + from, stored.data() + from, stored.size() - from);
      return;
    }
    try {
      decompress(codec, stored.data() + from, stored.size() - from, page_bytes.data() + from,
                 page_bytes.size() - from);
    } catch (const Corrupt& c) {
      fail_page(c.what);
    }
  }

  // Byte-array values of `encoding` from `in`: `count` of them into `out` (views into page_bytes,
  // the dictionary or `rebuilt`).
  void decode_values(Bytes in, int encoding, size_t count, std::vector<std::string_view>& out) {
    out.clear();
    out.reserve(count);
    switch (encoding) {
      case kPlain:
        for (size_t i = 0; i < count; ++i) {
          const uint32_t n = in.u32le("a PLAIN value's length");
          in.need(n, "a PLAIN value");
          out.emplace_back(reinterpret_cast<const char*>(in.p), n);
          in.p += n;
        }
        return;
      case kPlainDictionary:
      case kRleDictionary: {
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
        return;
      }
      case kDeltaLengthByteArray: {
        std::vector<int64_t> lengths;
        decode_delta_binary_packed(in, count, lengths, "the DELTA_LENGTH_BYTE_ARRAY lengths");
        if (lengths.size() != count)
          throw Corrupt{"it holds " + std::to_string(lengths.size()) + " lengths for " +
                        std::to_string(count) + " values"};
        for (int64_t n : lengths) {
          if (n < 0) throw Corrupt{"a negative value length"};
          in.need(size_t(n), "a DELTA_LENGTH_BYTE_ARRAY value");
          out.emplace_back(reinterpret_cast<const char*>(in.p), size_t(n));
          in.p += n;
        }
        return;
      }
      case kDeltaByteArray: {
        std::vector<int64_t> prefixes, suffixes;
        decode_delta_binary_packed(in, count, prefixes, "the DELTA_BYTE_ARRAY prefix lengths");
        decode_delta_binary_packed(in, count, suffixes, "the DELTA_BYTE_ARRAY suffix lengths");
        if (prefixes.size() != count || suffixes.size() != count)
          throw Corrupt{"it holds " + std::to_string(prefixes.size()) + " prefixes and " +
                        std::to_string(suffixes.size()) + " suffixes for " + std::to_string(count) +
                        " values"};
        // Each value is the previous one's first `prefix` bytes and its own suffix.
        std::vector<size_t> ends(count);
        rebuilt.clear();
        size_t previous_start = 0, previous_size = 0;
        for (size_t i = 0; i < count; ++i) {
          if (prefixes[i] < 0 || suffixes[i] < 0 || size_t(prefixes[i]) > previous_size)
            throw Corrupt{"value " + std::to_string(i) + " has a prefix of " + std::to_string(prefixes[i]) +
                          " bytes of a previous value of " + std::to_string(previous_size)};
          in.need(size_t(suffixes[i]), "a DELTA_BYTE_ARRAY suffix");
          const size_t start = rebuilt.size(), prefix = size_t(prefixes[i]);
          rebuilt.resize(start + prefix);  // may move the bytes: copy from data() after it
          std::memcpy(rebuilt.data() + start, rebuilt.data() + previous_start, prefix);
          rebuilt.insert(rebuilt.end(), in.p, in.p + suffixes[i]);
          in.p += suffixes[i];
          previous_start = start;
          previous_size = rebuilt.size() - start;
          ends[i] = rebuilt.size();
        }
        for (size_t i = 0, start = 0; i < count; start = ends[i++])
          out.emplace_back(reinterpret_cast<const char*>(rebuilt.data()) + start, ends[i] - start);
        return;
      }
      default:
        throw Corrupt{"its values are " + encoding_name(encoding) +
                      "-encoded, which a string column cannot be"};
    }
  }

  // Reads the next data page of the group into `values` (a dictionary page before it into the
  // dictionary). Whole pages of rows still to skip are passed over by their headers. False when
  // the chunk has no page left.
  bool load_page() {
    while (chunk_values_left > 0) {
      if (chunk_pos >= chunk_end)
        fail_at("column '" + column + "', row group " + std::to_string(group) + ": its pages end " +
                std::to_string(chunk_values_left) + " values short of the chunk's " +
                std::to_string(meta.row_groups[group].columns[leaf].num_values) +
                " (the file is corrupt or truncated)");
      page_offset = chunk_pos;
      size_t header_bytes = 0;
      const PageHeader h = read_header(header_bytes);
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
      if (h.type == kDataPageV2 && h.num_rows >= 0 && h.num_rows != h.num_values)
        fail_page("a flat column's page holds " + std::to_string(h.num_values) + " values in " +
                  std::to_string(h.num_rows) + " rows");
      if (skip_rows >= uint64_t(h.num_values)) {  // the whole page lies before the row sought
        skip_rows -= uint64_t(h.num_values);
        continue;
      }
      try {
        load_data_page(h, body_at);
      } catch (const Corrupt& c) {
        fail_page(c.what);
      }
      page_row = size_t(skip_rows);
      page_value = 0;
      for (size_t r = 0; r < page_row; ++r) page_value += row_has_value(r);
      skip_rows = 0;
      return true;
    }
    return false;
  }

  bool row_has_value(size_t r) const { return !optional || defs[r] == 1; }

  void load_dictionary(const PageHeader& h, uint64_t body_at) {
    if (h.encoding != kPlain && h.encoding != kPlainDictionary)
      fail_page("its dictionary is " + encoding_name(h.encoding) + "-encoded (the format stores it PLAIN)");
    if (h.num_values < 0) fail_page("its dictionary has a negative size");
    const std::vector<uint8_t> stored = read_page_body(h, body_at);
    decompress_into_page(stored, 0, true, h.uncompressed_size);
    dictionary_bytes.swap(page_bytes);
    try {
      decode_values(Bytes{dictionary_bytes.data(), dictionary_bytes.data() + dictionary_bytes.size()}, kPlain,
                    size_t(h.num_values), dictionary);
    } catch (const Corrupt& c) {
      fail_page("its dictionary: " + c.what);
    }
    has_dictionary = true;
    ++layout.dictionary_pages;
  }

  void load_data_page(const PageHeader& h, uint64_t body_at) {
    const std::vector<uint8_t> stored = read_page_body(h, body_at);
    const size_t rows = size_t(h.num_values);
    Bytes in{nullptr, nullptr};
    if (h.type == kDataPageV2) {
      if (h.rep_bytes != 0) throw Corrupt{"a flat column's page has repetition levels"};
      if (h.def_bytes < 0) throw Corrupt{"a negative definition-level size"};
      decompress_into_page(stored, size_t(h.def_bytes), h.values_compressed, h.uncompressed_size);
      in = Bytes{page_bytes.data(), page_bytes.data() + page_bytes.size()};
      if (optional) {
        Bytes levels{in.p, in.p + h.def_bytes};
        decode_hybrid(levels, 1, rows, defs, "the definition levels");
      } else if (h.def_bytes != 0) {
        throw Corrupt{"a required column's page has definition levels"};
      }
      in.p += h.def_bytes;
    } else {
      decompress_into_page(stored, 0, true, h.uncompressed_size);
      in = Bytes{page_bytes.data(), page_bytes.data() + page_bytes.size()};
      if (optional) {
        if (h.level_encoding != kRle)
          throw Corrupt{"its definition levels are " + encoding_name(h.level_encoding) +
                        "-encoded (titan reads RLE)"};
        const uint32_t n = in.u32le("the definition levels' length");
        in.need(n, "the definition levels");
        Bytes levels{in.p, in.p + n};
        decode_hybrid(levels, 1, rows, defs, "the definition levels");
        in.p += n;
      }
    }
    size_t present = rows;
    if (optional) {
      present = 0;
      for (uint32_t d : defs) {
        if (d > 1)
          throw Corrupt{"a definition level of " + std::to_string(d) + " in a column whose maximum is 1"};
        present += d;
      }
    }
    decode_values(in, h.encoding, present, values);
    page_rows = rows;
    ++(h.type == kDataPageV2 ? layout.v2_pages : layout.v1_pages);
    layout.encodings.insert(encoding_name(h.encoding));
  }

  void seek(uint64_t target) {
    if (target > meta_rows())
      fail_at("row " + std::to_string(target) + " is past its " + std::to_string(meta_rows()) + " rows");
    const size_t g = size_t(std::upper_bound(group_first_row.begin(), group_first_row.end(), target) -
                            group_first_row.begin()) -
                     1;
    start_group(std::min(g, meta.row_groups.size()));
    skip_rows = target - group_first_row[std::min(g, meta.row_groups.size())];
    row = target;
  }

  uint64_t meta_rows() const { return uint64_t(meta.num_rows); }

  bool next(std::string& value, bool& null) {
    while (page_row >= page_rows) {
      if (group >= meta.row_groups.size()) return false;
      if (!load_page()) start_group(group + 1);
    }
    null = !row_has_value(page_row);
    if (!null) {
      if (page_value >= values.size()) fail_page("it holds fewer values than its definition levels say");
      value.assign(values[page_value].data(), values[page_value].size());
      ++page_value;
    } else {
      value.clear();
    }
    ++page_row;
    ++row;
    return true;
  }
};

ParquetColumn::ParquetColumn(const fs::path& file, const std::string& column)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = file;
  impl_->column = column;
  impl_->open();
  impl_->seek(0);
}

ParquetColumn::~ParquetColumn() = default;
uint64_t ParquetColumn::rows() const {
  return impl_->meta_rows();
}
uint64_t ParquetColumn::row() const {
  return impl_->row;
}
void ParquetColumn::seek(uint64_t row) {
  impl_->seek(row);
}
bool ParquetColumn::next(std::string& value, bool& null) {
  return impl_->next(value, null);
}
const ParquetColumn::Layout& ParquetColumn::layout() const {
  return impl_->layout;
}

}  // namespace titan::data
