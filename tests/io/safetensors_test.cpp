// safetensors reader and writer: real transformers files against an independent Python reader,
// titan's writer against the same reader, byte-exact round trips, and one test per format rule.
#include "titan/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "io_test_util.h"

namespace titan::io {
namespace {

namespace fs = std::filesystem;
using namespace titan::io::testing;
using nlohmann::json;

fs::path oracle(const std::string& rel) {
  return titan::testing::fixtures_dir() / "oracles/hf-transformers-5.17" / rel;
}
fs::path fixture(const std::string& rel) {
  return titan::testing::fixtures_dir() / "io" / rel;
}

// Compares everything titan's reader sees in `f` with the Python reference summary of the file.
void expect_matches_reference(const SafetensorsFile& f, const json& ref) {
  EXPECT_EQ(f.header_bytes(), ref["header_bytes"].get<uint64_t>());
  EXPECT_EQ(f.file_size(), ref["file_bytes"].get<uint64_t>());
  EXPECT_EQ(json(f.metadata()), ref["metadata"]);
  ASSERT_EQ(f.tensors().size(), ref["tensors"].size());
  for (const auto& [name, r] : ref["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorInfo* t = f.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(dtype_safetensors_name(t->dtype), r["dtype"].get<std::string>());
    EXPECT_EQ(json(t->shape), r["shape"]);
    EXPECT_EQ(t->offset_begin, r["data_offsets"][0].get<size_t>());
    EXPECT_EQ(t->offset_end, r["data_offsets"][1].get<size_t>());
    EXPECT_EQ(t->data, f.tensors()[0].data - f.tensors()[0].offset_begin + t->offset_begin);
    for (size_t k = 0; k < r["positions"].size(); ++k)
      EXPECT_EQ(element(*t, r["positions"][k].get<size_t>()), r["values"][k].get<double>());
    double sum = r["sum"].get<double>();
    EXPECT_NEAR(element_sum(*t), sum, 1e-9 * (1 + std::abs(sum)));
  }
}

TEST(Safetensors, ReadsTransformersFilesLikeAnIndependentReader) {
  std::vector<fs::path> files = {oracle("tiny_dense/model.safetensors"), oracle("tiny_moe/model.safetensors"),
                                 oracle("tiny_moe/reference.safetensors"), fixture("mixed.safetensors")};
  for (const auto& p : files) ASSERT_TRUE(fs::exists(p)) << "missing fixture " << p;
  json ref = python_reference(files);
  for (const auto& p : files) {
    SCOPED_TRACE(p.string());
    SafetensorsFile f = SafetensorsFile::open(p);
    expect_matches_reference(f, ref[p.string()]);
  }
}

TEST(Safetensors, MixedFixtureEdgeCases) {
  SafetensorsFile f = SafetensorsFile::open(fixture("mixed.safetensors"));
  const TensorInfo& s = f.at("scalar.i64");  // 0-d
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  const TensorInfo& e = f.at("empty.f32");  // zero-size
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0u);
  EXPECT_EQ(f.metadata().at("note"), "ünïcode ✓");
  EXPECT_NE(f.find("ema.wéight.f16"), nullptr);
  EXPECT_EQ(f.find("nope"), nullptr);
  expect_error([&] { f.at("nope"); }, {"mixed.safetensors", "'nope'"});
  // tensors() is in data order, not in header (alphabetical) order.
  for (size_t i = 1; i < f.tensors().size(); ++i)
    EXPECT_EQ(f.tensors()[i].offset_begin, f.tensors()[i - 1].offset_end);
}

// Reading a transformers file and writing its tensors back in data order reproduces the file
// byte for byte: same header text, same padding, same data.
TEST(Safetensors, ReexportOfTransformersFileIsByteIdentical) {
  for (const char* rel : {"tiny_dense/model.safetensors", "tiny_moe/model.safetensors"}) {
    fs::path src = oracle(rel);
    ASSERT_TRUE(fs::exists(src)) << "missing fixture " << src;
    SafetensorsFile f = SafetensorsFile::open(src);
    std::vector<TensorWrite> ws;
    for (const TensorInfo& t : f.tensors()) ws.push_back({t.name, t.dtype, t.shape, t.data});
    fs::path out = titan::testing::temp_dir("st_reexport") / "model.safetensors";
    Metadata meta = f.metadata();
    meta.erase("format");
    uint64_t size = write_safetensors(out, ws, meta);
    EXPECT_EQ(size, fs::file_size(src));
    EXPECT_TRUE(read_bytes(out) == read_bytes(src)) << rel;
  }
}

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

TEST(Safetensors, WriterRoundTripAllDtypesAgainstReference) {
  fs::path dir = titan::testing::temp_dir("st_roundtrip");
  struct Spec {
    std::string name;
    DType dt;
    std::vector<int64_t> shape;
  };
  std::vector<Spec> specs = {
      {"f32", DType::F32, {3, 5}}, {"f64", DType::F64, {7}},     {"bf16", DType::BF16, {2, 3, 4}},
      {"f16", DType::F16, {9}},    {"i32", DType::I32, {4, 1}},  {"i64", DType::I64, {}},
      {"u8", DType::U8, {13}},     {"zero", DType::F32, {0, 3}}, {"名前", DType::U8, {1}}};
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorWrite> ws;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t numel =
        std::accumulate(specs[i].shape.begin(), specs[i].shape.end(), int64_t(1), std::multiplies<>());
    data.push_back(random_bytes(size_t(numel) * dtype_size(specs[i].dt), 100 + i));
    // Random f32/f64/f16 bits can be NaN; keep floats finite so Python's sums stay comparable.
    if (specs[i].dt == DType::F32)
      for (int64_t k = 0; k < numel; ++k) {
        float v = float(k) * 0.37f - 1.5f;
        std::memcpy(data.back().data() + 4 * k, &v, 4);
      }
    if (specs[i].dt == DType::F64 || specs[i].dt == DType::F16 || specs[i].dt == DType::BF16)
      for (size_t k = 0; k < data.back().size(); k += dtype_size(specs[i].dt))
        data.back()[k + dtype_size(specs[i].dt) - 1] &= std::byte(0x3f);  // exponent well below max
    ws.push_back({specs[i].name, specs[i].dt, specs[i].shape, data.back().data()});
  }
  fs::path path = dir / "all.safetensors";
  Metadata meta = {{"step", "12"}, {"note", "ünïcode"}};
  uint64_t size = write_safetensors(path, ws, meta);
  EXPECT_EQ(size, fs::file_size(path));

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.header_bytes() % 8, 0u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.metadata().at("note"), "ünïcode");
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];  // data order == write order
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.dtype, specs[i].dt);
    EXPECT_EQ(t.shape, specs[i].shape);
    ASSERT_EQ(t.nbytes(), data[i].size());
    EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(), t.data)) << t.name;
  }
  // The header must be space padded: nothing but spaces after the closing brace.
  std::string bytes = read_bytes(path);
  std::string header = bytes.substr(8, f.header_bytes());
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  expect_matches_reference(f, python_reference({path})[path.string()]);
}

