// Document streams: the formats, folders, text fields, bad input, seeking, sharding.
#include "titan/data/dataset.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "gzip_test_util.h"
#include "titan/core/check.h"
#include "titan/data/data_identity.h"

namespace {
using namespace titan::testing;
using namespace titan::data;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<std::string> read_all(DocumentStream& s, std::vector<DocPosition>* positions = nullptr) {
  return read_texts(s, positions);
}

std::vector<std::string> read_all(DatasetConfig config) {
  DocumentStream s(std::move(config));
  return read_all(s);
}

// Seeking back to each of the documents `at` (their positions through JSON, as a checkpoint stores
// them) reads that document again, at the same position (offsets and lines count decompressed bytes).
void expect_seeks_back(DocumentStream& s, const std::vector<DocPosition>& positions,
                       const std::vector<std::string>& docs, std::initializer_list<size_t> at) {
  for (size_t i : at) {
    s.seek(json(positions[i]).get<DocPosition>());
    Document d;
    ASSERT_TRUE(s.next(d)) << "document " << i;
    EXPECT_EQ(d.text, docs[i]);
    EXPECT_EQ(d.position, positions[i]);
  }
}

std::string error_of(DatasetConfig config) {
  try {
    read_all(std::move(config));
  } catch (const titan::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Dataset, JsonArrayOfStringsAndObjects) {
  auto dir = temp_dir("dataset_json");
  write_file(dir / "a.json", "\xEF\xBB\xBF[\n  \"first\",\n  \"\",\n  \"with \\\"escapes\\\" \\u00e9 ] , [\"\n]\n");
  write_file(dir / "b.json", R"([{"body": "one", "id": 1}, {"body": "two", "meta": {"x": [1, {"y": "]"}]}}])");
  EXPECT_EQ(read_all({{dir / "a.json"}}), (std::vector<std::string>{"first", "with \"escapes\" \u00e9 ] , ["}));
  EXPECT_EQ(read_all({{dir / "b.json"}, "body"}), (std::vector<std::string>{"one", "two"}));
  EXPECT_NE(
      error_of({{dir / "b.json"}})
          .find("b.json:1: object has no field 'text' (training.text_field names the field to read; its "
                "fields are 'body', 'id')"),
      std::string::npos)
      << error_of({{dir / "b.json"}});
}

TEST(Dataset, JsonLinesWithCrlfAndBlankLines) {
  auto dir = temp_dir("dataset_jsonl");
  write_file(dir / "d.jsonl", "{\"text\": \"a\"}\r\n\r\n\"b\"\r\n{\"text\": \"\"}\n{\"text\": \"c\\nd\"}");
  DocumentStream s({{dir / "d.jsonl"}});
  EXPECT_EQ(read_all(s), (std::vector<std::string>{"a", "b", "c\nd"}));
  EXPECT_EQ(s.stats().empty_skipped, 1u);
  // A .json file that is not an array is read as JSON Lines.
  write_file(dir / "e.json", "{\"text\": \"x\"}\n{\"text\": \"y\"}\n");
  EXPECT_EQ(read_all({{dir / "e.json"}}), (std::vector<std::string>{"x", "y"}));
}

TEST(Dataset, PlainTextSplits) {
  auto dir = temp_dir("dataset_text");
  std::string text = "para one\r\nstill one\r\n\r\n\n  \npara two\nend";
  write_file(dir / "t.txt", text);
  EXPECT_EQ(read_all({{dir / "t.txt"}}), (std::vector<std::string>{"para one\r\nstill one", "para two\nend"}));
  EXPECT_EQ(read_all({{dir / "t.txt"}, "text", "line"}),
            (std::vector<std::string>{"para one", "still one", "para two", "end"}));
  EXPECT_EQ(read_all({{dir / "t.txt"}, "text", "file"}), (std::vector<std::string>{text}));
  EXPECT_NE(error_of({{dir / "t.txt"}, "text", "sentence"}).find("text_split 'sentence'"), std::string::npos);
  // A name without an extension is plain text; another extension is a format titan does not read
  // (a .xml of JSON lines would otherwise train on the raw JSON).
  write_file(dir / "corpus", "para\n\nother\n");
  EXPECT_EQ(read_all({{dir / "corpus"}}), (std::vector<std::string>{"para", "other"}));
  write_file(dir / "rows.xml", "{\"text\": \"a\"}\n");
  const std::string e = error_of({{dir / "rows.xml"}});
  EXPECT_NE(e.find("rows.xml: '.xml' files are not a format titan reads"), std::string::npos) << e;
  // A UTF-8 byte-order mark opening the file is not text (a character that merely starts with the
  // same byte, U+FF01, is).
  write_file(dir / "bom.txt",
             "\xEF\xBB\xBF"
             "alpha one\n\nbeta\n");
  EXPECT_EQ(read_all({{dir / "bom.txt"}}), (std::vector<std::string>{"alpha one", "beta"}));
  EXPECT_EQ(read_all({{dir / "bom.txt"}, "text", "line"}), (std::vector<std::string>{"alpha one", "beta"}));
  EXPECT_EQ(read_all({{dir / "bom.txt"}, "text", "file"}), (std::vector<std::string>{"alpha one\n\nbeta\n"}));
  write_file(dir / "bang.txt", "\xEF\xBC\x81 wow\n");
  EXPECT_EQ(read_all({{dir / "bang.txt"}}), (std::vector<std::string>{"\xEF\xBC\x81 wow"}));
}

TEST(Dataset, FoldersAreSearchedAndSorted) {
  auto dir = temp_dir("dataset_folder");
  write_file(dir / "b" / "2.jsonl", "\"b2\"\n");
  write_file(dir / "a.txt", "a\n");
  write_file(dir / "b" / "1.json", "[\"b1\"]");
  write_file(dir / "b" / "skip.bin", "binary");
  write_file(dir / "c" / "UPPER.JSONL", "\"c\"\n");  // extensions in any case (Windows tools)
  write_file(dir / ".hidden" / "h.txt", "hidden");
  EXPECT_EQ(read_all({{dir}}), (std::vector<std::string>{"a", "b1", "b2", "c"}));
  // What the start-up line names as passed over: the other types' files, not the hidden ones.
  EXPECT_EQ(files_passed_over({dir}), (std::vector<fs::path>{dir / "b" / "skip.bin"}));
  EXPECT_TRUE(files_passed_over({dir / "a.txt"}).empty());
  EXPECT_EQ(files_passed_over({dir / "?"}),
            (std::vector<fs::path>{dir / "b" / "skip.bin"}));  // a glob's folders
  EXPECT_NE(error_of({{dir / "missing"}}).find("does not exist"), std::string::npos);
  // A data file's link to nothing is a missing file, named; a link loop is named too.
  fs::create_symlink(dir / "gone.jsonl", dir / "b" / "3.jsonl");
  std::string e = error_of({{dir}});
  EXPECT_NE(e.find("3.jsonl\" in folder"), std::string::npos) << e;
  EXPECT_NE(e.find("is a symbolic link to nothing"), std::string::npos) << e;
  fs::remove(dir / "b" / "3.jsonl");
  fs::create_directory_symlink(dir / "b", dir / "b" / "loop");
  e = error_of({{dir}});
  EXPECT_NE(
      e.find("dataset: folder \"" + dir.string() + "\" cannot be listed: Too many levels of symbolic links"),
      std::string::npos)
      << e;
}

TEST(Dataset, MalformedJsonNamesFileAndLine) {
  auto dir = temp_dir("dataset_malformed");
  write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": oops}\n");
  std::string e = error_of({{dir / "bad.jsonl"}});
  EXPECT_NE(e.find("bad.jsonl:3: malformed JSON"), std::string::npos) << e;
  write_file(dir / "bad.json", "[\"ok\",\n\"ok\",\n{\"text\": 5}]");
  e = error_of({{dir / "bad.json"}});
  EXPECT_NE(e.find("bad.json:3: field 'text' is number"), std::string::npos) << e;
  write_file(dir / "open.json", "[\"ok\", \"never closed\"");
  e = error_of({{dir / "open.json"}});
  EXPECT_NE(e.find("open.json:1: JSON array is not closed"), std::string::npos) << e;
  // A .json that is not an array reads one value per line: a pretty-printed object says so.
  write_file(dir / "pretty.json", "{\n  \"text\": \"hello\"\n}\n");
  e = error_of({{dir / "pretty.json"}});
  EXPECT_NE(e.find("pretty.json:1: malformed JSON at column 2"), std::string::npos) << e;
  EXPECT_NE(e.find("(a .json file holds one JSON array, or one JSON value per line)"), std::string::npos)
      << e;
  EXPECT_EQ(error_of({{dir / "bad.jsonl"}}).find("one JSON value per line"), std::string::npos);
}

