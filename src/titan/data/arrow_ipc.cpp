#include "titan/data/arrow_ipc.h"

#include <lz4frame.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>

#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/data/table_file.h"

// The layout read here is the Arrow columnar format specification's (arrow.apache.org, "Arrow
// Columnar Format": "Serialization and Interprocess Communication") with the flatbuffer schemas of
// format/Message.fbs and format/Schema.fbs, whose field slots the readers below name.
namespace titan::data {
namespace fs = std::filesystem;

namespace {

// Something in the file breaks the format; the reader adds the file and where.
struct Corrupt {
  std::string what;
};
// Something in the file breaks a limit titan holds every file to (table_file.h).
struct Refused {
  std::string what;
};

// ---------------------------------------------------------------------------------------------
// Flatbuffers (the encoding of every message's metadata), read with bounds checks.

class FlatBuffer {
 public:
  FlatBuffer(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <class T>
  T scalar(size_t at) const {
    if (at > size_ || sizeof(T) > size_ - at) throw Corrupt{"a flatbuffer read runs past its end"};
    T v;
    std::memcpy(&v, data_ + at, sizeof(T));
    return v;
  }

  class Table {
   public:
    Table(const FlatBuffer& fb, size_t pos) : fb_(&fb), pos_(pos) {
      const int64_t vtable = int64_t(pos) - int64_t(fb.scalar<int32_t>(pos));
      if (vtable < 0 || size_t(vtable) + 4 > fb.size_)
        throw Corrupt{"a flatbuffer table's vtable lies outside it"};
      vtable_ = size_t(vtable);
      vsize_ = fb.scalar<uint16_t>(vtable_);
    }
    // Where field `slot` is stored; 0 when the table leaves it out (its default).
    size_t field(int slot) const {
      const size_t entry = 4 + 2 * size_t(slot);
      if (entry + 2 > vsize_) return 0;
      const uint16_t offset = fb_->scalar<uint16_t>(vtable_ + entry);
      return offset ? pos_ + offset : 0;
    }
    template <class T>
    T get(int slot, T fallback = T()) const {
      const size_t at = field(slot);
      return at ? fb_->scalar<T>(at) : fallback;
    }
    // The object an offset field points at (a table, vector or string), or nullopt when absent.
    std::optional<size_t> target(int slot) const {
      const size_t at = field(slot);
      if (!at) return std::nullopt;
      return at + fb_->scalar<uint32_t>(at);
    }
    std::optional<Table> table(int slot) const {
      const auto at = target(slot);
      if (!at) return std::nullopt;
      return Table(*fb_, *at);
    }
    // A vector's element count and the position of its first element.
    std::pair<size_t, size_t> vector(int slot) const {
      const auto at = target(slot);
      if (!at) return {0, 0};
      const uint32_t n = fb_->scalar<uint32_t>(*at);
      return {n, *at + 4};
    }
    std::string string(int slot) const {
      const auto [n, start] = vector(slot);
      if (start > fb_->size_ || n > fb_->size_ - start)
        throw Corrupt{"a flatbuffer string runs past its end"};
      return n ? std::string(reinterpret_cast<const char*>(fb_->data_ + start), n) : std::string();
    }
    // Element `i` of a vector of tables.
    Table table_at(size_t vector_start, size_t i) const {
      const size_t at = vector_start + 4 * i;
      return Table(*fb_, at + fb_->scalar<uint32_t>(at));
    }
    const FlatBuffer& buffer() const { return *fb_; }

   private:
    const FlatBuffer* fb_;
    size_t pos_, vtable_ = 0;
    uint16_t vsize_ = 0;
  };

  Table root() const { return Table(*this, scalar<uint32_t>(0)); }

 private:
  const uint8_t* data_;
  size_t size_;
};
using Table = FlatBuffer::Table;

// ---------------------------------------------------------------------------------------------
// The schema.

enum TypeId {
  kNull = 1,
  kInt = 2,
  kFloatingPoint = 3,
  kBinary = 4,
  kUtf8 = 5,
  kBool = 6,
  kDecimal = 7,
  kDate = 8,
  kTime = 9,
  kTimestamp = 10,
  kInterval = 11,
  kList = 12,
  kStruct = 13,
  kUnion = 14,
  kFixedSizeBinary = 15,
  kFixedSizeList = 16,
  kMap = 17,
  kDuration = 18,
  kLargeBinary = 19,
  kLargeUtf8 = 20,
  kLargeList = 21,
  kRunEndEncoded = 22,
  kBinaryView = 23,
  kUtf8View = 24,
  kListView = 25,
  kLargeListView = 26
};

std::string type_name(int type) {
  static const char* names[] = {"NONE",          "Null",      "Int",           "FloatingPoint",
                                "Binary",        "Utf8",      "Bool",          "Decimal",
                                "Date",          "Time",      "Timestamp",     "Interval",
                                "List",          "Struct",    "Union",         "FixedSizeBinary",
                                "FixedSizeList", "Map",       "Duration",      "LargeBinary",
                                "LargeUtf8",     "LargeList", "RunEndEncoded", "BinaryView",
                                "Utf8View",      "ListView",  "LargeListView"};
  return type >= 0 && type < 27 ? names[type] : "type " + std::to_string(type);
}

struct FieldInfo {
  std::string name;
  int type = 0;
  int bit_width = 0;  // Int; FloatingPoint: 32 or 64 (16, half precision, is not read)
  bool is_signed = false;
  bool dense_union = false;
  bool dictionary = false;  // dictionary-encoded: its buffers are the indices'
  std::vector<FieldInfo> children;
};

// Schema.fbs's Field: name 0, nullable 1, type_type 2, type 3, dictionary 4, children 5.
// `budget` counts the fields read: flatbuffer offsets may be shared, so a small schema could name
// exponentially many.
FieldInfo read_field(const Table& t, size_t& budget, int depth = 0) {
  if (depth > 64) throw Corrupt{"fields nested more than 64 deep"};
  if (++budget > 65536) throw Corrupt{"more than 65536 fields"};
  FieldInfo f;
  f.name = t.string(0);
  f.type = t.get<uint8_t>(2);
  if (const auto type = t.table(3)) {
    if (f.type == kInt) {
      f.bit_width = type->get<int32_t>(0);
      f.is_signed = type->get<uint8_t>(1) != 0;
    } else if (f.type == kFloatingPoint) {  // precision: HALF 0, SINGLE 1, DOUBLE 2
      const int16_t precision = type->get<int16_t>(0);
      f.bit_width = precision == 1 ? 32 : precision == 2 ? 64 : 16;
    } else if (f.type == kUnion) {
      f.dense_union = type->get<int16_t>(0) == 1;
    }
  }
  f.dictionary = t.field(4) != 0;
  const auto [n, start] = t.vector(5);
  for (size_t i = 0; i < n; ++i) f.children.push_back(read_field(t.table_at(start, i), budget, depth + 1));
  return f;
}

// The buffers a field's own array has in a record batch (its children's follow); -1 for a type
// whose layout is not known here. `variadic` counts the view types' data buffers (one per such field).
int own_buffers(const FieldInfo& f, const std::vector<int64_t>& variadic, size_t& next_variadic,
                bool before_v5) {
  if (f.dictionary) return 2;  // validity and indices
  switch (f.type) {
    case kNull:
    case kRunEndEncoded:
      return 0;
    case kInt:
    case kFloatingPoint:
    case kBool:
    case kDecimal:
    case kDate:
    case kTime:
    case kTimestamp:
    case kInterval:
    case kDuration:
    case kFixedSizeBinary:
    case kList:
    case kLargeList:
    case kMap:
      return 2;
    case kBinary:
    case kUtf8:
    case kLargeBinary:
    case kLargeUtf8:
    case kListView:
    case kLargeListView:
      return 3;
    case kStruct:
    case kFixedSizeList:
      return 1;
    case kUnion:  // before MetadataVersion V5 (Arrow 1.0) a union had a validity buffer too
      return (f.dense_union ? 2 : 1) + (before_v5 ? 1 : 0);
    case kBinaryView:
    case kUtf8View:
      if (next_variadic >= variadic.size()) throw Corrupt{"a view field has no variadic buffer count"};
      if (variadic[next_variadic] < 0 || variadic[next_variadic] > (1 << 20))
        throw Corrupt{"a view field has " + std::to_string(variadic[next_variadic]) + " variadic buffers"};
      return 2 + int(variadic[next_variadic++]);
    default:
      return -1;
  }
}

// ---------------------------------------------------------------------------------------------
// One record batch's arrays of the column read.

struct Span {
  int64_t offset = 0, length = 0;
};

// A column's array in one batch: its node (length, nulls), its buffers' bytes, its children.
struct Array {
  const FieldInfo* field = nullptr;
  int64_t length = 0, null_count = 0;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<Array> children;

