// The tokenizer against the JavaScript implementation shipped with the tokenizer's npm
// package (run with node at test time), on a corpus of hard cases and on the default
// dataset; plus decoding, configuration, errors and huge inputs.
#include "titan/data/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "data_test_util.h"
#include "titan/core/check.h"

namespace {
using namespace titan::testing;
using titan::data::Tokenizer;
using json = nlohmann::json;

struct Reference {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;
};

// Ids (and their decoding) from the JavaScript tokenizer.
Reference js_reference(const std::vector<std::string>& docs, const std::string& name, bool add_special = false) {
  auto dir = temp_dir("tokenizer_" + name);
  write_file(dir / "docs.json", json(docs).dump());
  std::string cmd = "node " + (source_dir() / "tests" / "data" / "js_tokenize.js").string() + " " +
                    qwen3_package_dir().string() + " " + (dir / "docs.json").string() + " " +
                    (dir / "ids.json").string() + " --decoded " + (dir / "decoded.json").string() +
                    (add_special ? " --add-special-tokens" : "");
  std::string out;
  int rc = run_command(cmd, &out);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  Reference r;
  r.ids = json::parse(read_file(dir / "ids.json")).get<std::vector<std::vector<int32_t>>>();
  r.decoded = json::parse(read_file(dir / "decoded.json")).get<std::vector<std::string>>();
  return r;
}

void expect_parity(const std::vector<std::string>& docs, const std::string& name) {
  const Tokenizer& tok = qwen3_tokenizer();
  Reference ref = js_reference(docs, name);
  ASSERT_EQ(ref.ids.size(), docs.size());
  size_t mismatched = 0, tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    auto ids = tok.encode(docs[i]);
    tokens += ids.size();
    if (ids != ref.ids[i]) {
      ++mismatched;
      ADD_FAILURE() << "doc " << i << " differs from the JS tokenizer: " << json(docs[i]).dump()
                    << "\n  titan: " << json(ids).dump() << "\n  js:    " << json(ref.ids[i]).dump();
    }
    EXPECT_EQ(tok.decode(ref.ids[i]), ref.decoded[i]) << "decode of doc " << i;
  }
  EXPECT_EQ(mismatched, 0u) << "of " << docs.size() << " documents, " << tokens << " tokens";
}

TEST(Tokenizer, ParityWithJavaScriptOnHardCases) {
  auto docs = json::parse(read_file(fixtures_dir() / "tokenizer" / "parity_corpus.json")).get<std::vector<std::string>>();
  ASSERT_GT(docs.size(), 100u);
  expect_parity(docs, "hard_cases");
}

TEST(Tokenizer, ParityWithJavaScriptOnDefaultCorpus) {
  // 3,000 documents of the default dataset (all 100,000 take ~15 s in JS; see docs/data.md).
  std::vector<std::string> docs;
  std::string text = read_file(assets_dir() / "datasets" / "nlp-corpus" / "train.jsonl");
  std::istringstream lines(text);
  for (std::string line; docs.size() < 3000 && std::getline(lines, line);) docs.push_back(json::parse(line)["text"]);
  ASSERT_EQ(docs.size(), 3000u);
  expect_parity(docs, "corpus");
}

TEST(Tokenizer, LongWordsMatchJavaScript) {
  // Pieces over 64 bytes take the heap-based BPE; it must merge in the same order.
  std::mt19937 rng(7);
  std::string random_letters;
  for (int i = 0; i < 20000; ++i) random_letters += char('a' + rng() % 26);
  std::string ab;
  for (int i = 0; i < 5000; ++i) ab += "ab";
  std::string accented;
  for (int i = 0; i < 3000; ++i) accented += "é";
  expect_parity({random_letters, ab, accented, std::string(5000, '!'), std::string(3000, '7')}, "long");
}

TEST(Tokenizer, AddSpecialTokensFollowsTheConfig) {
  // Qwen3's tokenizer_config.json has add_bos_token=false and no add_eos_token: nothing is added.
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<std::string> docs = {"Hello world", "<|im_start|>user\nhi<|im_end|>"};
  Reference ref = js_reference(docs, "special", /*add_special=*/true);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(tok.encode(docs[i], true), ref.ids[i]);
}