TEST(Dataset, InvalidUtf8IsReplacedAndCounted) {
  auto dir = temp_dir("dataset_utf8");
  write_file(dir / "u.jsonl", "{\"text\": \"caf\xC3 \xFF\xFE\"}\n\"fine\"\n");
  write_file(dir / "u.txt", "bad \x80 byte\n");
  ::testing::internal::CaptureStderr();
  DocumentStream s({{dir / "u.jsonl", dir / "u.txt"}});
  EXPECT_EQ(read_all(s), (std::vector<std::string>{"caf\uFFFD \uFFFD\uFFFD", "fine", "bad \uFFFD byte"}));
  EXPECT_EQ(s.stats().invalid_utf8, 4u);
  // One warning per file and process, at its first bad document: a second pass (an epoch, a
  // validation run) says nothing again.
  DocumentStream again({{dir / "u.jsonl", dir / "u.txt"}});
  read_all(again);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find((dir / "u.jsonl").string() + ":1: invalid UTF-8 replaced by U+FFFD (3 sequence(s)"),
            std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find((dir / "u.txt").string() + ":1: invalid UTF-8"), std::string::npos) << warnings;
  size_t count = 0;
  for (size_t at = warnings.find("warning:"); at != std::string::npos; at = warnings.find("warning:", at + 1))
    ++count;
  EXPECT_EQ(count, 2u) << warnings;
}

