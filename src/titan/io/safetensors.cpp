#include "titan/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "titan/core/check.h"
#include "titan/io/atomic_file.h"

namespace titan::io {
namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors IO assumes a little-endian host");

namespace {

constexpr std::string_view kSupported = "F32, F64, BF16, F16, I32, I64, U8";

// Offset of the first byte that breaks UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF),
// or npos when the whole string is valid.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0)
        lo = 0xA0;  // overlong
      else if (c == 0xED)
        hi = 0x9F;  // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0)
        lo = 0x90;  // overlong
      else if (c == 0xF4)
        hi = 0x8F;  // above U+10FFFF
    } else
      return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Parses the header text with nlohmann/json while rejecting what its DOM would silently accept:
// duplicate keys (it keeps the last) and nesting deeper than the format has (root -> entry -> shape).
json parse_header_json(std::string_view text, std::string_view origin) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  std::vector<std::string> last_key;                  // per open object: the key being parsed
  int depth = 0;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        TITAN_CHECK(
            ++depth <= 3, "safetensors file '", origin,
            "': header JSON nests deeper than the format allows (root object -> tensor entry -> shape)");
        if (ev == json::parse_event_t::object_start) {
          keys.emplace_back();
          last_key.emplace_back();
        }
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        last_key.pop_back();
        --depth;
        break;
      case json::parse_event_t::array_end:
        --depth;
        break;
      case json::parse_event_t::key: {
        std::string k = parsed.get<std::string>();
        if (!keys.back().insert(k).second) {
          if (keys.size() == 1)
            TITAN_FAIL("safetensors file '", origin, "': duplicate tensor name '", k, "' in header");
          TITAN_FAIL("safetensors file '", origin, "': duplicate key '", k, "' in header entry '",
                     last_key[last_key.size() - 2], "'");
        }
        last_key.back() = std::move(k);
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    TITAN_FAIL("safetensors file '", origin, "': header is not valid JSON: ", e.what());
  }
}

// A JSON integer in [0, max]; nlohmann stores non-negative integer literals as number_unsigned and
// anything with a fraction/exponent (or beyond 2^64) as float, both rejected here.
bool as_uint(const json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t x = v.get<uint64_t>();
  if (x > max) return false;
  *out = x;
  return true;
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_size, std::string_view origin) {
  const std::string where = "safetensors file '" + std::string(origin) + "': tensor '" + name + "'";
  TITAN_CHECK(e.is_object(), where, ": entry must be a JSON object {dtype, shape, data_offsets}, got ",
              e.type_name());
  for (auto it = e.begin(); it != e.end(); ++it)
    TITAN_CHECK(it.key() == "dtype" || it.key() == "shape" || it.key() == "data_offsets", where,
                ": unknown field '", it.key(), "' (allowed: dtype, shape, data_offsets)");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    TITAN_CHECK(e.contains(field), where, ": missing field '", field, "'");

  TensorInfo t;
  t.name = name;
  const json& dt = e["dtype"];
  TITAN_CHECK(dt.is_string(), where, ": field 'dtype' must be a string, got ", dt.type_name());
  const std::string& dts = dt.get_ref<const std::string&>();
  TITAN_CHECK(dtype_from_safetensors_name(dts, &t.dtype), where, ": unsupported dtype '", dts,
              "' (supported: ", kSupported, ")");

  const json& sh = e["shape"];
  TITAN_CHECK(sh.is_array(), where, ": field 'shape' must be an array of non-negative integers, got ",
              sh.type_name());
  // numel must not wrap: every partial product of the non-zero dims must fit in int64 (so strides
  // computed from the shape fit too); a zero dim then makes numel 0.
  uint64_t prod = 1;
  bool has_zero = false;
  for (size_t i = 0; i < sh.size(); ++i) {
    uint64_t d;
    TITAN_CHECK(as_uint(sh[i], uint64_t(std::numeric_limits<int64_t>::max()), &d), where, ": shape[", i,
                "] = ", sh[i].dump(), " is not an integer in [0, 2^63)");
    t.shape.push_back(int64_t(d));
    if (d == 0) {
      has_zero = true;
      continue;
    }
    TITAN_CHECK(
        !__builtin_mul_overflow(prod, d, &prod) && prod <= uint64_t(std::numeric_limits<int64_t>::max()),
        where, ": number of elements of shape ", sh.dump(), " overflows 64 bits");
  }
  uint64_t numel = has_zero ? 0 : prod;
  uint64_t nbytes;
  TITAN_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes), where,
              ": byte size of shape ", sh.dump(), " x ", dts, " overflows 64 bits");

  const json& off = e["data_offsets"];
  uint64_t b = 0, en = 0;
  TITAN_CHECK(off.is_array() && off.size() == 2 && as_uint(off[0], UINT64_MAX, &b) &&
                  as_uint(off[1], UINT64_MAX, &en),
              where, ": field 'data_offsets' must be [begin, end] with non-negative integers, got ",
              off.dump());
  TITAN_CHECK(en >= b, where, ": data_offsets ", off.dump(), " end before begin");
  TITAN_CHECK(en <= data_size, where, ": data_offsets ", off.dump(),
              " run past the end of the data section (", data_size, " bytes; truncated file?)");
  TITAN_CHECK(en - b == nbytes, where, ": data_offsets ", off.dump(), " span ", en - b, " bytes but shape ",
              sh.dump(), " x ", dts, " needs ", nbytes);
  t.offset_begin = size_t(b);
  t.offset_end = size_t(en);
  t.data = nullptr;
  return t;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow when parsed
  return n;
}