TEST(Safetensors, ConvertingWriterMatchesTorchRounding) {
  fs::path dir = titan::testing::temp_dir("st_convert");
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> x(100003);
  for (float& v : x) v = nd(rng);
  x[0] = 1.00390625f;  // exactly halfway between two bf16 values: ties to even
  x[1] = 65519.f;      // largest f32 that rounds to a finite f16 (65504)
  x[2] = 1e-7f;        // f16 subnormal
  std::vector<TensorWrite> ws = {{"src", DType::F32, {int64_t(x.size())}, x.data()},
                                 {"as_bf16", DType::BF16, {int64_t(x.size())}, x.data(), DType::F32},
                                 {"as_f16", DType::F16, {int64_t(x.size())}, x.data(), DType::F32}};
  fs::path path = dir / "conv.safetensors";
  write_safetensors(path, ws);
  json ref = python_reference({path})[path.string()]["tensors"];
  EXPECT_EQ(ref["as_bf16"]["dtype"], "BF16");
  EXPECT_EQ(ref["as_f16"]["dtype"], "F16");
  // Same values summed in the same order by torch: equal only if every element rounded alike.
  EXPECT_EQ(ref["as_bf16"]["sum"].get<double>(), ref["src"]["bf16_sum"].get<double>());
  EXPECT_EQ(ref["as_f16"]["sum"].get<double>(), ref["src"]["f16_sum"].get<double>());

  // bf16 -> f32 widening is exact.
  SafetensorsFile f = SafetensorsFile::open(path);
  const TensorInfo& b = f.at("as_bf16");
  fs::path back = dir / "back.safetensors";
  write_safetensors(back, std::vector<TensorWrite>{{"w", DType::F32, b.shape, b.data, DType::BF16}});
  SafetensorsFile g = SafetensorsFile::open(back);
  for (size_t i = 0; i < x.size(); i += 997) EXPECT_EQ(element(g.at("w"), i), element(b, i));
  expect_error(
      [&] {
        write_safetensors(dir / "bad.safetensors",
                          std::vector<TensorWrite>{{"w", DType::I32, {1}, x.data(), DType::F32}});
      },
      {"'w'", "cannot convert f32 to i32"});
  EXPECT_FALSE(fs::exists(dir / "bad.safetensors"));
}