  bool valid(int64_t i) const {
    if (null_count == 0 || buffers.empty() || buffers[0].empty()) return true;
    return (buffers[0][size_t(i / 8)] >> (i % 8)) & 1;
  }
  template <class T>
  T at(size_t buffer, int64_t i) const {
    T v;
    std::memcpy(&v, buffers[buffer].data() + size_t(i) * sizeof(T), sizeof(T));
    return v;
  }
  // [begin, end) of element i in the offsets buffer (32- or 64-bit offsets).
  std::pair<int64_t, int64_t> range(int64_t i, bool large) const {
    return large ? std::pair{at<int64_t>(1, i), at<int64_t>(1, i + 1)}
                 : std::pair{int64_t(at<int32_t>(1, i)), int64_t(at<int32_t>(1, i + 1))};
  }
  // Checks that the buffers hold what `length` elements need, and each offset lies in its target,
  // so that reading never leaves them.
  void check() const {
    const auto need = [&](size_t buffer, uint64_t bytes, const char* what) {
      if (buffers.size() <= buffer || buffers[buffer].size() < bytes)
        throw Corrupt{"its " + std::string(what) + " buffer holds " +
                      std::to_string(buffers.size() <= buffer ? 0 : buffers[buffer].size()) +
                      " bytes where " + std::to_string(length) + " values need " + std::to_string(bytes)};
    };
    // A Null array has no buffers to check; its null count is its length (apache-arrow writes -1).
    // 2^32 values per array and batch bounds every size below far from overflow.
    if (length > (int64_t(1) << 32)) throw Corrupt{"an array of " + std::to_string(length) + " values"};
    if (length < 0 || (field->type != kNull && (null_count < 0 || null_count > length)))
      throw Corrupt{"a negative length or null count"};
    if (null_count > 0 && field->type != kNull && !buffers.empty() && !buffers[0].empty())
      need(0, uint64_t(length + 7) / 8, "validity");
    const bool large = field->type == kLargeUtf8 || field->type == kLargeList;
    switch (field->type) {
      case kUtf8:
      case kLargeUtf8:
      case kList:
      case kLargeList: {
        if (length == 0) break;  // an empty array may have no offsets at all (older arrow-rs and Java)
        need(1, uint64_t(length + 1) * (large ? 8 : 4), "offsets");
        const int64_t limit = field->type == kUtf8 || field->type == kLargeUtf8
                                  ? int64_t(buffers.size() > 2 ? buffers[2].size() : 0)
                                  : (children.empty() ? 0 : children[0].length);
        for (int64_t i = 0; i < length; ++i) {
          const auto [b, e] = range(i, large);
          if (b < 0 || b > e || e > limit)
            throw Corrupt{"element " + std::to_string(i) + "'s offsets [" + std::to_string(b) + ", " +
                          std::to_string(e) + ") leave the " + std::to_string(limit) + " it indexes"};
        }
        break;
      }
      case kFloatingPoint:
      case kInt:
        need(1, uint64_t(length) * uint64_t(field->bit_width / 8), "values");
        break;
      case kBool:
        need(1, uint64_t(length + 7) / 8, "values");
        break;
      case kStruct:
        for (const Array& c : children)
          if (c.length < length) throw Corrupt{"a struct's field holds fewer values than the struct"};
        break;
      case kUtf8View: {
        // 16-byte views: a length, then up to 12 bytes inline, or a 4-byte prefix, the index of a
        // variadic data buffer (buffers 2, 3, ...) and the offset of the bytes in it. (A null
        // value's view may hold anything: it is never read.)
        need(1, uint64_t(length) * 16, "views");
        for (int64_t i = 0; i < length; ++i) {
          if (!valid(i)) continue;
          const int32_t size = at<int32_t>(1, 4 * i), index = at<int32_t>(1, 4 * i + 2),
                        offset = at<int32_t>(1, 4 * i + 3);
          if (size < 0) throw Corrupt{"element " + std::to_string(i) + "'s view has a negative length"};
          if (size <= 12) continue;
          if (index < 0 || size_t(index) + 2 >= buffers.size() || offset < 0 ||
              uint64_t(offset) + uint64_t(size) > buffers[size_t(index) + 2].size())
            throw Corrupt{"element " + std::to_string(i) + "'s view (" + std::to_string(size) + " bytes at " +
                          std::to_string(offset) + " of data buffer " + std::to_string(index) +
                          ") leaves the " + std::to_string(buffers.size() - 2) + " data buffers"};
        }
        break;
      }
      default:
        break;
    }
    for (const Array& c : children) c.check();
  }