TEST(Tokenizer, SpecialIdsComeFromTheConfigFiles) {
  const Tokenizer& tok = qwen3_tokenizer();
  auto dir = assets_dir() / "tokenizer" / "qwen3";
  json config = json::parse(read_file(dir / "tokenizer_config.json"));
  json tj = json::parse(read_file(dir / "tokenizer.json"));
  auto id_of = [&](const std::string& content) {
    for (auto& t : tj["added_tokens"])
      if (t["content"] == content) return t["id"].get<int32_t>();
    return -1;
  };
  EXPECT_EQ(tok.eos_id(), id_of(config["eos_token"]));
  EXPECT_EQ(tok.pad_id(), id_of(config["pad_token"]));
  EXPECT_EQ(tok.bos_id(), -1);  // bos_token is null
  EXPECT_FALSE(tok.add_bos_token());
  EXPECT_EQ(tok.document_separator_id(), 151643);  // <|endoftext|>, the packing separator
  EXPECT_EQ(tok.vocab_size(), int32_t(tj["model"]["vocab"].size() + tj["added_tokens"].size()));
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok.id_to_token(*tok.token_to_id("Ġthe")), "Ġthe");
  auto ids = tok.encode("a<|im_end|>b");
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "ab");
}

// What an export copies and the ranks compare: tokenizer.json, and tokenizer_config.json and
// chat_template.jinja (transformers' file of the chat template) where they are beside it.
TEST(Tokenizer, ItsFilesAreTheOnesBesideTokenizerJson) {
  const auto dir = temp_dir("tokenizer_files");
  const auto qwen3 = assets_dir() / "tokenizer" / "qwen3";
  std::filesystem::copy_file(qwen3 / "tokenizer.json", dir / "tokenizer.json");
  EXPECT_EQ(titan::data::tokenizer_files(dir), std::vector<std::filesystem::path>{dir / "tokenizer.json"});
  std::filesystem::copy_file(qwen3 / "tokenizer_config.json", dir / "tokenizer_config.json");
  { std::ofstream(dir / "chat_template.jinja") << "{{ messages }}"; }
  const std::vector<std::filesystem::path> all = {dir / "tokenizer.json", dir / "tokenizer_config.json",
                                                  dir / "chat_template.jinja"};
  EXPECT_EQ(titan::data::tokenizer_files(dir), all);
  EXPECT_EQ(titan::data::tokenizer_files(dir / "tokenizer.json"), all);
  EXPECT_EQ(Tokenizer::load(dir).source(), dir / "tokenizer.json");
}

// tokenizer_config.json's clean_up_tokenization_spaces: decode applies transformers'
// clean_up_tokenization, and the decode of more ids can rewrite the tail of the decode before them
// (" " then "." decodes to "."); settled_length says how much a stream may print: every settled
// part is a prefix of the whole decode (titan generate's stream failed once the text was whole).
TEST(Tokenizer, CleanedUpSpacesAreDecodedAndStreamedAsTheWhole) {
  const auto dir = temp_dir("tokenizer_cleanup");
  const auto qwen3 = assets_dir() / "tokenizer" / "qwen3";
  std::filesystem::copy_file(qwen3 / "tokenizer.json", dir / "tokenizer.json");
  json config = json::parse(read_file(qwen3 / "tokenizer_config.json"));
  config["clean_up_tokenization_spaces"] = true;
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  const Tokenizer tok = Tokenizer::load(dir);
  const std::vector<int32_t> ids = tok.encode("Hello , world . I do n't know ' s it 's fine ! ok ?");
  EXPECT_EQ(tok.decode(ids), "Hello, world. I don't know's it's fine! ok?");
  // Every settled part of a decode of the first ids is a prefix of the whole; some decode of a
  // prefix is not (the case a stream must hold back).
  auto streams_as_the_whole = [&](const std::vector<int32_t>& ids) {
    const std::string whole = tok.decode(ids);
    bool rewritten = false;
    for (size_t k = 1; k <= ids.size(); ++k) {
      const std::string part = tok.decode(std::span(ids).first(k));
      rewritten |= !whole.starts_with(part);
      EXPECT_TRUE(whole.starts_with(part.substr(0, tok.settled_length(part)))) << k << ": '" << part << "'";
    }
    EXPECT_TRUE(rewritten) << whole;
  };
  streams_as_the_whole(ids);
  // " ' " then " ." : the rule applied first takes the space the apostrophe's rule needed.
  const std::vector<int32_t> a = tok.encode("a"), quote = tok.encode(" '"), space = tok.encode(" "),
                             stop = tok.encode(".");
  std::vector<int32_t> cut = a;
  for (const auto* piece : {&quote, &space, &stop}) cut.insert(cut.end(), piece->begin(), piece->end());
  EXPECT_EQ(tok.decode(cut), "a '.");
  streams_as_the_whole(cut);
  // Without the clean-up all of a decode is settled, but a character cut between tokens.
  EXPECT_EQ(qwen3_tokenizer().settled_length("a ."), 3u);
  EXPECT_EQ(qwen3_tokenizer().settled_length("ab\xEF\xBF\xBD"), 0u);
}

