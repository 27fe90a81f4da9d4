#pragma once
// Runs tests/ops/torch_ref/qwen3_ops_ref.py (PyTorch, transformers' Qwen3 formulas) on titan tensors
// and compares results in units in the last place of the case dtype. Header-only: included by the
// rms_norm / rope / swiglu tests.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "titan/core/tensor.h"

namespace titan::testing {

struct TorchCase {
  std::string name, op;
  DType dtype;  // F32 or BF16: the dtype torch computes in
  std::vector<std::pair<std::string, Tensor>> inputs;
  nlohmann::json params;
};

inline std::string torch_python() {
  return "/usr/bin/python3";
}

// Empty when torch imports, else why not (the test then skips).
inline std::string torch_unavailable() {
  static const std::string why = [] {
    std::string out;
    int rc = run_command(torch_python() + " -c 'import torch, numpy'", &out);
    return rc == 0 ? std::string() : "PyTorch not importable by " + torch_python() + ": " + out;
  }();
  return why;
}

// Runs every case in one python process; returns each case's output as an f32 tensor.
inline std::vector<Tensor> run_torch(const std::string& tag, const std::vector<TorchCase>& cases) {
  auto dir = temp_dir("torch_ref_" + tag);
  nlohmann::json spec;
  spec["cases"] = nlohmann::json::array();
  for (const auto& c : cases) {
    nlohmann::json jc = {{"name", c.name},
                         {"op", c.op},
                         {"dtype", c.dtype == DType::BF16 ? "bf16" : "f32"},
                         {"params", c.params}};
    for (const auto& [name, t] : c.inputs) {
      const bool ids = t.dtype() == DType::I64;
      Tensor raw = ids ? t.contiguous() : t.to(DType::F32);
      std::string file = c.name + "." + name + ".bin";
      std::ofstream(dir / file, std::ios::binary)
          .write(static_cast<const char*>(raw.raw_data()), std::streamsize(raw.nbytes()));
      jc["inputs"][name] = {{"file", file}, {"shape", t.shape()}, {"kind", ids ? "i64" : "f32"}};
    }
    spec["cases"].push_back(jc);
  }
  std::ofstream(dir / "spec.json") << spec.dump();
  std::string out;
  auto script = source_dir() / "tests/ops/torch_ref/qwen3_ops_ref.py";
  int rc = run_command(torch_python() + " " + script.string() + " " + dir.string(), &out);
  EXPECT_EQ(rc, 0) << out;
  std::vector<Tensor> results;
  for (const auto& c : cases) {
    Shape shape = c.inputs[0].second.shape();
    Tensor r = Tensor::empty(shape, DType::F32);
    std::ifstream in(dir / (c.name + ".out"), std::ios::binary);
    in.read(static_cast<char*>(r.raw_data()), std::streamsize(r.nbytes()));
    EXPECT_EQ(size_t(in.gcount()), r.nbytes()) << "torch output of case " << c.name << " is short";
    results.push_back(r);
  }
  return results;
}

// Distance in ulps of `dtype` (F32 or BF16) between two values representable in it.
inline int64_t ulp_distance(float a, float b, DType dtype) {
  auto ordered = [](float f) {
    int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);  // monotone in f, -0 == +0
  };
  int64_t d = std::abs(ordered(a) - ordered(b));
  return dtype == DType::BF16 ? d >> 16 : d;
}

struct UlpStats {
  int64_t max_ulp = 0, mismatches = 0, n = 0;
  size_t worst = 0;
};

inline UlpStats compare_ulps(const Tensor& got, const Tensor& want, DType dtype) {
  auto g = got.to(DType::F32), w = want.to(DType::F32);
  UlpStats s;
  s.n = g.numel();
  for (int64_t i = 0; i < s.n; ++i) {
    int64_t d = ulp_distance(g.data<float>()[i], w.data<float>()[i], dtype);
    if (d) ++s.mismatches;
    if (d > s.max_ulp) {
      s.max_ulp = d;
      s.worst = size_t(i);
    }
  }
  return s;
}

}  // namespace titan::testing