  // What buffer k needs at most for the array's values, from its buffers before it (a data buffer: the
  // bytes its offsets reach, or its views name), padded to 64 bytes as writers may pad it; and how it
  // is counted, for messages. No bound (UINT64_MAX) for a type whose size the reader does not know.
  struct Need {
    uint64_t bytes;
    std::string what;
  };
  std::vector<uint64_t> view_ends;  // of each variadic data buffer, the end of the bytes a view names
  Need need(size_t k, size_t buffer_count) {
    const uint64_t n = uint64_t(std::clamp<int64_t>(length, 0, int64_t(1) << 32));  // check() refuses more
    const auto padded = [](uint64_t bytes, const std::string& what) {
      return Need{(bytes + 63) / 64 * 64, what + ", padded to 64"};
    };
    const std::string values = std::to_string(n) + " values";
    if (k == 0) return padded((n + 7) / 8, "a validity bit for each of its " + values);
    const bool large = field->type == kLargeUtf8 || field->type == kLargeList;
    const uint64_t width = large ? 8 : 4;
    switch (field->type) {
      case kInt:
      case kFloatingPoint:
        return padded(n * uint64_t(field->bit_width / 8),
                      values + " of " + std::to_string(field->bit_width / 8) + " bytes");
      case kBool:
        return padded((n + 7) / 8, "a bit for each of its " + values);
      case kList:
      case kLargeList:
        return padded((n + 1) * width, "the offsets of its " + values);
      case kUtf8:
      case kLargeUtf8: {
        if (k == 1) return padded((n + 1) * width, "the offsets of its " + values);
        uint64_t end = 0;  // what the last offset reaches (short offsets reach nothing: check() names them)
        if (n > 0 && buffers[1].size() >= (n + 1) * width)
          end = uint64_t(std::max<int64_t>(range(int64_t(n) - 1, large).second, 0));
        return padded(end, "the " + std::to_string(end) + " bytes its offsets reach");
      }
      case kUtf8View: {
        if (k == 1) return padded(n * 16, "the 16-byte views of its " + values);
        if (view_ends.empty()) {
          // Null views may hold anything (which only loosens the bound), and are passed over where
          // the validity bits are at hand.
          view_ends.assign(buffer_count - 2, 0);
          const bool bits = null_count > 0 && buffers[0].size() >= (n + 7) / 8;
          for (uint64_t i = 0; i < std::min<uint64_t>(n, buffers[1].size() / 16); ++i) {
            if (bits && !valid(int64_t(i))) continue;
            const int32_t size = at<int32_t>(1, int64_t(4 * i)), index = at<int32_t>(1, int64_t(4 * i + 2)),
                          offset = at<int32_t>(1, int64_t(4 * i + 3));
            if (size > 12 && index >= 0 && size_t(index) < view_ends.size() && offset >= 0)
              view_ends[size_t(index)] =
                  std::max(view_ends[size_t(index)], uint64_t(offset) + uint64_t(size));
          }
        }
        return padded(view_ends[k - 2],
                      "the " + std::to_string(view_ends[k - 2]) + " bytes its views name in it");
      }
      default:
        return {UINT64_MAX, ""};
    }
  }
  // Buffer k's name, for messages.
  std::string buffer_name(size_t k) const {
    if (k == 0) return "validity buffer";
    switch (field->type) {
      case kUtf8:
      case kLargeUtf8:
        return k == 1 ? "offsets buffer" : "data buffer";
      case kList:
      case kLargeList:
        return "offsets buffer";
      case kUtf8View:
        return k == 1 ? "views buffer" : "data buffer " + std::to_string(k - 2);
      default:
        return "values buffer";
    }
  }