ParsedSafetensors parse_safetensors(std::span<const std::byte> file, std::string_view origin) {
  const uint64_t size = file.size();
  TITAN_CHECK(size >= 8, "safetensors file '", origin, "': ", size,
              " bytes, too short to hold the 8-byte header length");
  const uint64_t n = read_le64(file.data());
  TITAN_CHECK(n <= kMaxSafetensorsHeaderBytes, "safetensors file '", origin, "': header length ", n,
              " exceeds the limit of ", kMaxSafetensorsHeaderBytes,
              " bytes (corrupt or not a safetensors file)");
  TITAN_CHECK(n <= size - 8, "safetensors file '", origin, "': header length ", n,
              " runs past the end of the ", size, "-byte file (truncated?)");
  std::string_view header(reinterpret_cast<const char*>(file.data()) + 8, n);
  size_t bad = first_invalid_utf8(header);
  TITAN_CHECK(bad == std::string_view::npos, "safetensors file '", origin,
              "': header is not valid UTF-8 (byte ", bad, " of the header)");
  // The format allows trailing padding with spaces (0x20) and nothing else after the object.
  std::string_view text = header.substr(0, header.find_last_not_of(' ') + 1);
  TITAN_CHECK(!text.empty() && text.front() == '{' && text.back() == '}', "safetensors file '", origin,
              "': header must be a JSON object starting with '{' and padded only with spaces");
  json j = parse_header_json(text, origin);
  TITAN_CHECK(j.is_object(), "safetensors file '", origin, "': header must be a JSON object");

  const uint64_t data_size = size - 8 - n;
  ParsedSafetensors out;
  out.header_bytes = n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      TITAN_CHECK(it->is_object(), "safetensors file '", origin,
                  "': '__metadata__' must be an object of strings, got ", it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m) {
        TITAN_CHECK(m->is_string(), "safetensors file '", origin, "': '__metadata__' value of '", m.key(),
                    "' must be a string, got ", m->type_name());
        out.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    out.tensors.push_back(parse_entry(it.key(), *it, data_size, origin));
  }

  // Data order. Zero-size tensors sort before a tensor starting at the same offset; ties by name
  // keep the order deterministic.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.offset_begin != b.offset_begin) return a.offset_begin < b.offset_begin;
    if (a.offset_end != b.offset_end) return a.offset_end < b.offset_end;
    return a.name < b.name;
  });
  size_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : out.tensors) {
    TITAN_CHECK(t.offset_begin >= expect, "safetensors file '", origin, "': tensor '", t.name,
                "' data_offsets [", t.offset_begin, ", ", t.offset_end, "] overlap tensor '",
                prev ? prev->name : "", "' [", prev ? prev->offset_begin : 0, ", ", expect, "]");
    TITAN_CHECK(t.offset_begin == expect, "safetensors file '", origin,
                "': hole in the data section: bytes [", expect, ", ", t.offset_begin, ") before tensor '",
                t.name, "' belong to no tensor");
    expect = t.offset_end;
    prev = &t;
  }
  TITAN_CHECK(expect == data_size, "safetensors file '", origin, "': ", data_size - expect,
              " trailing bytes after the last tensor (data must end exactly at end of file)");
  const std::byte* data = file.data() + 8 + n;
  for (TensorInfo& t : out.tensors) t.data = data + t.offset_begin;
  return out;
}

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TITAN_CHECK(fd >= 0, "cannot open safetensors file '", path.string(), "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TITAN_FAIL("safetensors file '", path.string(), "': not a regular file (only regular files are read)");
  }
  SafetensorsFile f;
  f.path_ = path;
  f.size_ = uint64_t(st.st_size);
  const std::byte* base = nullptr;
  if (f.size_ > 0) {
    void* addr = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    TITAN_CHECK(addr != MAP_FAILED, "cannot mmap safetensors file '", path.string(),
                "': ", std::strerror(err));
    size_t len = f.size_;
    f.mapping_ =
        std::shared_ptr<const void>(addr, [len](const void* p) { ::munmap(const_cast<void*>(p), len); });
    base = static_cast<const std::byte*>(addr);
  } else {
    ::close(fd);
  }
  f.parsed_ = parse_safetensors({base, f.size_}, path.string());
  f.index_.reserve(f.parsed_.tensors.size());
  for (size_t i = 0; i < f.parsed_.tensors.size(); ++i) f.index_.emplace(f.parsed_.tensors[i].name, i);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &parsed_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  TITAN_CHECK(t, "safetensors file '", path_.string(), "' has no tensor '", name, "'");
  return *t;
}

void SafetensorsFile::prefetch() const {
  if (mapping_) ::madvise(const_cast<void*>(mapping_.get()), size_, MADV_WILLNEED);
}