TEST(Safetensors, WriterRejectsBadInput) {
  fs::path dir = titan::testing::temp_dir("st_writer_bad");
  float v[2] = {1, 2};
  auto write = [&](std::vector<TensorWrite> ws) { write_safetensors(dir / "x.safetensors", ws); };
  expect_error(
      [&] {
        write({{"a", DType::F32, {2}, v}, {"a", DType::F32, {2}, v}});
      },
      {"duplicate tensor name 'a'"});
  expect_error(
      [&] {
        write({{"__metadata__", DType::F32, {2}, v}});
      },
      {"'__metadata__' is not a tensor name"});
  expect_error([&] { write({{"a", DType::F32, {-2}, v}}); }, {"'a'", "negative"});
  expect_error([&] { write({{"a", DType::F32, {int64_t(1) << 62, 8}, v}}); }, {"'a'", "overflow"});
  expect_error([&] { write({{"a", DType::F32, {2}, nullptr}}); }, {"'a' has no data"});
  expect_error([&] { write({{"bad\xff", DType::F32, {2}, v}}); }, {"x.safetensors"});
  EXPECT_TRUE(fs::is_empty(dir));  // no file, no temporary left behind
}

TEST(Safetensors, MappingOutlivesTheFileObject) {
  std::shared_ptr<const void> keep;
  const std::byte* data;
  std::vector<std::byte> expect;
  {
    SafetensorsFile f = SafetensorsFile::open(fixture("mixed.safetensors"));
    SafetensorsFile moved = std::move(f);
    const TensorInfo& t = moved.at("w.f32");
    EXPECT_EQ(moved.find("w.f32"), &t);
    data = t.data;
    expect.assign(t.data, t.data + t.nbytes());
    keep = moved.keep_alive();
    moved.prefetch();
  }
  EXPECT_TRUE(std::equal(expect.begin(), expect.end(), data));
}

// ---- Format rules: every malformed case gives one titan::Error naming the file and the rule ----

const std::string kA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
const std::string kB = R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]})";
const std::string kData11(11, '\x01');

void expect_rejected(const std::string& image, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  all.push_back("case.safetensors");
  expect_error([&] { parse_safetensors(as_span(image), "case.safetensors"); }, all);
}

TEST(SafetensorsFormat, AcceptsValidVariants) {
  auto ok = [](const std::string& image) { return parse_safetensors(as_span(image), "ok").tensors.size(); };
  EXPECT_EQ(ok(file_image("{" + kA + "," + kB + "}", kData11)), 2u);
  EXPECT_EQ(ok(file_image("{" + kB + "," + kA + "}", kData11)), 2u);         // header order is free
  EXPECT_EQ(ok(file_image("{" + kA + "," + kB + "}       ", kData11)), 2u);  // space padding
  EXPECT_EQ(ok(file_image("{}")), 0u);
  EXPECT_EQ(ok(file_image(R"({"__metadata__":{}})")), 0u);
  EXPECT_EQ(ok(file_image(R"({ "s" : { "dtype" : "I64" , "shape" : [ ] , "data_offsets" : [ 0 , 8 ] } })",
                          std::string(8, '\0'))),
            1u);
  // Zero-size tensors may sit anywhere, including at the very end and at offset 0.
  EXPECT_EQ(ok(file_image(R"({"z":{"dtype":"BF16","shape":[0,5],"data_offsets":[0,0]},)" + kA +
                              R"(,"y":{"dtype":"F64","shape":[3,0],"data_offsets":[8,8]}})",
                          std::string(8, '\0'))),
            3u);
  // A zero dim makes numel 0 even when the other dims are huge.
  EXPECT_EQ(ok(file_image(R"({"z":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})")),
            1u);
}