// Python's json.dumps (ensure_ascii, its default) writes a string holding a lone surrogate as its
// \ud83d escape, which JSON parsers refuse: each unpaired one becomes U+FFFD and is counted with the
// invalid UTF-8, in JSON Lines, in compressed JSON arrays and in conversations. A pair stays one
// character; after an escaped backslash the letters are text.
TEST(Dataset, UnpairedSurrogateEscapesAreReplacedAndCounted) {
  auto dir = temp_dir("dataset_surrogates");
  const std::vector<std::string> records = {R"({"text": "lone high \ud83d here"})",
                                            R"({"text": "lone low \uDE00 here"})",
                                            R"({"text": "reversed \ude00\ud83d pair"})",
                                            R"({"text": "a pair \ud83d\ude00 stays"})",
                                            R"({"text": "escaped backslash \\ud83d is text"})",
                                            R"({"text": "high then pair \ud83d\ud83d\ude00"})"};
  const std::vector<std::string> want = {"lone high \uFFFD here",
                                         "lone low \uFFFD here",
                                         "reversed \uFFFD\uFFFD pair",
                                         "a pair \U0001F600 stays",
                                         "escaped backslash \\ud83d is text",
                                         "high then pair \uFFFD\U0001F600"};
  std::string lines, array = "[";
  for (const std::string& r : records) {
    lines += r + "\n";
    array += (array.size() > 1 ? ",\n" : "") + r;
  }
  write_file(dir / "s.jsonl", lines);
  write_file(dir / "s.json.gz", gzip_bytes(array + "]"));
  for (const fs::path& file : {dir / "s.jsonl", dir / "s.json.gz"}) {
    ::testing::internal::CaptureStderr();
    DocumentStream s({{file}});
    EXPECT_EQ(read_all(s), want) << file;
    EXPECT_EQ(s.stats().invalid_utf8, 5u) << file;
    const std::string warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warnings.find(file.string() + ":1: invalid UTF-8 replaced by U+FFFD (1 sequence(s)"),
              std::string::npos)
        << warnings;
  }
  write_file(
      dir / "chat.jsonl",
      R"({"messages": [{"role": "user", "content": "q \ud83d"}, {"role": "assistant", "content": "a"}]})"
      "\n");
  DatasetConfig chat{{dir / "chat.jsonl"}};
  chat.chat_field = "messages";
  ::testing::internal::CaptureStderr();
  DocumentStream s(chat);
  const auto texts = read_all(s);
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_NE(texts[0].find("<|im_start|>user\nq \uFFFD<|im_end|>"), std::string::npos) << texts[0];
  EXPECT_EQ(s.stats().invalid_utf8, 1u);
}

// A record without the chat field names its fields; where one of them holds messages the error says
// what reads them: the field's name for role/content messages, the mapping for ShareGPT's.
TEST(Dataset, AConversationRecordWithoutTheChatFieldSaysWhatReadsItsMessages) {
  auto dir = temp_dir("dataset_chat_field");
  write_file(dir / "sharegpt.jsonl",
             R"({"id": 7, "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"
             "\n");
  write_file(dir / "named.jsonl",
             R"({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
             "\n");
  DatasetConfig config{{dir / "sharegpt.jsonl"}};
  config.chat_field = "messages";
  const std::string sharegpt = error_of(config);
  EXPECT_NE(
      sharegpt.find(
          R"(sharegpt.jsonl:1: object has no field 'messages' (training.chat_field names the messages; its )"
          R"(fields are 'id', 'conversations'): its 'conversations' holds ShareGPT messages {"from", )"
          R"("value"}, which titan does not read: write "from" as "role" (human -> user, gpt -> assistant, )"
          R"(system -> system) and "value" as "content", and the list as 'messages')"),
      std::string::npos)
      << sharegpt;
  config.paths = {dir / "named.jsonl"};
  const std::string named = error_of(config);
  EXPECT_NE(named.find(R"(its fields are 'conversations'): training.chat_field = "conversations" reads its )"
                       R"('conversations')"),
            std::string::npos)
      << named;
  // Read under that name, a ShareGPT list is refused message by message, with the same mapping.
  config.paths = {dir / "sharegpt.jsonl"};
  config.chat_field = "conversations";
  const std::string messages = error_of(config);
  EXPECT_NE(messages.find("sharegpt.jsonl:1: field 'conversations': "), std::string::npos) << messages;
  EXPECT_NE(messages.find("message 0: has no field 'role': it is a ShareGPT message"), std::string::npos)
      << messages;
}

// A record nested 100,000 levels deep parses (JSON parses iteratively); where a conversation's tool
// arguments or signatures must be written out (recursively, as Python's json.dumps writes them) it is
// an error naming the line, message and field and the limit, not a stack overflow. A text record
// with such a field beside its text reads.
TEST(Dataset, RecordsNestedPastTheLimitAreErrorsNotCrashes) {
  auto dir = temp_dir("dataset_deep");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string turns = R"({"role": "user", "content": "q"}, {"role": "assistant", "content": "")";
  write_file(
      dir / "arguments.jsonl",
      "{\"messages\": [" + turns + R"(, "tool_calls": [{"name": "f", "arguments": )" + deep + "}]}]}\n");
  write_file(dir / "nested.json", "[{\"messages\": [" + turns +
                                      R"(, "tool_calls": [{"function": {"name": "f", "arguments": )" + deep +
                                      "}}]}]}]");
  write_file(dir / "tools.jsonl",
             "{\"messages\": [" + turns + "}], \"tools\": [{\"parameters\": " + deep + "}]}\n");
  const std::string rule =
      ": nested more than 512 arrays and objects deep (titan writes JSON up to 512 levels";
  for (const auto& [file, where] : {std::pair{"arguments.jsonl", "message 1: tool_calls[0].arguments"},
                                    std::pair{"nested.json", "message 1: tool_calls[0].function.arguments"},
                                    std::pair{"tools.jsonl", "tools[0]"}}) {
    DatasetConfig config{{dir / file}};
    config.chat_field = "messages";
    const std::string e = error_of(config);
    EXPECT_NE(e.find(std::string(file) + ":1: field 'messages': "), std::string::npos) << e;
    EXPECT_NE(e.find(std::string(where) + rule), std::string::npos) << e;
  }
  write_file(dir / "text.jsonl", "{\"text\": \"kept\", \"meta\": " + deep + "}\n");
  EXPECT_EQ(read_all({{dir / "text.jsonl"}}), std::vector<std::string>{"kept"});
}