uint64_t tensor_write_bytes(const TensorWrite& t) {
  uint64_t numel = 1;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    TITAN_CHECK(t.shape[i] >= 0, "write_safetensors: tensor '", t.name, "': shape[", i, "] = ", t.shape[i],
                " is negative");
    TITAN_CHECK(!__builtin_mul_overflow(numel, uint64_t(t.shape[i]), &numel), "write_safetensors: tensor '",
                t.name, "': number of elements overflows");
  }
  uint64_t bytes;
  TITAN_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &bytes),
              "write_safetensors: tensor '", t.name, "': byte size overflows");
  return bytes;
}

namespace {

bool conversion_supported(DType from, DType to) {
  if (from == to) return true;
  if (from == DType::F32) return to == DType::BF16 || to == DType::F16;
  return (from == DType::BF16 || from == DType::F16) && to == DType::F32;
}

// Converts n elements of src (type `from`) to dst (type `to`).
void convert_chunk(const std::byte* src, DType from, std::byte* dst, DType to, size_t n) {
  if (from == DType::F32 && to == DType::BF16) {
    convert_f32_to_bf16(reinterpret_cast<const float*>(src), reinterpret_cast<bf16*>(dst), n);
  } else if (from == DType::BF16 && to == DType::F32) {
    convert_bf16_to_f32(reinterpret_cast<const bf16*>(src), reinterpret_cast<float*>(dst), n);
  } else if (from == DType::F32 && to == DType::F16) {
    auto* s = reinterpret_cast<const float*>(src);
    auto* d = reinterpret_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
  } else {  // F16 -> F32, the last pair conversion_supported() allows
    auto* s = reinterpret_cast<const uint16_t*>(src);
    auto* d = reinterpret_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
  }
}

}  // namespace

uint64_t write_safetensors(const fs::path& path, std::span<const TensorWrite> tensors,
                           const Metadata& metadata, const FileWriting& how) {
  // The header is built as text rather than through an ordered_json DOM, whose key lookup is linear
  // (quadratic for checkpoints with tens of thousands of tensors); json::dump() does the escaping.
  Metadata meta = metadata;
  meta.emplace("format", "pt");
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  try {
    for (const auto& [k, v] : meta) {
      header.append(first ? "" : ",").append(json(k).dump()).append(":").append(json(v).dump());
      first = false;
    }
    header += "}";
    std::unordered_set<std::string_view> names;
    uint64_t off = 0;
    for (const TensorWrite& t : tensors) {
      TITAN_CHECK(t.name != "__metadata__", "write_safetensors ", path,
                  ": '__metadata__' is not a tensor name");
      TITAN_CHECK(names.insert(t.name).second, "write_safetensors ", path, ": duplicate tensor name '",
                  t.name, "'");
      uint64_t bytes = tensor_write_bytes(t);
      DType src = t.source_dtype.value_or(t.dtype);
      TITAN_CHECK(conversion_supported(src, t.dtype), "write_safetensors ", path, ": tensor '", t.name,
                  "': cannot convert ", dtype_name(src), " to ", dtype_name(t.dtype));
      TITAN_CHECK(t.data || t.fetch || bytes == 0, "write_safetensors ", path, ": tensor '", t.name,
                  "' has no data");
      header.append(",").append(json(t.name).dump()).append(":{\"dtype\":\"");
      header.append(dtype_safetensors_name(t.dtype)).append("\",\"shape\":").append(json(t.shape).dump());
      header.append(",\"data_offsets\":[").append(std::to_string(off)).append(",");
      header.append(std::to_string(off + bytes)).append("]}");
      off += bytes;
    }
    header += "}";
  } catch (const json::exception& e) {  // names and metadata must be valid UTF-8
    TITAN_FAIL("write_safetensors ", path, ": ", e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  AtomicFile f(path, how);
  uint64_t n = header.size();
  f.write(&n, 8);
  f.write(header);
  std::vector<std::byte> buf;
  for (const TensorWrite& t : tensors) {
    uint64_t bytes = tensor_write_bytes(t);
    DType src = t.source_dtype.value_or(t.dtype);
    const void* data = t.data || !t.fetch ? t.data : t.fetch();
    TITAN_CHECK(data || bytes == 0, "write_safetensors ", path, ": tensor '", t.name,
                "': its fetch gave no data");
    if (src == t.dtype) {
      f.write(data, bytes);
      continue;
    }
    // Convert through a bounded buffer so exporting a large model never holds a second copy.
    constexpr size_t kChunk = size_t(1) << 20;  // elements
    size_t numel = bytes / dtype_size(t.dtype);
    buf.resize(kChunk * dtype_size(t.dtype));
    const auto* s = static_cast<const std::byte*>(data);
    for (size_t i = 0; i < numel; i += kChunk) {
      size_t m = std::min(kChunk, numel - i);
      convert_chunk(s + i * dtype_size(src), src, buf.data(), t.dtype, m);
      f.write(buf.data(), m * dtype_size(t.dtype));
    }
  }
  uint64_t total = f.bytes_written();
  f.commit();
  return total;
}

}  // namespace titan::io