TEST(SafetensorsFormat, TooShortAndTruncated) {
  for (size_t n = 0; n < 8; ++n) expect_rejected(std::string(n, '\0'), {"too short"});
  std::string good = file_image("{" + kA + "," + kB + "}", kData11);
  ASSERT_NO_THROW(parse_safetensors(as_span(good), "good"));
  // Every proper prefix of a valid file is an error (never a crash, never accepted).
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(parse_safetensors(as_span(good.substr(0, n)), "case"), titan::Error) << n;
  expect_rejected(good.substr(0, good.size() - 1), {"'b'", "past the end of the data section"});
  expect_rejected(good.substr(0, 20), {"runs past the end", "truncated"});
}

TEST(SafetensorsFormat, HeaderLength) {
  std::string img = file_image("{}");
  for (uint64_t n : {uint64_t(100'000'001), uint64_t(1) << 63, ~uint64_t(0)}) {
    std::memcpy(img.data(), &n, 8);
    expect_rejected(img, {"header length", "exceeds the limit"});
  }
  uint64_t n = 3;  // within the limit but past EOF
  std::memcpy(img.data(), &n, 8);
  expect_rejected(img, {"runs past the end"});
  expect_rejected(file_image(""), {"must be a JSON object"});
}

TEST(SafetensorsFormat, Utf8AndJson) {
  expect_rejected(file_image("{\"a\xff\":{}}"), {"not valid UTF-8", "byte 3"});
  expect_rejected(file_image("{\"\xc0\x80\":1}"), {"not valid UTF-8"});          // overlong NUL
  expect_rejected(file_image("{\"\xed\xa0\x80\":1}"), {"not valid UTF-8"});      // surrogate
  expect_rejected(file_image("{\"\xf4\x90\x80\x80\":1}"), {"not valid UTF-8"});  // > U+10FFFF
  expect_rejected(file_image("{\"\xe2\x82\":1}"), {"not valid UTF-8"});          // cut sequence
  expect_rejected(file_image(R"({"a":})"), {"not valid JSON"});
  expect_rejected(file_image(R"({"a":1,})"), {"not valid JSON"});
  expect_rejected(file_image(R"({"a":1}{"b":2})"), {"not valid JSON"});
  expect_rejected(file_image("[1,2]"), {"must be a JSON object starting with '{'"});
  expect_rejected(file_image(" {}"), {"starting with '{'"});
  expect_rejected(file_image("{}\n"), {"padded only with spaces"});
  expect_rejected(file_image(std::string("{}\0\0", 4)), {"padded only with spaces"});
  expect_rejected(file_image(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "xxxx"),
                  {"nests deeper"});
}

TEST(SafetensorsFormat, Entries) {
  auto entry = [](const std::string& body, const std::string& data = "") {
    return file_image(R"({"t":)" + body + "}", data);
  };
  expect_rejected(entry("[1]"), {"tensor 't'", "must be a JSON object"});
  expect_rejected(entry(R"({"dtype":"BOOL","shape":[1],"data_offsets":[0,1]})", "x"),
                  {"tensor 't'", "unsupported dtype 'BOOL'", "F32, F64, BF16, F16, I32, I64, U8"});
  expect_rejected(entry(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})", "x"), {"'F8_E4M3'"});
  expect_rejected(entry(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})", "x"),
                  {"'dtype' must be a string"});
  expect_rejected(entry(R"({"shape":[1],"data_offsets":[0,1]})", "x"),
                  {"tensor 't'", "missing field 'dtype'"});
  expect_rejected(entry(R"({"dtype":"U8","data_offsets":[0,1]})", "x"), {"missing field 'shape'"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1]})", "x"), {"missing field 'data_offsets'"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1})", "x"),
                  {"unknown field 'extra'"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", "x"), {"shape[0] = -1"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})", "x"), {"shape[0] = 1.0"});
  expect_rejected(entry(R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", "x"), {"shape[0]"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]})", "x"),
                  {"shape[0]", "[0, 2^63)"});
  expect_rejected(entry(R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", "x"),
                  {"'shape' must be an array"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", "x"),
                  {"'data_offsets' must be [begin, end]"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", "x"), {"'data_offsets'"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,1]})", "x"), {"'data_offsets'"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[1,0]})", "x"), {"end before begin"});
  expect_rejected(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,2]})", "xx"),
                  {"span 2 bytes", "needs 1"});
  expect_rejected(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})", "xxxx"), {"needs 8"});
}