  std::string_view string(int64_t i) const {
    if (field->type == kUtf8View) {
      const char* view = reinterpret_cast<const char*>(buffers[1].data()) + 16 * i;
      const int32_t size = at<int32_t>(1, 4 * i);
      if (size <= 12) return {view + 4, size_t(size)};
      const int32_t index = at<int32_t>(1, 4 * i + 2), offset = at<int32_t>(1, 4 * i + 3);
      return {reinterpret_cast<const char*>(buffers[size_t(index) + 2].data()) + offset, size_t(size)};
    }
    const auto [b, e] = range(i, field->type == kLargeUtf8);
    return {reinterpret_cast<const char*>(buffers[2].data()) + b, size_t(e - b)};
  }

  // What row i holds, counted before json() builds any of it: its JSON values, which lengths that
  // need no buffer (a Null array's, a struct's without fields) could otherwise make any number of,
  // and its strings' bytes, which string views pointing at the same bytes could multiply.
  struct RowSize {
    uint64_t values = 0, bytes = 0;
  };
  void measure(int64_t i, RowSize& size) const {
    if (++size.values > kMaxRowValues) throw Corrupt{"a row holds more than 2^24 values"};
    if (field->type == kNull || !valid(i)) return;
    switch (field->type) {
      case kUtf8:
      case kLargeUtf8:
      case kUtf8View:
        size.bytes += string(i).size();
        if (size.bytes > kMaxRowBytes) throw Corrupt{too_many_row_bytes(size.bytes)};
        return;
      case kList:
      case kLargeList: {
        const auto [b, e] = range(i, field->type == kLargeList);
        for (int64_t k = b; k < e; ++k) children[0].measure(k, size);
        return;
      }
      case kStruct:
        for (const Array& c : children) c.measure(i, size);
        return;
      default:
        return;
    }
  }

