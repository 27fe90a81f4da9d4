#pragma once
// Helpers shared by the io tests (header-only: tests/CMakeLists.txt links each *_test.cpp alone).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/core/dtype.h"
#include "titan/io/safetensors.h"

namespace titan::io::testing {

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out.write(s.data(), std::streamsize(s.size()));
}

// A file image: 8-byte little-endian length, the header text as given, then the data bytes.
inline std::string file_image(const std::string& header, const std::string& data = "") {
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

inline std::span<const std::byte> as_span(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Element i of a tensor as double, decoded per dtype.
inline double element(const TensorInfo& t, size_t i) {
  const std::byte* p = t.data + i * dtype_size(t.dtype);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t.dtype) {
    case DType::F32:
      return load(float());
    case DType::F64:
      return load(double());
    case DType::BF16:
      return bf16_to_f32(bf16{load(uint16_t())});
    case DType::F16:
      return f16_to_f32(load(uint16_t()));
    case DType::I32:
      return load(int32_t());
    case DType::I64:
      return double(load(int64_t()));
    case DType::U8:
      return load(uint8_t());
  }
  return 0;
}

inline double element_sum(const TensorInfo& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += element(t, size_t(i));
  return s;
}

// Runs tests/io/st_reference.py (Python json + struct + torch) on the files; its JSON summary.
inline nlohmann::json python_reference(const std::vector<std::filesystem::path>& files) {
  std::string cmd =
      "/usr/bin/python3 " + (titan::testing::source_dir() / "tests/io/st_reference.py").string();
  for (const auto& f : files) cmd += " '" + f.string() + "'";
  std::string out;
  int rc = titan::testing::run_command(cmd + " 2>/dev/null", &out);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(out);
}

// Expects `fn` to throw titan::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected titan::Error containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const titan::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace titan::io::testing