// A closing bracket that closes nothing, or another kind than the one open, is an error where it
// stands, not a scan of the rest of the file into one element that fails at its end.
TEST(Dataset, JsonArrayBracketsThatCloseNothingAreNamedWhereTheyStand) {
  auto dir = temp_dir("dataset_brackets");
  const std::string rest = ",\n" + std::string(3000, ' ') + "\"more\", {\"text\": \"and more\"}]\n";
  for (const auto& [text, message] :
       {std::pair{"[\"ok\",\n}" + rest,
                  "b.json:2: unexpected '}' at column 1: it closes no bracket of this array element"},
        std::pair{"[1}" + rest, "b.json:1: unexpected '}' at column 3: it closes no bracket"},
        std::pair{"[\"ok\",\n  {\"text\": [1}" + rest,
                  "b.json:2: unexpected '}' at column 14: the bracket open here is '['"},
        std::pair{"[{\"text\": \"x\"]" + rest,
                  "b.json:1: unexpected ']' at column 14: the bracket open here is '{'"},
        // After a whole element: named where it stands too, and where an unclosed array ends.
        std::pair{"[\n{\"text\":\"a\"}}" + rest,
                  "b.json:2: unexpected '}' at column 13: expected ',' or ']' after an array element (a "
                  "bracket too many?)"},
        std::pair{std::string("[\"a\",\n\"b\"  "),
                  "b.json:2: JSON array is not closed with ']' (the file ends at column 6)"}}) {
    write_file(dir / "b.json", text);
    const std::string e = error_of({{dir / "b.json"}});
    EXPECT_NE(e.find(message), std::string::npos) << e;
  }
}

TEST(Dataset, StreamsAcrossBufferBoundariesAndSeeksBack) {
  // Larger than the 1 MiB read buffer, so documents straddle refills.
  auto dir = temp_dir("dataset_big");
  std::vector<std::string> want;
  json array = json::array();
  std::string lines;
  for (int i = 0; i < 3000; ++i) {
    std::string doc = "document " + std::to_string(i) + " " + std::string(300 + i % 700, char('a' + i % 26));
    want.push_back(doc);
    array.push_back(doc);
    lines += json{{"text", doc}}.dump() + "\n";
  }
  write_file(dir / "big.json", array.dump(1));
  write_file(dir / "big.jsonl", lines);
  for (auto file : {dir / "big.json", dir / "big.jsonl"}) {
    DocumentStream s({{file}});
    std::vector<DocPosition> positions;
    ASSERT_EQ(read_all(s, &positions), want) << file;
    expect_seeks_back(s, positions, want, {0, 1, 1234, 2999});
  }
}

// ---- compressed and sharded data ---------------------------------------------------------------

// The first `n` documents of the bundled corpus, as JSON Lines.
std::string corpus_lines(size_t n) {
  std::ifstream f(assets_dir() / "datasets" / "nlp-corpus" / "train.jsonl");
  std::string line, out;
  for (size_t i = 0; i < n && std::getline(f, line); ++i) out += line + "\n";
  return out;
}

TEST(Dataset, GzipFilesReadLikeTheirPlainContent) {
  auto dir = temp_dir("dataset_gzip");
  // More than the 1 MiB read buffer and many 256 KiB compressed chunks: documents straddle both.
  const size_t n = 30000;
  const std::string lines = corpus_lines(n);
  ASSERT_GT(lines.size(), size_t(2) << 20);
  ASSERT_GT(gzip_bytes(lines).size(), size_t(512) << 10);
  json array = json::array({"first", json{{"text", "second"}}, "third"});
  const std::string text = "para one\nline two\n\npara three\n";
  write_file(dir / "plain" / "a.jsonl", lines);
  write_file(dir / "plain" / "b.json", array.dump());
  write_file(dir / "plain" / "c.txt", text);
  write_file(dir / "gz" / "a.jsonl.gz", gzip_bytes(lines));
  write_file(dir / "gz" / "b.json.gz", gzip_bytes(array.dump()));
  write_file(dir / "gz" / "c.txt.gz", gzip_bytes(text));
  auto plain = read_all({{dir / "plain"}});
  ASSERT_EQ(plain.size(), n + 3 + 2);
  EXPECT_EQ(read_all({{dir / "gz"}}), plain);
  // A shard written as several gzip members (`cat a.gz b.gz`, bgzip) reads as one stream.
  write_file(dir / "multi" / "a.jsonl.gz", gzip_bytes(lines.substr(0, 100000)) + gzip_bytes(lines.substr(100000)));
  EXPECT_EQ(read_all({{dir / "multi"}}), std::vector<std::string>(plain.begin(), plain.begin() + n));
}

