// Garbage is not accepted as data (src/titan/data/text_guard.h), and JSON errors point at the real
// fault (src/titan/io/json_error.h), with the file, line and column.
#include "titan/data/text_guard.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/data/dataset.h"
#include "titan/io/json_error.h"
#include "titan/models/qwen3/args.h"

using namespace titan;
using namespace titan::data;
namespace fs = std::filesystem;

namespace {

using titan::testing::error_of;

fs::path write(const std::string& dir, const std::string& name, const std::string& bytes) {
  fs::path p = titan::testing::temp_dir(dir) / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// Reads every document; returns the error, or "" when the whole file was accepted.
std::string read_all(const fs::path& p, uint64_t* documents = nullptr) {
  return error_of([&] {
    DocumentStream s(DatasetConfig{{p}});
    Document d;
    while (s.next(d)) {
    }
    if (documents) *documents = s.stats().documents;
  });
}

}  // namespace

TEST(TextGuard, RandomBytesAreRejectedAtTheFirstDocumentWithFileAndLine) {
  std::mt19937 rng(1234);
  std::string bytes(200 * 1024, '\0');
  for (char& c : bytes) c = char(rng() & 0xFF);
  const fs::path p = write("text_guard_random", "random.txt", bytes);
  std::string e = read_all(p);
  EXPECT_NE(e.find(p.string() + ":1: "), std::string::npos) << e.substr(0, 400);
  EXPECT_NE(e.find("is not text"), std::string::npos) << e.substr(0, 400);
  // The same as a JSON Lines file.
  const fs::path j =
      write("text_guard_random_jsonl", "random.jsonl", "{\"text\": \"" + bytes.substr(0, 2000) + "\"}\n");
  e = read_all(j);
  EXPECT_FALSE(e.empty());
}

TEST(TextGuard, TextWithAFewBadBytesIsRepairedAndAccepted) {
  // 3 replacements in ~1 KB: a damaged but real document, kept (the rule needs at least 4 and > 10%).
  std::string text;
  for (int i = 0; i < 20; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  text[100] = char(0xFF);
  text[300] = char(0xFE);
  text[500] = char(0x80);
  uint64_t docs = 0;
  EXPECT_EQ(read_all(write("text_guard_mild", "mild.txt", text + "\n\nSecond document.\n"), &docs), "");
  EXPECT_EQ(docs, 2u);
  // The same document with 1 in 5 characters a NUL: rejected, naming line 3 where it starts.
  std::string bad = text;
  for (size_t i = 0; i < bad.size(); i += 5) bad[i] = '\0';
  std::string e = read_all(write("text_guard_nul", "nul.txt", "Fine first document.\n\n" + bad + "\n"));
  EXPECT_NE(e.find("nul.txt:3: "), std::string::npos) << e;
  uint64_t chars = 0;
  EXPECT_EQ(garbage_characters("ok\xEF\xBF\xBD\x01\t\n", &chars), 2u);
  EXPECT_EQ(chars, 6u);
}

TEST(JsonErrors, ATrailingCommaIsNamedAtTheComma) {
  // JSON array datasets: one line, then several.
  std::string e = read_all(write("json_err_array", "a.json", "[\"a\", \"b\",]\n"));
  EXPECT_NE(e.find("a.json:1: trailing comma at column 10 before ']'"), std::string::npos) << e;
  e = read_all(write("json_err_array2", "b.json", "[\n  \"a\",\n  \"b\",\n]\n"));
  EXPECT_NE(e.find("b.json:3: trailing comma at column 6 before ']'"), std::string::npos) << e;
  // Inside an element of a JSON Lines file: the file's line and column.
  e = read_all(write("json_err_jsonl", "c.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"a\",}\n"));
  EXPECT_NE(e.find("c.jsonl:2: malformed JSON at column 13: trailing comma before '}'"), std::string::npos)
      << e;
  // Another fault is reported where it is, in the file's coordinates.
  e = read_all(write("json_err_jsonl2", "d.jsonl", "{\"text\": \"fine\"}\n{\"text\" \"a\"}\n"));
  EXPECT_NE(e.find("d.jsonl:2: malformed JSON at column "), std::string::npos) << e;
  // A model config.json.
  const fs::path cfg =
      write("json_err_config", "config.json", "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n}\n");
  e = error_of([&] { qwen3::args_from_hf_config_file(cfg.string()); });
  EXPECT_NE(e.find("config.json: invalid JSON at line 2, column 40: trailing comma before '}'"),
            std::string::npos)
      << e;
}

// A JSON Lines file saved as UTF-16 (as some Windows tools write it): the error says so, and the bytes
// the parser quotes are escaped, so the log stays text.
TEST(JsonErrors, AUtf16FileIsNamedAndItsBytesAreEscaped) {
  std::string utf16 = "\xFF\xFE";
  for (char c : std::string("{\"text\": \"hi there\"}\n")) utf16 += std::string(1, c) + '\0';
  const std::string e = read_all(write("json_err_utf16", "u16.jsonl", utf16));
  EXPECT_NE(e.find("u16.jsonl:1: malformed JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("the text looks UTF-16; titan reads UTF-8"), std::string::npos) << e;
  EXPECT_NE(e.find("\\xEF"), std::string::npos) << e;  // nlohmann quotes the bytes it read: escaped
  for (unsigned char c : e) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << int(c) << " in " << e;
  // Other binary data with zero bytes (a safetensors file's header length) is not called UTF-16.
  const fs::path st =
      write("json_err_binary", "model.safetensors", std::string("\x58\x02\0\0\0\0\0\0{\"a\":1}", 15));
  const std::string b = error_of([&] { titan::io::read_json_file(st, "model config"); });
  EXPECT_NE(b.find("invalid JSON at line 1, column 1"), std::string::npos) << b;
  EXPECT_EQ(b.find("UTF-16"), std::string::npos) << b;
  // A number past double's range names the file too (nlohmann reports it as out_of_range, not a syntax
  // error).
  const fs::path big = write("json_err_overflow", "config.json", "{\"vocab_size\": 1e999}");
  const std::string o = error_of([&] { titan::io::read_json_file(big, "model config"); });
  EXPECT_NE(o.find(big.string() + "': invalid JSON: number overflow parsing '1e999'"), std::string::npos)
      << o;
}

TEST(TextGuard, EveryDocumentOfTheBundledCorpusIsText) {
  // Real English text with its few damaged bytes (51 documents, at most 4 of 81 characters) must
  // pass the rule: a threshold that rejects the default dataset would stop the main job mid-run.
  for (const char* f : {"nlp-corpus/train.jsonl", "nlp-corpus-validation/val.jsonl"}) {
    uint64_t docs = 0;
    EXPECT_EQ(read_all(titan::testing::assets_dir() / "datasets" / f, &docs), "") << f;
    EXPECT_GT(docs, 999u) << f;
  }
}