TEST(SafetensorsFormat, NumelOverflow) {
  auto entry = [](const std::string& dtype, const std::string& shape) {
    return file_image(R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[0,0]}})");
  };
  expect_rejected(entry("U8", "[4294967296,4294967296]"), {"tensor 't'", "overflows"});
  expect_rejected(entry("U8", "[4611686018427387904,2]"), {"overflows"});  // 2^63: not an int64
  expect_rejected(
      entry("U8", "[3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3]"),
      {"overflows"});
  expect_rejected(entry("F64", "[2305843009213693952]"), {"byte size", "overflows"});  // 2^61 x 8 = 2^64
  // A product that wraps to exactly the declared byte length must not pass.
  expect_rejected(
      file_image(R"({"t":{"dtype":"U8","shape":[4294967296,4294967296,1],"data_offsets":[0,0]}})"),
      {"overflows"});
}

TEST(SafetensorsFormat, OffsetsContiguousFromZero) {
  auto two = [](const std::string& a_off, const std::string& b_off, size_t data) {
    return file_image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":)" + a_off +
                          R"(},"b":{"dtype":"U8","shape":[4],"data_offsets":)" + b_off + "}}",
                      std::string(data, 'x'));
  };
  ASSERT_NO_THROW(parse_safetensors(as_span(two("[0,4]", "[4,8]", 8)), "ok"));
  expect_rejected(two("[1,5]", "[5,9]", 9), {"hole", "bytes [0, 1)", "'a'"});
  expect_rejected(two("[0,4]", "[5,9]", 9), {"hole", "bytes [4, 5)", "'b'"});
  expect_rejected(two("[0,4]", "[2,6]", 6), {"overlap", "'b'", "'a'"});
  expect_rejected(two("[0,4]", "[0,4]", 4), {"overlap"});
  expect_rejected(two("[0,4]", "[4,8]", 9), {"1 trailing bytes", "end exactly at end of file"});
  expect_rejected(file_image("{}", "x"), {"1 trailing bytes"});
  // A zero-size tensor inside another tensor's bytes is an overlap too.
  expect_rejected(file_image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
                             "xxxx"),
                  {"overlap", "'z'"});
}

TEST(SafetensorsFormat, DuplicatesAndMetadata) {
  expect_rejected(file_image("{" + kA + "," + kA + "}", std::string(8, 'x')), {"duplicate tensor name 'a'"});
  expect_rejected(file_image(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"),
                  {"duplicate key 'dtype'", "'a'"});
  expect_rejected(file_image(R"({"__metadata__":{"k":"v","k":"w"}})"),
                  {"duplicate key 'k'", "'__metadata__'"});
  expect_rejected(file_image(R"({"__metadata__":{},"__metadata__":{}})"),
                  {"duplicate tensor name '__metadata__'"});
  expect_rejected(file_image(R"({"__metadata__":{"k":1}})"),
                  {"'__metadata__' value of 'k' must be a string"});
  expect_rejected(file_image(R"({"__metadata__":["k"]})"), {"'__metadata__' must be an object"});
  ParsedSafetensors p = parse_safetensors(as_span(file_image(R"({"__metadata__":{"a":"1","b":""}})")), "ok");
  EXPECT_EQ(p.metadata, (Metadata{{"a", "1"}, {"b", ""}}));
}

TEST(SafetensorsFormat, OpenNamesThePath) {
  fs::path dir = titan::testing::temp_dir("st_open_errors");
  expect_error([&] { SafetensorsFile::open(dir / "missing.safetensors"); },
               {"missing.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir); }, {"not a regular file"});
  write_bytes(dir / "empty.safetensors", "");
  expect_error([&] { SafetensorsFile::open(dir / "empty.safetensors"); }, {"empty.safetensors", "too short"});
  write_bytes(dir / "trail.safetensors", file_image("{" + kA + "}", std::string(9, 'x')));
  expect_error([&] { SafetensorsFile::open(dir / "trail.safetensors"); },
               {(dir / "trail.safetensors").string(), "1 trailing bytes"});
}

}  // namespace
}  // namespace titan::io