// zstd shards (SlimPajama's .jsonl.zst, Dolma's .json.zst) read as their plain content: one frame,
// several frames, a skippable frame between them, and a frame written without its content size
// (streamed, as `zstd -` from a pipe writes it); a saved position inside one resumes exactly.
TEST(Dataset, ZstdFilesReadLikeTheirPlainContent) {
  auto dir = temp_dir("dataset_zstd");
  const size_t n = 30000;
  const std::string lines = corpus_lines(n);
  ASSERT_GT(zstd_bytes(lines).size(), size_t(512) << 10);  // many 256 KiB compressed chunks
  json array = json::array({"first", json{{"text", "second"}}, "third"});
  const std::string text = "para one\nline two\n\npara three\n";
  write_file(dir / "plain" / "a.jsonl", lines);
  write_file(dir / "plain" / "b.json", array.dump());
  write_file(dir / "plain" / "c.txt", text);
  write_file(dir / "zst" / "a.jsonl.zst", zstd_bytes(lines, 19));
  write_file(dir / "zst" / "b.json.zst", zstd_bytes(array.dump()));
  write_file(dir / "zst" / "c.txt.zst", zstd_bytes(text));
  auto plain = read_all({{dir / "plain"}});
  ASSERT_EQ(plain.size(), n + 3 + 2);
  EXPECT_EQ(read_all({{dir / "zst"}}), plain);

  // Two frames with a skippable frame (magic 0x184D2A50, 4 bytes of payload) between them.
  const std::string skippable(
      "\x50\x2a\x4d\x18\x04\x00\x00\x00"
      "abcd",
      12);
  write_file(dir / "multi" / "a.jsonl.zst",
             zstd_bytes(lines.substr(0, 100000)) + skippable + zstd_bytes(lines.substr(100000)));
  const std::vector<std::string> docs(plain.begin(), plain.begin() + n);
  EXPECT_EQ(read_all({{dir / "multi"}}), docs);

  // Streamed: the frame header carries no content size, the decoder flushes as it goes.
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  std::string streamed(ZSTD_compressBound(lines.size()) + 1024, '\0');
  ZSTD_outBuffer out{streamed.data(), streamed.size(), 0};
  for (size_t at = 0; at < lines.size(); at += 4096) {
    ZSTD_inBuffer in{lines.data() + at, std::min<size_t>(4096, lines.size() - at), 0};
    while (in.pos < in.size)
      ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(ctx, &out, &in, ZSTD_e_continue)));
  }
  ZSTD_inBuffer none{nullptr, 0, 0};
  size_t left = 1;
  while (left != 0) {
    left = ZSTD_compressStream2(ctx, &out, &none, ZSTD_e_end);
    ASSERT_FALSE(ZSTD_isError(left));
  }
  ZSTD_freeCCtx(ctx);
  streamed.resize(out.pos);
  write_file(dir / "streamed" / "a.jsonl.zst", streamed);
  EXPECT_EQ(read_all({{dir / "streamed"}}), docs);

  DocumentStream s({{dir / "multi" / "a.jsonl.zst"}});
  std::vector<DocPosition> positions;
  ASSERT_EQ(read_all(s, &positions), docs);
  expect_seeks_back(s, positions, docs, {0, 1, 15001, n - 1});
}