TEST(Tokenizer, InvalidUtf8IsReplacedBeforeEncoding) {
  const Tokenizer& tok = qwen3_tokenizer();
  EXPECT_EQ(tok.encode("caf\xC3 au lait \xFF\xFE!"), tok.encode("caf\xEF\xBF\xBD au lait \xEF\xBF\xBD\xEF\xBF\xBD!"));
}

TEST(Tokenizer, TenMegabyteWordIsNearLinear) {
  // A quadratic BPE would take hours here; ctest's timeout is the guard.
  const Tokenizer& tok = qwen3_tokenizer();
  std::mt19937 rng(11);
  std::string doc(10 << 20, 'a');
  for (auto& c : doc) c = char('a' + rng() % 26);
  auto ids = tok.encode(doc);
  EXPECT_GT(ids.size(), doc.size() / 16);
  EXPECT_EQ(tok.decode(ids), doc);
}

TEST(Tokenizer, ConcurrentEncodingMatchesSerial) {
  const Tokenizer& tok = qwen3_tokenizer();
  auto docs = json::parse(read_file(fixtures_dir() / "tokenizer" / "parity_corpus.json")).get<std::vector<std::string>>();
  std::vector<std::vector<int32_t>> serial;
  for (auto& d : docs) serial.push_back(tok.encode(d));
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (auto& d : docs) results[t].push_back(tok.encode(d));
    });
  for (auto& th : threads) th.join();
  for (auto& r : results) EXPECT_EQ(r, serial);
}

// A minimal byte-level tokenizer.json whose parts the error tests replace.
json tiny_tokenizer() {
  // The real file's 256 byte tokens are ids 0..255; reuse them.
  json vocab = json::object();
  json real = json::parse(read_file(assets_dir() / "tokenizer" / "qwen3" / "tokenizer.json"));
  for (auto& [token, id] : real["model"]["vocab"].items())
    if (id.get<int>() < 256) vocab[token] = id;
  return json{{"version", "1.0"},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer", real["pre_tokenizer"]},
              {"decoder", {{"type", "ByteLevel"}}},
              {"post_processor", nullptr},
              {"added_tokens", json::array()},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

void expect_load_error(const json& tj, const std::string& name, const std::string& needle) {
  auto dir = temp_dir("tokenizer_error_" + name);
  write_file(dir / "tokenizer.json", tj.dump());
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << name << ": loaded without error";
  } catch (const titan::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnsupportedFeaturesAreErrors) {
  json ok = tiny_tokenizer();
  auto dir = temp_dir("tokenizer_tiny");
  write_file(dir / "tokenizer.json", ok.dump());
  Tokenizer tiny = Tokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(tiny.decode(tiny.encode("héllo wörld")), "héllo wörld");  // bytes only, no merges

  json t = ok;
  t["model"]["type"] = "WordPiece";
  expect_load_error(t, "model", "model type 'WordPiece' is not implemented");
  t = ok;
  t["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(t, "normalizer", "normalizer 'NFKC' is not implemented");
  t = ok;
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error(t, "pre_tokenizer", "pre-tokenizer 'Whitespace' is not implemented");
  t = ok;
  t["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(t, "decoder", "decoder 'WordPiece' is not implemented");
  t = ok;
  t["post_processor"] = {{"type", "TemplateProcessing"}};
  expect_load_error(t, "post", "post_processor 'TemplateProcessing' is not implemented");
  t = ok;
  t["model"]["byte_fallback"] = true;
  expect_load_error(t, "byte_fallback", "byte_fallback");
  t = ok;
  t["model"]["merges"] = json::array({json::array({"Ġ", "zzz"})});
  expect_load_error(t, "merge", "missing from the vocab");
  expect_load_error(json::object(), "empty", "has no 'model'");
}

}  // namespace