  // Row i as JSON, once measure() has accepted it.
  nlohmann::ordered_json json(int64_t i) const {
    if (field->type == kNull || !valid(i)) return nullptr;
    switch (field->type) {
      case kUtf8:
      case kLargeUtf8:
      case kUtf8View:
        return std::string(string(i));
      case kList:
      case kLargeList: {
        auto out = nlohmann::ordered_json::array();
        const auto [b, e] = range(i, field->type == kLargeList);
        for (int64_t k = b; k < e; ++k) out.push_back(children[0].json(k));
        return out;
      }
      case kStruct: {
        auto out = nlohmann::ordered_json::object();
        for (const Array& c : children) out[c.field->name] = c.json(i);
        return out;
      }
      case kBool:
        return bool((buffers[1][size_t(i / 8)] >> (i % 8)) & 1);
      case kFloatingPoint:
        return field->bit_width == 32 ? double(at<float>(1, i)) : at<double>(1, i);
      case kInt:
        switch (field->bit_width) {
          case 8:
            return field->is_signed ? int64_t(at<int8_t>(1, i)) : int64_t(at<uint8_t>(1, i));
          case 16:
            return field->is_signed ? int64_t(at<int16_t>(1, i)) : int64_t(at<uint16_t>(1, i));
          case 32:
            return field->is_signed ? int64_t(at<int32_t>(1, i)) : int64_t(at<uint32_t>(1, i));
          default:
            if (field->is_signed) return at<int64_t>(1, i);
            return at<uint64_t>(1, i);
        }
      default:
        return nullptr;  // refused when the file opens
    }
  }
};

// The field path of a type Json reads (strings, lists, structs, integers, booleans, nulls).
void check_json_types(const FieldInfo& f, const std::string& path, const fs::path& file) {
  const bool readable =
      !f.dictionary &&
      (f.type == kUtf8 || f.type == kLargeUtf8 || f.type == kUtf8View || f.type == kList ||
       f.type == kLargeList || f.type == kStruct || f.type == kBool ||
       (f.type == kFloatingPoint && f.bit_width >= 32) || f.type == kNull ||
       (f.type == kInt && (f.bit_width == 8 || f.bit_width == 16 || f.bit_width == 32 || f.bit_width == 64)));
  TITAN_CHECK(readable, "dataset: ", file.string(), ": '", path, "' is ",
              f.dictionary ? "dictionary-encoded " : "", type_name(f.type),
              "; titan reads strings, lists, structs, integers, floats and booleans of a column (Arrow IPC)");
  for (const FieldInfo& c : f.children) check_json_types(c, path + "." + c.name, file);
}

// Message.fbs's CompressionType, and none.
enum class BodyCodec { kNone = -1, kLz4Frame = 0, kZstd = 1 };

// The LZ4 frame of `n` bytes at `src` decoded into `dst` (`capacity` bytes), or where `dst` is null
// only counted, through a small buffer, and stopped once past `capacity`. Returns the bytes it
// decoded (counted); throws when the data is not one whole frame (of which it counted no more than
// `capacity`).
uint64_t lz4_frame(const uint8_t* src, size_t n, uint8_t* dst, uint64_t capacity, const std::string& declared,
                   const std::string& wrong_length) {
  LZ4F_dctx* created = nullptr;
  if (LZ4F_isError(LZ4F_createDecompressionContext(&created, LZ4F_VERSION)))
    throw Corrupt{"no LZ4 decompression context"};
  const std::unique_ptr<LZ4F_dctx, LZ4F_errorCode_t (*)(LZ4F_dctx*)> ctx(created,
                                                                         LZ4F_freeDecompressionContext);
  std::vector<uint8_t> scratch(dst ? 0 : size_t(64) << 10);
  uint64_t written = 0;
  size_t read = 0, hint = 1;
  while (hint != 0 && read < n && written <= capacity) {
    size_t room = dst ? size_t(capacity - written) : scratch.size(), chunk = n - read;
    hint =
        LZ4F_decompress(ctx.get(), dst ? dst + written : scratch.data(), &room, src + read, &chunk, nullptr);
    if (LZ4F_isError(hint))
      throw Corrupt{std::string("its LZ4 frame is corrupt: ") + LZ4F_getErrorName(hint) + wrong_length};
    written += room;
    read += chunk;
    if (room == 0 && chunk == 0) break;  // no progress: the output is full
  }
  if (written > capacity) return written;  // counted past what was declared
  if (hint != 0 || read != n)
    throw Corrupt{"an LZ4 buffer does not hold one whole frame of the " + declared + " bytes it declares" +
                  wrong_length};
  return written;
}

// A buffer of a compressed record batch: an int64 (little-endian) uncompressed length, then the
// data compressed with `codec`, or as it is where the length is -1 (a writer stores a buffer that
// would not shrink uncompressed). `budget` is what the batch's buffers may still unpack to before
// anything proves it (the caller's believed_unpacked_bytes of its body, which buffers sharing their
// bytes cannot multiply): a declared length within it is allocated and decoded at once and taken
// from it. A longer one is held to what its array needs (`need()`, where its type tells), and with
// the batch's other such buffers (`counted`) to kMaxCountedBytes, and then allocated only once the
// data, decoded and counted through a small buffer, proves it (table_file.h says why), so a forged
// length claims no memory its data does not decode to, nor more than its array can use. The data
// must decompress to exactly the declared length.
template <class NeedFn>
std::vector<uint8_t> decompress_buffer(BodyCodec codec, const std::vector<uint8_t>& stored, uint64_t& budget,
                                       uint64_t& counted, NeedFn&& need) {
  if (stored.empty()) return {};
  if (stored.size() < 8) throw Corrupt{"a compressed buffer shorter than its 8-byte length"};
  int64_t declared;
  std::memcpy(&declared, stored.data(), 8);
  const uint8_t* src = stored.data() + 8;
  const size_t n = stored.size() - 8;
  if (declared == -1) return std::vector<uint8_t>(src, src + n);
  if (declared < 0)
    throw Corrupt{"a compressed buffer of " + std::to_string(n) + " bytes declares " +
                  std::to_string(declared) + " bytes uncompressed"};
  // A length equal to the compressed size is the mark of a writer that stores the wrong one.
  const std::string wrong_length =
      uint64_t(declared) == n ? " (the length stored before the data equals its compressed size, not the "
                                "uncompressed size the Arrow format asks for: apache-arrow's JavaScript "
                                "writer, 21.2.0 and before, writes such files)"
                              : "";
  const std::string declared_bytes = std::to_string(declared);
  auto holds = [&](const char* name, uint64_t got) {
    return Corrupt{std::string("a ") + name + " buffer holds " +
                   (got > uint64_t(declared) ? "more than" : std::to_string(got) + " bytes, not") + " the " +
                   declared_bytes + " it declares" + wrong_length};
  };
  const char* name = codec == BodyCodec::kZstd ? "zstd" : "LZ4";
  if (uint64_t(declared) <= budget) {
    budget -= uint64_t(declared);
  } else {
    const std::string past = std::string("a ") + name + " buffer declares " + declared_bytes +
                             " bytes, past what the batch's body is believed to unpack to (1024 times it "
                             "plus 1 MiB)";
    const Array::Need needed = need();
    if (uint64_t(declared) > needed.bytes)
      throw Corrupt{past + ", and more than the " + std::to_string(needed.bytes) + " its array needs (" +
                    needed.what + ")" + wrong_length};
    if (uint64_t(declared) > kMaxCountedBytes - counted)
      throw Refused{past + "; with the " + std::to_string(counted) +
                    " bytes past that ratio its column holds already, that is " +
                    past_counted_bytes("record batch")};
    if (codec == BodyCodec::kZstd) {
      std::string error;
      const uint64_t got = zstd_decoded_size(src, n, uint64_t(declared), error);
      if (!error.empty()) throw Corrupt{error + wrong_length};
      if (got != uint64_t(declared)) throw holds("zstd", got);
    } else {
      const uint64_t got = lz4_frame(src, n, nullptr, uint64_t(declared), declared_bytes, wrong_length);
      if (got != uint64_t(declared)) throw holds("LZ4", got);
    }
    counted += uint64_t(declared);
  }
  if (declared == 0) return {};  // an empty buffer: its length alone (arrow-java writes no frame)
  std::vector<uint8_t> out(static_cast<size_t>(declared));
  if (codec == BodyCodec::kZstd) {
    const size_t got = ZSTD_decompress(out.data(), out.size(), src, n);
    if (ZSTD_isError(got))
      throw Corrupt{std::string("its zstd data is corrupt: ") + ZSTD_getErrorName(got) + wrong_length};
    if (got != out.size()) throw holds("zstd", got);
    return out;
  }
  const uint64_t got = lz4_frame(src, n, out.data(), out.size(), declared_bytes, wrong_length);
  if (got != out.size()) throw holds("LZ4", got);
  return out;
}

// What one record batch message says of the column: its rows and where its arrays' buffers are.
struct Batch {
  uint64_t body = 0;        // file offset of the message body
  int64_t body_length = 0;  // its bytes
  int64_t rows = 0;
  BodyCodec codec = BodyCodec::kNone;
  std::vector<std::pair<int64_t, int64_t>> nodes;  // the column's subtree, depth first: length, nulls
  std::vector<std::vector<Span>> buffers;          // per node, its buffers
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct ArrowColumn::Impl {
  fs::path path;
  std::string column;
  Shape shape = Shape::Text;
  std::unique_ptr<TableFile> io;
  uint64_t size = 0;
  std::vector<FieldInfo> fields;
  size_t field_budget = 0;   // fields read (read_field)
  int metadata_version = 4;  // MetadataVersion: V5 is 4 (Arrow 1.0 and later)
  std::vector<std::string> names;
  size_t field_index = 0;  // of the column among the top-level fields
  std::vector<Batch> batches;
  std::vector<uint64_t> first_row;  // of each batch, and the total last

  size_t batch = 0;  // loaded
  bool loaded = false;
  Array array;            // the loaded batch's column
  int64_t batch_row = 0;  // in it, the next row
  uint64_t row = 0;

  [[noreturn]] void fail(const std::string& what) const { io->fail(what); }
  void read_at(uint64_t offset, void* out, size_t n) const { io->read_at(offset, out, n); }

  void open() {
    io = std::make_unique<TableFile>(path);
    size = io->size();
    // The file format opens and ends with "ARROW1"; its footer holds the schema and where each record
    // batch is (writers need not repeat the schema in the stream between). The streaming format is a
    // stream of messages alone.
    if (size >= 14) {
      char head[6], tail[6];
      read_at(0, head, 6);
      read_at(size - 6, tail, 6);
      if (std::memcmp(head, "ARROW1", 6) == 0) {
        if (std::memcmp(tail, "ARROW1", 6) != 0)
          fail("opens as an Arrow file (ARROW1) but does not end with its footer and ARROW1 (truncated?)");
        read_file_footer();
        count_rows();
        return;
      }
    }
    uint64_t pos = 0;
    bool schema_read = false;
    while (true) {
      if (pos == size) break;  // a stream may end without its end-of-stream marker
      if (size - pos < 4)
        fail("it ends inside a message header at byte " + std::to_string(pos) + " (truncated?)");
      uint32_t word;
      read_at(pos, &word, 4);
      pos += 4;
      uint32_t metadata_size = word;
      if (word == 0xFFFFFFFFu) {  // the continuation marker of the format since Arrow 0.15
        if (size - pos < 4)
          fail("it ends inside a message header at byte " + std::to_string(pos) + " (truncated?)");
        read_at(pos, &metadata_size, 4);
        pos += 4;
      }
      if (metadata_size == 0) break;  // end of stream
      if (!schema_read && pos == 4 + (word == 0xFFFFFFFFu ? 4 : 0) && metadata_size > size)
        fail(
            "is not an Arrow IPC file: it does not start with an Arrow message (a Parquet or JSON file named "
            ".arrow?)");
      if (metadata_size > size - pos)
        fail("its message at byte " + std::to_string(pos) + " claims " + std::to_string(metadata_size) +
             " bytes of metadata, past the end of the file (truncated?)");
      std::vector<uint8_t> metadata(metadata_size);
      read_at(pos, metadata.data(), metadata.size());
      const uint64_t body = pos + metadata_size;
      int64_t body_length = 0;
      try {
        const FlatBuffer fb(metadata.data(), metadata.size());
        const Table message = fb.root();  // Message.fbs: version 0, header_type 1, header 2, bodyLength 3
        const int header_type = message.get<uint8_t>(1);
        body_length = message.get<int64_t>(3);
        const auto header = message.table(2);
        if (!header) throw Corrupt{"a message without its header"};
        if (header_type == 1) {
          if (schema_read) throw Corrupt{"a second schema message"};
          metadata_version = message.get<int16_t>(0);
          read_schema(*header);
          schema_read = true;
        } else if (header_type == 3) {
          if (!schema_read) throw Corrupt{"a record batch before the schema"};
          read_batch_header(*header, body, body_length);
        } else if (header_type != 2) {  // dictionary batches belong to other (dictionary) columns
          throw Corrupt{"a message of type " + std::to_string(header_type) +
                        " (a tensor?) in a table's stream"};
        }
      } catch (const Corrupt& c) {
        if (!schema_read)
          fail("is not an Arrow IPC file, or its schema is corrupt (at byte " + std::to_string(pos) + ": " +
               c.what + ")");
        fail("its message at byte " + std::to_string(pos) + " is corrupt: " + c.what);
      }
      if (body_length < 0 || uint64_t(body_length) > size - body)
        fail("its message at byte " + std::to_string(pos) + " has a body of " + std::to_string(body_length) +
             " bytes, past the end of the file (truncated?)");
      pos = body + uint64_t(body_length);
    }
    if (!schema_read) fail("holds no Arrow schema (an empty file, or not Arrow IPC)");
    count_rows();
  }

  void count_rows() {
    uint64_t rows = 0;
    for (const Batch& b : batches) {
      first_row.push_back(rows);
      rows += uint64_t(b.rows);
    }
    first_row.push_back(rows);
  }

  // File.fbs's Footer: version 0, schema 1, dictionaries 2, recordBatches 3 (Block structs: offset,
  // metaDataLength, padding, bodyLength; 24 bytes), before the footer's int32 size and "ARROW1".
  void read_file_footer() {
    int32_t footer_size;
    read_at(size - 10, &footer_size, 4);
    if (footer_size <= 0 || uint64_t(footer_size) > size - 18)
      fail("its footer claims " + std::to_string(footer_size) + " bytes of a " + std::to_string(size) +
           "-byte file (truncated or corrupt)");
    std::vector<uint8_t> footer(static_cast<size_t>(footer_size));
    read_at(size - 10 - uint64_t(footer_size), footer.data(), footer.size());
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // message start, metadata length
    try {
      const FlatBuffer fb(footer.data(), footer.size());
      const Table f = fb.root();
      const auto schema = f.table(1);
      if (!schema) throw Corrupt{"no schema"};
      metadata_version = f.get<int16_t>(0);
      read_schema(*schema);
      const auto [n, start] = f.vector(3);
      for (size_t i = 0; i < n; ++i) {
        const int64_t offset = fb.scalar<int64_t>(start + 24 * i);
        const int32_t metadata = fb.scalar<int32_t>(start + 24 * i + 8);
        if (offset < 8 || metadata < 8 || uint64_t(offset) > size ||
            uint64_t(metadata) > size - uint64_t(offset))
          throw Corrupt{"record batch " + std::to_string(i) + " lies outside the file"};
        blocks.emplace_back(uint64_t(offset), uint64_t(metadata));
      }
    } catch (const Corrupt& c) {
      fail("its footer is corrupt: " + c.what);
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto [pos, length] = blocks[i];
      uint32_t word;
      read_at(pos, &word, 4);
      const uint64_t prefix = word == 0xFFFFFFFFu ? 8 : 4;  // continuation marker (since 0.15) and size
      if (length < prefix) fail("record batch " + std::to_string(i) + "'s block is shorter than its prefix");
      std::vector<uint8_t> metadata(size_t(length - prefix));
      read_at(pos + prefix, metadata.data(), metadata.size());
      try {
        const FlatBuffer fb(metadata.data(), metadata.size());
        const Table message = fb.root();
        const auto header = message.table(2);
        if (message.get<uint8_t>(1) != 3 || !header) throw Corrupt{"it is not a record batch"};
        const uint64_t body = pos + length;
        const int64_t body_length = message.get<int64_t>(3);
        if (body_length < 0 || uint64_t(body_length) > size - body)
          throw Corrupt{"its body runs past the file"};
        read_batch_header(*header, body, body_length);
      } catch (const Corrupt& c) {
        fail("record batch " + std::to_string(i) + " at byte " + std::to_string(pos) +
             " is corrupt: " + c.what);
      }
    }
  }

  // Schema.fbs's Schema: endianness 0, fields 1.
  void read_schema(const Table& schema) {
    if (schema.get<int16_t>(0) != 0) fail("is big-endian; titan reads little-endian Arrow files");
    const auto [n, start] = schema.vector(1);
    for (size_t i = 0; i < n; ++i) {
      fields.push_back(read_field(schema.table_at(start, i), field_budget));
      names.push_back(fields.back().name);
    }
    const auto it = std::find(names.begin(), names.end(), column);
    if (it == names.end()) {
      fail("has no column '" + column + "' (" +
           (shape == Shape::Text ? "training.text_field names the column to read"
                                 : "training.chat_field names the messages") +
           "; its columns are " + quoted_names(names) + ")");
    }
    field_index = size_t(it - names.begin());
    const FieldInfo& f = fields[field_index];
    if (shape == Shape::Text) {
      if (f.dictionary)
        fail("column '" + column + "' is dictionary-encoded; titan reads plain string columns");
      if (f.type != kUtf8 && f.type != kLargeUtf8 && f.type != kUtf8View)
        fail("column '" + column + "' holds " + type_name(f.type) +
             " values, not strings (Utf8, LargeUtf8 or Utf8View)");
    } else {
      check_json_types(f, column, path);
    }
  }

  // Message.fbs's RecordBatch: length 0, nodes 1 (FieldNode structs: length, null_count), buffers 2
  // (Buffer structs: offset, length), compression 3 (BodyCompression: codec 0, method 1),
  // variadicBufferCounts 4.
  void read_batch_header(const Table& rb, uint64_t body, int64_t body_length) {
    Batch b;
    b.body = body;
    b.body_length = std::max<int64_t>(body_length, 0);
    if (const std::optional<Table> compression = rb.table(3)) {
      const int8_t codec = compression->get<int8_t>(0), method = compression->get<int8_t>(1);
      if (codec != 0 && codec != 1)
        fail("its record batches are compressed with codec " + std::to_string(codec) +
             ", which titan does not read (LZ4_FRAME and ZSTD)");
      if (method != 0)
        fail("its record batches are compressed by method " + std::to_string(method) +
             ", which titan does not read (BUFFER, each buffer on its own)");
      b.codec = BodyCodec(codec);
    }
    b.rows = rb.get<int64_t>(0);
    if (b.rows < 0) throw Corrupt{"a negative row count"};
    // (Plain variables, not structured bindings: the lambda below captures them, which clang before
    // 16, the fuzzer's compiler, refuses for bindings.)
    size_t node_count, nodes, buffer_count, buffers, variadic_count, variadic_start;
    std::tie(node_count, nodes) = rb.vector(1);
    std::tie(buffer_count, buffers) = rb.vector(2);
    std::tie(variadic_count, variadic_start) = rb.vector(4);
    std::vector<int64_t> variadic;
    const FlatBuffer& fb = rb.buffer();
    for (size_t i = 0; i < variadic_count; ++i)
      variadic.push_back(fb.scalar<int64_t>(variadic_start + 8 * i));
    size_t node = 0, buffer = 0, next_variadic = 0;
    // Walks the fields depth first, taking each one's node and buffers; keeps the column's.
    auto walk = [&](auto&& self, const FieldInfo& f, bool keep, int depth) -> void {
      if (depth > 64) throw Corrupt{"fields nested more than 64 deep"};
      const int own = own_buffers(f, variadic, next_variadic, metadata_version < 4);
      if (own < 0)
        throw Corrupt{"field '" + f.name + "' is of type " + type_name(f.type) +
                      ", whose layout titan does not know, before the column"};
      if (node >= node_count || buffer + size_t(own) > buffer_count)
        throw Corrupt{"its record batch lists fewer arrays than the schema has fields"};
      if (keep) {
        b.nodes.emplace_back(fb.scalar<int64_t>(nodes + 16 * node),
                             fb.scalar<int64_t>(nodes + 16 * node + 8));
        std::vector<Span> spans;
        for (int k = 0; k < own; ++k) {
          const size_t at = buffers + 16 * (buffer + size_t(k));
          spans.push_back({fb.scalar<int64_t>(at), fb.scalar<int64_t>(at + 8)});
        }
        b.buffers.push_back(std::move(spans));
      }
      ++node;
      buffer += size_t(own);
      if (!f.dictionary)
        for (const FieldInfo& c : f.children) self(self, c, keep, depth + 1);
    };
    for (size_t i = 0; i <= field_index; ++i) walk(walk, fields[i], i == field_index, 0);
    batches.push_back(std::move(b));
  }

  // The column's arrays of batch `k`, read from the file.
  void load(size_t k) {
    const Batch& b = batches[k];
    size_t node = 0;
    // What the column's buffers may take: their stored bytes, at most the batch's body (buffers that
    // share their bytes cannot multiply it), and unpacked, believed_unpacked_bytes of that unless
    // their data proves more (`counted`: the bytes proven so).
    uint64_t stored = 0, unpack_budget = believed_unpacked_bytes(uint64_t(b.body_length)), counted = 0;
    auto build = [&](auto&& self, const FieldInfo& f, const std::string& path) -> Array {
      Array a;
      a.field = &f;
      a.length = b.nodes[node].first;
      a.null_count = b.nodes[node].second;
      const std::vector<Span>& spans = b.buffers[node];
      for (size_t j = 0; j < spans.size(); ++j) {
        const Span& s = spans[j];
        if (s.offset < 0 || s.length < 0 || uint64_t(s.offset) > size - b.body ||
            uint64_t(s.length) > size - b.body - uint64_t(s.offset))
          fail("record batch " + std::to_string(k) + ": column '" + column +
               "' has a buffer outside the file " + "(the file is corrupt or truncated)");
        stored += uint64_t(s.length);
        if (stored > uint64_t(b.body_length))
          fail("record batch " + std::to_string(k) + ": column '" + column + "' has buffers of " +
               std::to_string(stored) + " bytes or more in a body of " + std::to_string(b.body_length) +
               " (they overlap: the file is corrupt)");
        std::vector<uint8_t> bytes(size_t(s.length));
        read_at(b.body + uint64_t(s.offset), bytes.data(), bytes.size());
        if (b.codec != BodyCodec::kNone) {
          const auto where = [&] {
            return "record batch " + std::to_string(k) + ": column '" + column + "': the " +
                   a.buffer_name(j) + " of '" + path + "': ";
          };
          try {
            bytes = decompress_buffer(b.codec, bytes, unpack_budget, counted,
                                      [&] { return a.need(j, spans.size()); });
          } catch (const Corrupt& c) {
            fail(where() + c.what + " (the file is corrupt or truncated)");
          } catch (const Refused& r) {
            fail(where() + r.what);
          }
        }
        a.buffers.push_back(std::move(bytes));
      }
      ++node;
      for (const FieldInfo& c : f.children) a.children.push_back(self(self, c, path + "." + c.name));
      return a;
    };
    array = build(build, fields[field_index], column);
    try {
      if (array.length < b.rows) throw Corrupt{"the column holds fewer values than the batch has rows"};
      array.check();
    } catch (const Corrupt& c) {
      fail("record batch " + std::to_string(k) + ": column '" + column + "': " + c.what +
           " (the file is corrupt or truncated)");
    }
    batch = k;
    loaded = true;
  }

  uint64_t rows() const { return first_row.back(); }

  void seek(uint64_t target) {
    if (target > rows())
      fail("row " + std::to_string(target) + " is past its " + std::to_string(rows()) + " rows");
    const size_t k =
        size_t(std::upper_bound(first_row.begin(), first_row.end(), target) - first_row.begin()) - 1;
    batch = std::min(k, batches.size());
    loaded = false;
    batch_row = int64_t(target - first_row[batch]);
    row = target;
  }

  // Positions at the next row (loading its batch); false at the end of the file.
  bool advance() {
    while (batch < batches.size() && batch_row >= batches[batch].rows) {
      ++batch;
      batch_row = 0;
      loaded = false;
    }
    if (batch >= batches.size()) return false;
    if (!loaded) load(batch);
    return true;
  }

  bool next_text(std::string& value, bool& null) {
    if (!advance()) return false;
    null = !array.valid(batch_row);
    if (null) {
      value.clear();
    } else {
      const std::string_view text = array.string(batch_row);
      if (text.size() > kMaxRowBytes)
        fail("row " + std::to_string(row + 1) + ": column '" + column +
             "': " + too_many_row_bytes(text.size()));
      value.assign(text);
    }
    ++batch_row;
    ++row;
    return true;
  }

  bool next_json(nlohmann::ordered_json& value) {
    if (!advance()) return false;
    try {
      Array::RowSize size;
      array.measure(batch_row, size);
      value = array.json(batch_row);
    } catch (const Corrupt& c) {
      fail("row " + std::to_string(row + 1) + ": column '" + column + "': " + c.what);
    }
    ++batch_row;
    ++row;
    return true;
  }
};

ArrowColumn::ArrowColumn(const fs::path& file, const std::string& column, Shape shape)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = file;
  impl_->column = column;
  impl_->shape = shape;
  impl_->open();
  impl_->seek(0);
}

ArrowColumn::~ArrowColumn() = default;
uint64_t ArrowColumn::rows() const {
  return impl_->rows();
}
uint64_t ArrowColumn::row() const {
  return impl_->row;
}
void ArrowColumn::seek(uint64_t row) {
  impl_->seek(row);
}
bool ArrowColumn::next(std::string& value, bool& null) {
  TITAN_CHECK(impl_->shape == Shape::Text, "ArrowColumn::next: column '", impl_->column,
              "' was opened as JSON");
  return impl_->next_text(value, null);
}
bool ArrowColumn::next_json(nlohmann::ordered_json& value) {
  return impl_->next_json(value);
}
const std::vector<std::string>& ArrowColumn::columns() const {
  return impl_->names;
}
uint64_t ArrowColumn::batches() const {
  return impl_->batches.size();
}

}  // namespace titan::data