TEST(Dataset, CorruptedTruncatedAndEmptyZstdNameTheFile) {
  auto dir = temp_dir("dataset_zstd_bad");
  const std::string zst = zstd_bytes(corpus_lines(2000));
  write_file(dir / "truncated.jsonl.zst", zst.substr(0, zst.size() / 2));
  std::string e = error_of({{dir / "truncated.jsonl.zst"}});
  EXPECT_NE(e.find("truncated.jsonl.zst"), std::string::npos) << e;
  EXPECT_NE(e.find("is truncated: its zstd stream ends early"), std::string::npos) << e;
  // Only the 4-byte checksum missing: every byte decoded, the frame still incomplete.
  write_file(dir / "no_checksum.jsonl.zst", zst.substr(0, zst.size() - 4));
  e = error_of({{dir / "no_checksum.jsonl.zst"}});
  EXPECT_NE(e.find("is truncated"), std::string::npos) << e;

  std::string corrupted = zst;
  for (size_t i = 1000; i < 1064; ++i) corrupted[i] = char(corrupted[i] ^ 0x5a);
  write_file(dir / "corrupted.jsonl.zst", corrupted);
  e = error_of({{dir / "corrupted.jsonl.zst"}});
  EXPECT_NE(e.find("corrupted.jsonl.zst"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid zstd data in the frame at compressed byte"), std::string::npos) << e;

  write_file(dir / "plain.txt.zst", "this was never compressed\n");
  e = error_of({{dir / "plain.txt.zst"}});
  EXPECT_NE(e.find("plain.txt.zst"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid zstd data in the frame at compressed byte 0"), std::string::npos) << e;

  write_file(dir / "empty.jsonl.zst", "");
  e = error_of({{dir / "empty.jsonl.zst"}});
  EXPECT_NE(e.find("empty.jsonl.zst"), std::string::npos) << e;
  EXPECT_NE(e.find("is empty: a zstd file holds at least one frame"), std::string::npos) << e;
}

TEST(Dataset, SeeksInsideACompressedShard) {
  auto dir = temp_dir("dataset_gzip_seek");
  write_file(dir / "a.jsonl.gz", gzip_bytes(corpus_lines(6000)));
  DocumentStream s({{dir / "a.jsonl.gz"}});
  std::vector<DocPosition> positions;
  auto want = read_all(s, &positions);
  ASSERT_EQ(want.size(), 6000u);
  expect_seeks_back(s, positions, want, {0, 1, 3001, 5999});
}

TEST(Dataset, GlobsAndFoldersOfShards) {
  auto dir = temp_dir("dataset_glob");
  std::vector<std::string> want;
  for (int shard = 0; shard < 4; ++shard) {
    std::string lines;
    for (int i = 0; i < 5; ++i) {
      want.push_back("shard " + std::to_string(shard) + " doc " + std::to_string(i));
      lines += json{{"text", want.back()}}.dump() + "\n";
    }
    write_file(dir / ("part-0000" + std::to_string(shard) + ".jsonl.gz"), gzip_bytes(lines));
  }
  write_file(dir / "README.md.txt.bak", "not data");
  EXPECT_EQ(read_all({{dir / "part-*.jsonl.gz"}}), want);  // a glob, in sorted order
  EXPECT_EQ(read_all({{dir / "part-0000[13].jsonl.gz"}}),
            std::vector<std::string>({want[5], want[6], want[7], want[8], want[9], want[15], want[16], want[17],
                                      want[18], want[19]}));
  EXPECT_EQ(read_all({{dir}}), want);  // a folder: .gz shards found, other names skipped
  // allenai/c4's layout, which torchtitan's c4 dataset_path points at: JSON Lines in .json.gz
  // shards, train and validation side by side; a glob picks the training shards.
  std::vector<std::string> c4;
  for (const char* split : {"train", "validation"})
    for (int shard = 0; shard < 2; ++shard) {
      std::string lines;
      for (int i = 0; i < 3; ++i) {
        json doc = {{"text", std::string(split) + " " + std::to_string(shard) + "." + std::to_string(i)},
                    {"timestamp", "2019-04-25T12:57:54Z"}, {"url", "https://example.org/" + std::to_string(i)}};
        if (std::string(split) == "train") c4.push_back(doc["text"]);
        lines += doc.dump() + "\n";
      }
      write_file(dir / "c4" / "en" / ("c4-" + std::string(split) + ".0000" + std::to_string(shard) + "-of-00002.json.gz"),
                 gzip_bytes(lines));
    }
  EXPECT_EQ(read_all({{dir / "c4" / "en" / "c4-train.*.json.gz"}}), c4);

  std::string e = error_of({{dir / "shard-*.jsonl.gz"}});
  EXPECT_NE(e.find("shard-*.jsonl.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("matches no file"), std::string::npos) << e;
}

// Zero bytes after a gzip member (tape blocks, preallocated files) are padding, skipped as GNU gzip
// and Python's gzip skip them: at the end of the file, between members, and over more than one
// 256 KiB compressed chunk; a position in the member after them resumes exactly. Anything else
// after a member must be one.
TEST(Dataset, GzipZeroPaddingAfterAMemberIsSkipped) {
  auto dir = temp_dir("dataset_gzip_padding");
  const std::string lines = corpus_lines(2000);
  const size_t half = lines.find('\n', lines.size() / 2) + 1;
  write_file(dir / "plain.jsonl", lines);
  const std::vector<std::string> want = read_all({{dir / "plain.jsonl"}});
  write_file(dir / "end.jsonl.gz", gzip_bytes(lines) + std::string(1000, '\0'));
  EXPECT_EQ(read_all({{dir / "end.jsonl.gz"}}), want);
  write_file(dir / "between.jsonl.gz", gzip_bytes(lines.substr(0, half)) + std::string(300000, '\0') +
                                           gzip_bytes(lines.substr(half)) + std::string(7, '\0'));
  DocumentStream s({{dir / "between.jsonl.gz"}});
  std::vector<DocPosition> positions;
  ASSERT_EQ(read_all(s, &positions), want);
  expect_seeks_back(s, positions, want, {0, 1500, 1999});

  write_file(dir / "garbage.jsonl.gz", gzip_bytes(lines) + std::string(10, '\0') + "garbage");
  const std::string e = error_of({{dir / "garbage.jsonl.gz"}});
  EXPECT_NE(e.find("garbage.jsonl.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("is not valid gzip data at compressed byte "), std::string::npos) << e;
  EXPECT_NE(e.find(": incorrect header check"), std::string::npos) << e;
}

TEST(Dataset, CorruptedAndTruncatedGzipNameTheFile) {
  auto dir = temp_dir("dataset_gzip_bad");
  std::string gz = gzip_bytes(corpus_lines(2000));
  write_file(dir / "truncated.jsonl.gz", gz.substr(0, gz.size() / 2));
  std::string e = error_of({{dir / "truncated.jsonl.gz"}});
  EXPECT_NE(e.find("truncated.jsonl.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("is truncated"), std::string::npos) << e;

  std::string corrupted = gz;
  for (size_t i = 1000; i < 1064; ++i) corrupted[i] = char(corrupted[i] ^ 0x5a);
  write_file(dir / "corrupted.jsonl.gz", corrupted);
  e = error_of({{dir / "corrupted.jsonl.gz"}});
  EXPECT_NE(e.find("corrupted.jsonl.gz"), std::string::npos) << e;
  EXPECT_TRUE(e.find("not valid gzip data") != std::string::npos || e.find("malformed JSON") != std::string::npos ||
              e.find("UTF-8") != std::string::npos)
      << e;

  write_file(dir / "plain.txt.gz", "this was never compressed\n");
  e = error_of({{dir / "plain.txt.gz"}});
  EXPECT_NE(e.find("plain.txt.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid gzip data at compressed byte"), std::string::npos) << e;
}

// CSV and TSV: a header naming the columns, the text column's field per record; quoted fields
// holding delimiters, newlines and doubled quotes; CRLF; blank lines and empty texts skipped; a
// byte-order mark; compressed; positions that resume at a record (its first line).
TEST(Dataset, CsvAndTsvRecordsReadTheirTextColumn) {
  auto dir = temp_dir("dataset_csv");
  const std::string csv =
      "\xEF\xBB\xBFid,text,label\r\n"
      "1,plain words,a\r\n"
      "2,\"with, a comma\",b\r\n"
      "\r\n"
      "3,\"two\r\nlines and \"\"quotes\"\"\",c\r\n"
      "4,,d\r\n"
      "5,\"\",e\r\n"
      "6,last,f";
  write_file(dir / "a.csv", csv);
  const std::vector<std::string> texts = {"plain words", "with, a comma", "two\r\nlines and \"quotes\"",
                                          "last"};
  DocumentStream s({{dir / "a.csv"}});
  std::vector<DocPosition> positions;
  EXPECT_EQ(read_all(s, &positions), texts);
  EXPECT_EQ(s.stats().empty_skipped, 2u);
  EXPECT_EQ(positions[2].line, 5u);  // the record's first line
  EXPECT_EQ(positions[3].line, 9u);
  expect_seeks_back(s, positions, texts, {0, 2, 3, 1});
  EXPECT_EQ(read_all({{dir / "a.csv"}, "label"}), (std::vector<std::string>{"a", "b", "c", "d", "e", "f"}));
  write_file(dir / "a.tsv", "text\tid\nfirst, with a comma\t1\n\"quoted\ttab\"\t2\n");
  EXPECT_EQ(read_all({{dir / "a.tsv"}}), (std::vector<std::string>{"first, with a comma", "quoted\ttab"}));
  write_file(dir / "z" / "a.csv.gz", gzip_bytes(csv));
  write_file(dir / "z" / "b.csv.zst", zstd_bytes(csv));
  auto twice = texts;
  twice.insert(twice.end(), texts.begin(), texts.end());
  EXPECT_EQ(read_all({{dir / "z"}}), twice);
  // As Python's csv module reads them: characters after a closing quote join the field; a lone CR
  // ends a record (old Mac files); a line of spaces is blank; a header opening with a character whose
  // first byte is a byte-order mark's (U+FF08, EF BC 88) keeps it.
  write_file(dir / "python.csv", "id,text\r1,\"quoted\"after\r   \r2,\"Hi,\" she said.\r\n3,\"x\" \n");
  EXPECT_EQ(read_all({{dir / "python.csv"}}),
            (std::vector<std::string>{"quotedafter", "Hi, she said.", "x "}))
      << "records ending in CR, CRLF and LF";
  write_file(dir / "wide.csv", "\xEF\xBC\x88t\xEF\xBC\x89,id\nfull-width,1\n");
  EXPECT_EQ(read_all({{dir / "wide.csv"}, "\xEF\xBC\x88t\xEF\xBC\x89"}),
            std::vector<std::string>{"full-width"});

  auto expect_error = [&](const std::string& name, const std::string& bytes, const std::string& part,
                          const std::string& field = "text") {
    write_file(dir / "bad" / name, bytes);
    const std::string e = error_of({{dir / "bad" / name}, field});
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect_error(
      "cols.csv", "id,body\n1,x\n",
      "cols.csv: its header has no column 'text' (training.text_field names the column to read; its columns "
      "are 'id', 'body')");
  expect_error("width.csv", "id,text\n1,fine\n2,a, b\n",
               "width.csv:3: the record has 3 fields, the header 2");
  // Lines end at a lone CR too (as an editor numbers them), and at CRLF once.
  expect_error("width_cr.csv", "id,text\r1,fine\r2,a, b\r", "width_cr.csv:3: the record has 3 fields");
  expect_error("width_crlf.csv", "id,text\r\n1,\"two\rlines\"\r\n2,a, b\r\n",
               "width_crlf.csv:4: the record has 3 fields");
  expect_error("open.csv", "id,text\n1,\"never\nclosed\n",
               "open.csv:2: the quoted field opened at column 3 is never closed");
  expect_error("empty.csv", "\n\n", "empty.csv has no header row");
  // A quote never closed would read the rest of a large file into one field: it stops at 64 MiB.
  expect_error(
      "runaway.csv", "id,text\n1,\"" + std::string((size_t(64) << 20) + 16, 'a'),
      "runaway.csv:2: the field starting at column 3 runs past 64 MiB (a quote never closed, or not CSV)");
  DatasetConfig chats{{dir / "a.csv"}};
  chats.chat_field = "messages";
  EXPECT_NE(error_of(chats).find("a.csv is CSV, but conversations"), std::string::npos) << error_of(chats);
}

// CSV and TSV written by Python's csv module (its default dialect: minimal quoting, CRLF) from the
// bundled corpus read back as the corpus's documents.
TEST(Dataset, CsvWrittenByPythonReadsAsTheCorpus) {
  auto dir = temp_dir("dataset_csv_python");
  const size_t n = 3000;
  write_file(dir / "corpus.jsonl",
             corpus_lines(n) + "{\"text\": \"a, \\\"quoted\\\" one\\nwith a newline\\tand a tab\"}\n");
  const std::string script =
      "import csv, json, sys\n"
      "rows = [json.loads(l)['text'] for l in open(sys.argv[1], encoding='utf-8')]\n"
      "for path, delimiter in ((sys.argv[2], ','), (sys.argv[3], '\\t')):\n"
      "    with open(path, 'w', newline='', encoding='utf-8') as f:\n"
      "        w = csv.writer(f, delimiter=delimiter)\n"
      "        w.writerow(['id', 'text', 'source'])\n"
      "        for i, t in enumerate(rows): w.writerow([i, t, 'corpus'])\n";
  write_file(dir / "write.py", script);
  std::string out;
  ASSERT_EQ(run_command("python3 " + (dir / "write.py").string() + " " + (dir / "corpus.jsonl").string() +
                            " " + (dir / "corpus.csv").string() + " " + (dir / "corpus.tsv").string(),
                        &out),
            0)
      << out;
  const auto expected = read_all({{dir / "corpus.jsonl"}});
  ASSERT_EQ(expected.size(), n + 1);
  EXPECT_EQ(read_all({{dir / "corpus.csv"}}), expected);
  EXPECT_EQ(read_all({{dir / "corpus.tsv"}}), expected);
  EXPECT_EQ(expected.back(), "a, \"quoted\" one\nwith a newline\tand a tab");
}

}  // namespace

// A checkpoint's data position holds in a dataset that only grew: files added after its files, lines
// appended to a line-record file whose old part ends a line. Any other change is a mismatch naming
// the file and the rule.
TEST(DatasetIdentity, ADatasetThatOnlyGrewKeepsItsPositionAndAnyOtherChangeIsNamed) {
  const fs::path dir = temp_dir("dataset_identity_growth");
  auto write = [](const fs::path& p, const std::string& text, std::ios::openmode mode = std::ios::trunc) {
    std::ofstream(p, std::ios::binary | std::ios::out | mode) << text;
  };
  write(dir / "b.jsonl", "\"one\"\n\"two\"\n");
  write(dir / "b.txt", "one\n\ntwo\n");
  write(dir / "c.jsonl", "\"one\"\n\"two\"");  // its last line has no end yet
  const json saved = dataset_identity({dir / "b.jsonl"});
  EXPECT_EQ(compare_dataset_identity(saved, dataset_identity({dir / "b.jsonl"})).mismatch, "");
  EXPECT_EQ(compare_dataset_identity(saved, dataset_identity({dir / "b.jsonl"})).growth, "");

  write(dir / "b.jsonl", "\"three\"\n", std::ios::app);
  DatasetComparison grown =
      compare_dataset_identity(saved, dataset_identity({dir / "b.jsonl", dir / "c.jsonl"}));
  EXPECT_EQ(grown.mismatch, "");
  EXPECT_EQ(grown.growth, "'" + (dir / "b.jsonl").string() +
                              "' from 12 to 20 bytes (lines appended); 1 new file after "
                              "the checkpoint's 1: '" +
                              (dir / "c.jsonl").string() + "'");
  ASSERT_EQ(grown.grown_files.size(), 1u);
  EXPECT_EQ(grown.grown_files[0].index, 0u);
  EXPECT_EQ(grown.grown_files[0].old_bytes, 12u);
  // A file added before the checkpoint's moves them: refused, naming the rule.
  write(dir / "a.jsonl", "\"zero\"\n");
  const std::string before =
      compare_dataset_identity(saved, dataset_identity({dir / "a.jsonl", dir / "b.jsonl"})).mismatch;
  EXPECT_EQ(before,
            "file 0 (checkpoint: '" + (dir / "b.jsonl").string() + "', now: '" + (dir / "a.jsonl").string() +
                "'): another file in its place; the checkpoint's dataset has 1 file, this run's has 2; "
                "new: '" +
                (dir / "a.jsonl").string() +
                "': files added to a dataset resume only when they sort after all of the checkpoint's");
  // A file gone, at the end or among the others: named, with the counts.
  const json three = dataset_identity({dir / "a.jsonl", dir / "b.jsonl", dir / "c.jsonl"});
  EXPECT_EQ(
      compare_dataset_identity(three, dataset_identity({dir / "a.jsonl", dir / "b.jsonl"})).mismatch,
      "the checkpoint's dataset has 3 files, this run's has 2; gone: '" + (dir / "c.jsonl").string() + "'");
  const std::string among =
      compare_dataset_identity(three, dataset_identity({dir / "a.jsonl", dir / "c.jsonl"})).mismatch;
  EXPECT_NE(among.find(
                "another file in its place; the checkpoint's dataset has 3 files, this run's has 2; gone: '" +
                (dir / "b.jsonl").string() + "'"),
            std::string::npos)
      << among;
  EXPECT_EQ(among.find("files added"), std::string::npos) << among;

  // Lines that continue an unended one, and plain text (a paragraph may go on): not growth, each with
  // its reason.
  for (const auto& [f, why] :
       {std::pair{dir / "c.jsonl",
                  std::string("but its old part ends inside a line (byte 11 is no newline)")},
        std::pair{dir / "b.txt",
                  std::string("but only a .jsonl, .ndjson, .csv or .tsv file may grow, by lines "
                              "appended; compressed, Parquet, Arrow and plain-text files may not")}}) {
    const json was = dataset_identity({f});
    write(f, "\"more\"\n", std::ios::app);
    const std::string e = compare_dataset_identity(was, dataset_identity({f})).mismatch;
    EXPECT_NE(e.find("bytes now, its first " + std::to_string(was[0].at("bytes").get<uint64_t>()) +
                     " bytes unchanged, " + why),
              std::string::npos)
        << e;
  }
  // Bytes changed before the old size, a file cut short, the same size with other content.
  const json was = dataset_identity({dir / "b.jsonl"});
  write(dir / "b.jsonl", "\"zero\"\n\"one\"\n\"two\"\n\"three\"\n");
  EXPECT_NE(
      compare_dataset_identity(was, dataset_identity({dir / "b.jsonl"}))
          .mismatch.find("size 20 bytes in the checkpoint, 27 bytes now (its first 20 bytes changed too)"),
      std::string::npos);
  write(dir / "b.jsonl", "\"one\"\n");
  EXPECT_NE(compare_dataset_identity(was, dataset_identity({dir / "b.jsonl"}))
                .mismatch.find("size 20 bytes in the checkpoint, 6 bytes now (cut short)"),
            std::string::npos);
  write(dir / "b.jsonl", "\"one\"\n\"two\"\n\"thrEE\"\n");
  EXPECT_NE(compare_dataset_identity(was, dataset_identity({dir / "b.jsonl"}))
                .mismatch.find("(same size, different content)"),
            std::string::npos);
}
