// Table files from the real corpus: Parquet written by arrow-rs (parquet-wasm) in every codec, value
// encoding and page version titan reads, and Arrow IPC written by Apache Arrow's JavaScript
// implementation (both run with node: tests/data/write_table.js); read back row by row, sought
// into, sharded, refused where they break a rule, and trained on.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../train/train_test_util.h"
#include "data_test_util.h"
#include "titan/core/check.h"
#include "titan/data/arrow_ipc.h"
#include "titan/data/dataset.h"
#include "titan/data/parquet.h"
#include "titan/data/table_file.h"

namespace {
using namespace titan::testing;
using namespace titan::data;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // columns are written in the order given

// Writes the files `spec` lists (write_table.js's format) with arrow-rs's or Apache Arrow's writer.
void write_tables(const fs::path& dir, const json& spec) {
  const fs::path spec_file = dir / "spec.json";
  write_file(spec_file, spec.dump());
  const fs::path modules = assets_dir() / "packages" / "parquet-writer" / "node_modules";
  ASSERT_TRUE(fs::exists(modules / "parquet-wasm")) << modules << " is missing: run scripts/setup.sh";
  const std::string cmd = "node " + (source_dir() / "tests" / "data" / "write_table.js").string() + " " +
                          modules.string() + " " + spec_file.string();
  std::string out;
  ASSERT_EQ(run_command(cmd, &out), 0) << cmd << "\n" << out;
}

// The first `n` documents of the bundled corpus (real English text, some of it non-ASCII).
std::vector<std::string> corpus(size_t n) {
  std::ifstream f(assets_dir() / "datasets" / "nlp-corpus" / "train.jsonl");
  std::vector<std::string> docs;
  std::string line;
  while (docs.size() < n && std::getline(f, line))
    docs.push_back(json::parse(line).at("text").get<std::string>());
  EXPECT_EQ(docs.size(), n) << "the corpus is missing: run scripts/setup.sh";
  return docs;
}

// A text column that exercises the reader: corpus documents, repeats (dictionary hits), a document
// larger than a page, an empty one, and nulls (std::nullopt) every 17th row when `nulls`.
std::vector<std::optional<std::string>> text_column(size_t n, bool nulls) {
  const std::vector<std::string> docs = corpus(n);
  std::vector<std::optional<std::string>> rows;
  std::string long_doc;
  for (size_t i = 0; i < 400; ++i) long_doc += docs[i % docs.size()] + " ";
  for (size_t i = 0; i < n; ++i) {
    if (nulls && i % 17 == 5)
      rows.emplace_back(std::nullopt);
    else if (i % 9 == 2)
      rows.emplace_back(docs[i % 40]);  // repeats
    else if (i == n / 2)
      rows.emplace_back(long_doc);
    else if (i == n / 3)
      rows.emplace_back("");
    else
      rows.emplace_back(docs[i]);
  }
  return rows;
}

// The JSON Lines file of the same texts (none null).
void write_texts_jsonl(const fs::path& path, const std::vector<std::optional<std::string>>& text) {
  std::ofstream jsonl(path);
  for (auto& t : text) jsonl << json{{"text", *t}}.dump() << "\n";
}

json column_json(const std::vector<std::optional<std::string>>& rows) {
  json values = json::array();
  for (auto& r : rows) values.push_back(r ? json(*r) : json(nullptr));
  return {{"type", "utf8"}, {"values", values}};
}

// An int64 column before the text and a string column after it, so the text is neither the first
// leaf nor the last, and a list column.
json table_json(const std::vector<std::optional<std::string>>& text) {
  json ids = json::array(), other = json::array(), tags = json::array();
  for (size_t i = 0; i < text.size(); ++i) {
    ids.push_back(int64_t(i) * 3);
    other.push_back("row " + std::to_string(i));
    tags.push_back(i % 4 ? json::array({"a", "b"}) : json::array());
  }
  return {{"id", {{"type", "int64"}, {"values", ids}}},
          {"text", column_json(text)},
          {"tags", {{"type", {{"list", "utf8"}}}, {"values", tags}}},
          {"other", {{"type", "utf8"}, {"values", other}}}};
}

std::vector<std::optional<std::string>> read_column(ColumnReader& c) {
  std::vector<std::optional<std::string>> rows;
  std::string value;
  bool null = false;
  while (c.next(value, null)) rows.emplace_back(null ? std::nullopt : std::optional<std::string>(value));
  return rows;
}

const char* kCodecs[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD", "BROTLI", "LZ4_RAW"};

// The parts of a matrix file's name, CODEC_vVERSION_ENCODING.parquet.
std::string codec_of(const std::string& name) {
  return name.substr(0, name.find("_v"));
}
std::string version_of(const std::string& name) {
  return name.substr(name.find("_v") + 2, 1);
}
std::string encoding_of(const std::string& name) {
  const size_t start = name.find("_v") + 4;
  return name.substr(start, name.size() - start - std::string(".parquet").size());
}

// Every codec x page version x value encoding: each row reads back as written, nulls as nulls, over
// pages of 8 KiB and row groups of 700 rows.
TEST(Parquet, ArrowRsFilesOfEveryCodecEncodingAndPageVersionReadAsWritten) {
  const fs::path dir = temp_dir("parquet_matrix");
  const auto text = text_column(2000, true);
  const json table = table_json(text);
  json spec = json::array();
  std::vector<std::string> names;
  for (const char* codec : kCodecs)
    for (const char* version : {"1", "2"})
      for (const char* encoding : {"dictionary", "PLAIN", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"}) {
        const std::string name = std::string(codec) + "_v" + version + "_" + encoding + ".parquet";
        json file = {{"out", (dir / name).string()}, {"columns", table},   {"compression", codec},
                     {"version", version},           {"page_bytes", 8192}, {"row_group_rows", 700}};
        if (std::string(encoding) == "dictionary") {
          // Dictionary indices take a byte or two a row: small pages make several per row group, and
          // a small dictionary overflows in each row group, whose later pages fall back to PLAIN.
          file["dictionary"] = true;
          file["page_bytes"] = 256;
          file["dictionary_page_bytes"] = 16384;
        } else {
          file["dictionary"] = false;
          file["encoding"] = encoding;
        }
        spec.push_back(file);
        names.push_back(name);
      }
  write_tables(dir, spec);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ParquetColumn c(dir / name, "text");
    EXPECT_EQ(c.rows(), text.size());
    const auto rows = read_column(c);
    ASSERT_EQ(rows.size(), text.size());
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], text[i]) << "row " << i;
    // The file is what its name says: the writer honoured the options, over several pages per row group.
    const ParquetColumn::Layout& layout = c.layout();
    EXPECT_EQ(layout.codecs, std::set<std::string>{codec_of(name)});
    EXPECT_EQ(layout.row_groups, 3u);
    EXPECT_GT(version_of(name) == "1" ? layout.v1_pages : layout.v2_pages, 3 * layout.row_groups);
    EXPECT_EQ(version_of(name) == "1" ? layout.v2_pages : layout.v1_pages, 0u);
    const std::string encoding = encoding_of(name);
    if (encoding == "dictionary") {
      // arrow-rs spells dictionary indices RLE_DICTIONARY in v1 pages too (older writers' v1 pages
      // say PLAIN_DICTIONARY, the same bytes, read by the same code); past the dictionary's limit it
      // falls back to PLAIN in v1 files and DELTA_BYTE_ARRAY in v2 files.
      EXPECT_EQ(layout.dictionary_pages, layout.row_groups);
      EXPECT_EQ(
          layout.encodings,
          (std::set<std::string>{"RLE_DICTIONARY", version_of(name) == "1" ? "PLAIN" : "DELTA_BYTE_ARRAY"}));
    } else {
      EXPECT_EQ(layout.dictionary_pages, 0u);
      EXPECT_EQ(layout.encodings, std::set<std::string>{encoding});
    }
    ParquetColumn other(dir / name, "other");
    std::string value;
    bool null = true;
    other.seek(1234);
    ASSERT_TRUE(other.next(value, null));
    EXPECT_FALSE(null);
    EXPECT_EQ(value, "row 1234");
  }
}

// seek(row) lands on that row wherever it lies (first, inside and last pages of each row group, the
// end), forwards and backwards, and reading goes on from there.
TEST(Parquet, SeekLandsOnEveryRowAcrossPagesAndRowGroups) {
  const fs::path dir = temp_dir("parquet_seek");
  const auto text = text_column(1500, true);
  write_tables(dir, json::array({{{"out", (dir / "s.parquet").string()},
                                  {"columns", table_json(text)},
                                  {"compression", "SNAPPY"},
                                  {"version", "2"},
                                  {"dictionary", false},
                                  {"page_bytes", 4096},
                                  {"row_group_rows", 333}}}));
  ParquetColumn c(dir / "s.parquet", "text");
  ASSERT_EQ(read_column(c), text);
  EXPECT_EQ(c.layout().row_groups, 5u);
  EXPECT_GE(c.layout().v2_pages, 20u);  // seeks land in the middle of row groups' pages
  std::string value;
  bool null = false;
  for (uint64_t row : {uint64_t(1499), uint64_t(0), uint64_t(332), uint64_t(333), uint64_t(334),
                       uint64_t(700), uint64_t(5), uint64_t(999), uint64_t(1000)}) {
    c.seek(row);
    EXPECT_EQ(c.row(), row);
    for (uint64_t r = row; r < std::min<uint64_t>(row + 40, text.size()); ++r) {
      ASSERT_TRUE(c.next(value, null)) << "row " << r;
      ASSERT_EQ(null ? std::nullopt : std::optional<std::string>(value), text[r])
          << "row " << r << " after seek " << row;
    }
  }
  for (uint64_t row = 0; row < text.size(); row += 37) {
    c.seek(row);
    ASSERT_TRUE(c.next(value, null));
    ASSERT_EQ(null ? std::nullopt : std::optional<std::string>(value), text[row]) << "row " << row;
  }
  c.seek(text.size());
  EXPECT_FALSE(c.next(value, null));
  EXPECT_NE(error_of([&] { c.seek(text.size() + 1); }).find("row 1501 is past its 1500 rows"),
            std::string::npos);
}

// A dataset of Parquet files reads the same documents as the JSON Lines file of the same texts (an
// empty text skipped in both); positions count rows and resume exactly through JSON, as a checkpoint
// stores them; shards partition the rows; a folder mixes Parquet and JSON Lines files, sorted.
TEST(Parquet, DocumentsAreTheJsonLinesOfTheSameTexts) {
  const fs::path dir = temp_dir("parquet_documents");
  const auto text = text_column(1200, false);
  write_tables(dir, json::array({{{"out", (dir / "data" / "a.parquet").string()},
                                  {"columns", table_json(text)},
                                  {"compression", "ZSTD"},
                                  {"version", "1"},
                                  {"page_bytes", 4096},
                                  {"row_group_rows", 500}}}));
  write_texts_jsonl(dir / "a.jsonl", text);
  DocumentStream from_jsonl({{dir / "a.jsonl"}});
  std::vector<DocPosition> positions;
  DocumentStream from_parquet({{dir / "data" / "a.parquet"}});
  const auto docs = read_texts(from_parquet, &positions);
  EXPECT_EQ(docs, read_texts(from_jsonl));
  EXPECT_EQ(docs.size(), text.size() - 1);  // the empty one
  EXPECT_EQ(from_parquet.stats().empty_skipped, 1u);
  EXPECT_EQ(positions[7].offset, 7u);  // the row
  EXPECT_EQ(positions[7].line, 8u);
  for (size_t i : {size_t(0), size_t(499), size_t(500), size_t(1001), docs.size() - 1}) {
    from_parquet.seek(nlohmann::json(positions[i]).get<DocPosition>());
    Document d;
    ASSERT_TRUE(from_parquet.next(d)) << "document " << i;
    EXPECT_EQ(d.text, docs[i]);
    EXPECT_EQ(d.position, positions[i]);
  }
  // The stream's own position after a document resumes at the next one.
  DocumentStream partway({{dir / "data" / "a.parquet"}});
  Document d;
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(partway.next(d));
  DocumentStream resumed({{dir / "data" / "a.parquet"}});
  resumed.seek(nlohmann::json(partway.position()).get<DocPosition>());
  EXPECT_EQ(read_texts(resumed), std::vector<std::string>(docs.begin() + 600, docs.end()));

  fs::copy_file(dir / "a.jsonl", dir / "data" / "b.jsonl");
  DocumentStream folder({{dir / "data"}});
  auto both = docs;
  both.insert(both.end(), docs.begin(), docs.end());
  EXPECT_EQ(read_texts(folder), both);
  EXPECT_EQ(folder.files(), (std::vector<fs::path>{dir / "data" / "a.parquet", dir / "data" / "b.jsonl"}));
  // training.text_field names the column.
  DocumentStream other({{dir / "data" / "a.parquet"}, "other"});
  EXPECT_EQ(read_texts(other).at(3), "row 3");
}

std::string dataset_error(const fs::path& file, const std::string& field = "text",
                          const std::string& chat = "") {
  return error_of([&] {
    DatasetConfig config{{file}, field};
    config.chat_field = chat;
    DocumentStream s(config);
    Document d;
    while (s.next(d)) {
    }
  });
}

// What titan cannot read is an error naming the file and the rule, said when the dataset is opened
// (before any compute) where the footer shows it, and at the row where a value shows it.
TEST(Parquet, FilesTitanCannotReadNameTheFileAndTheRule) {
  const fs::path dir = temp_dir("parquet_errors");
  auto text = text_column(300, false);
  write_tables(dir, json::array({{{"out", (dir / "ok.parquet").string()},
                                  {"columns", table_json(text)},
                                  {"compression", "SNAPPY"},
                                  {"page_bytes", 2048}},
                                 {{"out", (dir / "nulls.parquet").string()},
                                  {"columns", table_json(text_column(300, true))},
                                  {"compression", "SNAPPY"}},
                                 {{"out", (dir / "only_text.parquet").string()},
                                  {"columns", {{"text", column_json(text)}}},
                                  {"compression", "SNAPPY"}}}));
  const fs::path ok = dir / "ok.parquet";
  auto expect = [](const std::string& e, const std::string& part) {
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect(
      dataset_error(ok, "body"),
      "ok.parquet: has no column 'body' (training.text_field names the column to read; its columns are 'id', "
      "'text', 'tags', 'other')");
  expect(dataset_error(ok, "id"), "ok.parquet: column 'id' holds INT64 values, not strings");
  expect(dataset_error(ok, "tags"), "ok.parquet: column 'tags' is a nested group (a list, map or struct)");
  expect(dataset_error(ok, "text", "messages"),
         "ok.parquet: has no column 'messages' (training.chat_field names the messages; its columns are");
  // A column of numbers is read as JSON, which a conversation is not.
  expect(dataset_error(ok, "text", "id"), "ok.parquet:1: field 'id': ");
  expect(dataset_error(ok, "text", "id"), "messages: expected an array of messages, got number");
  expect(dataset_error(dir / "nulls.parquet"),
         "nulls.parquet:6: row 6's column 'text' is null, not a string");

  const std::string bytes = read_file(ok);
  write_file(dir / "cut.parquet", bytes.substr(0, bytes.size() - 100));
  expect(dataset_error(dir / "cut.parquet"),
         "cut.parquet: is not a Parquet file: it does not end with the magic bytes PAR1");
  std::string lying = bytes;
  lying[lying.size() - 5] = '\x7f';  // the footer's length: 2 GiB
  write_file(dir / "lying.parquet", lying);
  expect(dataset_error(dir / "lying.parquet"), "lying.parquet: its footer claims");
  write_file(dir / "text.parquet", "{\"text\": \"a JSON line named .parquet\"}\n");
  expect(dataset_error(dir / "text.parquet"), "text.parquet: is not a Parquet file: it does not start with");
  write_file(dir / "short.parquet", "PAR1");
  expect(dataset_error(dir / "short.parquet"), "short.parquet: is 4 bytes, too short to be Parquet");
  write_file(dir / "packed.parquet.gz", bytes);
  expect(dataset_error(dir / "packed.parquet.gz"),
         "packed.parquet.gz: a compressed Parquet file is not read (it is read by its offsets; Parquet "
         "compresses "
         "its pages itself): decompress it to packed.parquet");
  // A page's bytes damaged: the text column's first page header (after the 4-byte magic) is overwritten.
  std::string damaged = read_file(dir / "only_text.parquet");
  for (size_t i = 4; i < 40; ++i) damaged[i] = char(0xff);
  write_file(dir / "damaged.parquet", damaged);
  expect(dataset_error(dir / "damaged.parquet"),
         "damaged.parquet: column 'text', row group 0, page at byte ");
  expect(dataset_error(dir / "damaged.parquet"), "(the file is corrupt or truncated)");
}

// Conversations as Hugging Face chat datasets store them: a list of message structs per row (every
// message with every field of the struct, null where it has none), tool calls nested in them, and a
// tools column of signatures (null for a row without tools).
json conversations(size_t n) {
  const std::vector<std::string> docs = corpus(3 * n + 4);
  json rows = json::array(), tools = json::array();
  // Fields the template does not read ride along, as in real datasets: a number, a float, a boolean,
  // and a field null in every row (written as Arrow's Null type; Parquet's INT32 of logical type UNKNOWN).
  size_t k = 0;
  auto message = [&](const std::string& role, const std::string& content) {
    ++k;
    return json{{"role", role},
                {"content", content},
                {"reasoning_content", nullptr},
                {"tool_calls", nullptr},
                {"weight", k % 4 == 0 ? json(nullptr) : json(int64_t(k % 3) - 1)},
                {"score", double(k % 8) / 4},
                {"flagged", k % 5 == 1},
                {"extra", nullptr}};
  };
  for (size_t i = 0; i < n; ++i) {
    json messages = json::array();
    if (i % 3 == 0) messages.push_back(message("system", "You are terse."));
    messages.push_back(message("user", docs[3 * i]));
    json answer = message("assistant", docs[3 * i + 1]);
    if (i % 4 == 1) answer["reasoning_content"] = "Think: " + docs[3 * i + 2];
    if (i % 5 == 2) {  // a tool call, its result and the answer after it
      json call = message("assistant", "");
      call["tool_calls"] = json::array(
          {{{"type", "function"},
            {"function", {{"name", "lookup"}, {"arguments", "{\"q\": \"" + std::to_string(i) + "\"}"}}}}});
      messages.push_back(call);
      messages.push_back(message("tool", "result " + std::to_string(i)));
    }
    if (i % 7 == 3) answer["tool_calls"] = json::array();  // an empty list, not null
    messages.push_back(answer);
    if (i % 6 == 4) {  // a second turn
      messages.push_back(message("user", "And then?"));
      messages.push_back(message("assistant", docs[3 * i + 3]));
    }
    rows.push_back(messages);
    tools.push_back(i % 5 == 2
                        ? json::array({{{"type", "function"},
                                        {"function", {{"name", "lookup"}, {"description", "Looks it up."}}}}})
                        : json(nullptr));
  }
  return {{"messages", rows}, {"tools", tools}};
}

// The id, messages and tools columns of `chats` (conversations()), with their Arrow types. The field
// null in every row is of `null_type`: Arrow's Null where the writer can ("null"; pyarrow writes it
// to Parquet as INT32 of logical type UNKNOWN); parquet-wasm refuses the Null arrays apache-arrow
// makes, so its files have an all-null int64 instead (read by the same code).
json chat_columns(const json& chats, const std::string& null_type) {
  const json call_type = {
      {"struct", {{"type", "utf8"}, {"function", {{"struct", {{"name", "utf8"}, {"arguments", "utf8"}}}}}}}};
  const json message_type = {{"struct",
                              {{"role", "utf8"},
                               {"content", "utf8"},
                               {"reasoning_content", "utf8"},
                               {"tool_calls", {{"list", call_type}}},
                               {"weight", "int64"},
                               {"score", "float64"},
                               {"flagged", "bool"},
                               {"extra", null_type}}}};
  const json tool_type = {
      {"struct",
       {{"type", "utf8"}, {"function", {{"struct", {{"name", "utf8"}, {"description", "utf8"}}}}}}}};
  json ids = json::array();
  for (size_t i = 0; i < chats["messages"].size(); ++i) ids.push_back(int64_t(i));
  return {{"id", {{"type", "int64"}, {"values", ids}}},
          {"messages", {{"type", {{"list", message_type}}}, {"values", chats["messages"]}}},
          {"tools", {{"type", {{"list", tool_type}}}, {"values", chats["tools"]}}}};
}

// The JSON Lines file of the same records (a row without tools has no "tools" field).
fs::path write_chat_jsonl(const fs::path& dir, const json& chats) {
  const fs::path path = dir / "chats.jsonl";
  std::ofstream jsonl(path);
  for (size_t i = 0; i < chats["messages"].size(); ++i) {
    json record = {{"messages", chats["messages"][i]}};
    if (!chats["tools"][i].is_null()) record["tools"] = chats["tools"][i];
    jsonl << record.dump() << "\n";
  }
  return path;
}

using Pieces = std::vector<std::pair<std::string, bool>>;

DatasetConfig chat_config(const fs::path& file) {
  DatasetConfig config{{file}};
  config.chat_field = "messages";
  return config;
}

// Each conversation's rendered pieces, as the stream gives them.
std::vector<Pieces> read_chats(DocumentStream& s, std::vector<DocPosition>* positions = nullptr) {
  std::vector<Pieces> docs;
  Document d;
  while (s.next(d)) {
    Pieces pieces;
    for (const ChatPiece& p : d.chat) pieces.emplace_back(p.text, p.trained);
    docs.push_back(pieces);
    if (positions) positions->push_back(d.position);
  }
  return docs;
}

// The messages and tools columns read as JSON hold exactly what `chats` wrote, row by row.
void expect_rows_are(ColumnReader& messages, ColumnReader& tools, const json& chats) {
  json row;
  for (size_t i = 0; i < chats["messages"].size(); ++i) {
    ASSERT_TRUE(messages.next_json(row));
    ASSERT_EQ(row, chats["messages"][i]) << "row " << i;
    ASSERT_TRUE(tools.next_json(row));
    ASSERT_EQ(row, chats["tools"][i]) << "row " << i;
  }
  EXPECT_FALSE(messages.next_json(row));
}

std::vector<Pieces> chat_documents(const fs::path& file) {
  DocumentStream s(chat_config(file));
  return read_chats(s);
}

// A Parquet file of conversations reads as the JSON Lines file of the same records: each row's
// messages and tools assemble into the JSON written (nulls, empty lists and nested tool calls
// included), render into the same pieces, resume at a saved position and shard alike, in v1 pages
// (rows spread over pages, sought by decoding) and v2 pages (sought by their headers).
TEST(Parquet, ConversationsReadAsTheJsonLinesOfTheSameRecords) {
  const fs::path dir = temp_dir("parquet_chat");
  const json chats = conversations(160);
  json spec = json::array();
  for (const char* version : {"1", "2"})
    spec.push_back({{"out", (dir / ("chats_v" + std::string(version) + ".parquet")).string()},
                    {"columns", chat_columns(chats, "int64")},
                    {"compression", "ZSTD"},
                    {"version", version},
                    {"dictionary", false},
                    {"page_bytes", 256},
                    {"row_group_rows", 40}});
  write_tables(dir, spec);
  const auto expected = chat_documents(write_chat_jsonl(dir, chats));
  ASSERT_EQ(expected.size(), chats["messages"].size());
  for (const std::string version : {"1", "2"}) {
    SCOPED_TRACE("v" + version);
    const fs::path file = dir / ("chats_v" + version + ".parquet");
    ParquetColumn messages(file, "messages", ParquetColumn::Shape::Json);
    ParquetColumn tools(file, "tools", ParquetColumn::Shape::Json);
    expect_rows_are(messages, tools, chats);
    const auto& layout = messages.layout();
    // layout counts the row groups of each of the 10 leaves: several pages per leaf's chunk.
    EXPECT_EQ(layout.row_groups, 10u * 4u);
    EXPECT_GT(version == "1" ? layout.v1_pages : layout.v2_pages, 2 * layout.row_groups);

    DocumentStream stream(chat_config(file));
    std::vector<DocPosition> positions;
    EXPECT_EQ(read_chats(stream, &positions), expected);
    for (size_t i : {size_t(1), size_t(39), size_t(40), size_t(77), size_t(159)}) {
      DocumentStream resumed(chat_config(file));
      resumed.seek(nlohmann::json(positions[i]).get<DocPosition>());
      ASSERT_EQ(read_chats(resumed), std::vector<Pieces>(expected.begin() + ptrdiff_t(i), expected.end()))
          << "from document " << i;
    }
  }
}

// Thrift's compact protocol, written: enough of it to build the file of the checksum test below.
struct ThriftWriter {
  std::string out;
  std::vector<int> last_id = {0};
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out += char(v | 0x80);
    out += char(v);
  }
  void field(int id, int type) {  // ids ascend, each less than 16 past the one before
    out += char(((id - last_id.back()) << 4) | type);
    last_id.back() = id;
  }
  void i32(int id, int64_t v) {
    field(id, 5);
    varint(uint64_t((v << 1) ^ (v >> 63)));
  }
  void i64(int id, int64_t v) {
    field(id, 6);
    varint(uint64_t((v << 1) ^ (v >> 63)));
  }
  void binary(const std::string& s) {
    varint(s.size());
    out += s;
  }
  void string(int id, const std::string& s) {
    field(id, 8);
    binary(s);
  }
  void begin_struct() { last_id.push_back(0); }
  void begin_struct(int id) {
    field(id, 12);
    begin_struct();
  }
  void end_struct() {
    out += char(0);
    last_id.pop_back();
  }
  void list(int id, int element_type, size_t n) {
    field(id, 9);
    out += char((n << 4) | size_t(element_type));  // n < 15
  }
};

// A one-column file (required strings, one PLAIN v1 page, uncompressed) whose page header carries
// the CRC-32 of the page's bytes, as parquet-mr writes by default since 1.12 (arrow-rs does not).
std::string file_with_page_crc(const std::vector<std::string>& values, uint32_t crc_xor = 0) {
  std::string page;
  for (const std::string& v : values) {
    const uint32_t n = uint32_t(v.size());
    page.append(reinterpret_cast<const char*>(&n), 4);
    page += v;
  }
  ThriftWriter header;
  header.begin_struct();
  header.i32(1, 0);  // DATA_PAGE
  header.i32(2, int64_t(page.size()));
  header.i32(3, int64_t(page.size()));
  header.i32(4, int32_t(uint32_t(crc32(0, reinterpret_cast<const Bytef*>(page.data()), uInt(page.size()))) ^
                        crc_xor));
  header.begin_struct(5);  // DataPageHeader
  header.i32(1, int64_t(values.size()));
  header.i32(2, 0);  // PLAIN
  header.i32(3, 3);  // RLE levels
  header.i32(4, 3);
  header.end_struct();
  header.end_struct();
  const int64_t chunk = int64_t(header.out.size() + page.size());
  ThriftWriter footer;
  footer.begin_struct();
  footer.i32(1, 1);
  footer.list(2, 12, 2);  // schema: the root and its one leaf
  footer.begin_struct();
  footer.string(4, "schema");
  footer.i32(5, 1);
  footer.end_struct();
  footer.begin_struct();
  footer.i32(1, 6);  // BYTE_ARRAY
  footer.i32(3, 0);  // REQUIRED
  footer.string(4, "text");
  footer.i32(6, 0);  // UTF8
  footer.end_struct();
  footer.i64(3, int64_t(values.size()));
  footer.list(4, 12, 1);  // row groups
  footer.begin_struct();
  footer.list(1, 12, 1);  // column chunks
  footer.begin_struct();
  footer.i64(2, 4);
  footer.begin_struct(3);  // ColumnMetaData
  footer.i32(1, 6);
  footer.list(2, 5, 1);
  footer.varint(0);  // PLAIN, as a zigzag i32
  footer.list(3, 8, 1);
  footer.binary("text");
  footer.i32(4, 0);  // UNCOMPRESSED
  footer.i64(5, int64_t(values.size()));
  footer.i64(6, chunk);
  footer.i64(7, chunk);
  footer.i64(9, 4);
  footer.end_struct();
  footer.end_struct();
  footer.i64(2, chunk);
  footer.i64(3, int64_t(values.size()));
  footer.end_struct();
  footer.end_struct();
  const uint32_t footer_size = uint32_t(footer.out.size());
  return "PAR1" + header.out + page + footer.out +
         std::string(reinterpret_cast<const char*>(&footer_size), 4) + "PAR1";
}

// A page whose header carries a CRC is checked against it: intact, it reads; with a byte of its
// values changed (or a CRC that does not match), it is an error naming the page, never other text.
TEST(Parquet, PageChecksumsAreVerified) {
  const fs::path dir = temp_dir("parquet_crc");
  const std::vector<std::string> values = {"first document", "second, \u00e9", "third"};
  write_file(dir / "crc.parquet", file_with_page_crc(values));
  ParquetColumn c(dir / "crc.parquet", "text");
  std::vector<std::optional<std::string>> expected(values.begin(), values.end());
  EXPECT_EQ(read_column(c), expected);
  EXPECT_EQ(c.layout().v1_pages, 1u);

  std::string flipped = file_with_page_crc(values);
  flipped[flipped.find("second")] = 'S';
  write_file(dir / "flipped.parquet", flipped);
  const std::string e = dataset_error(dir / "flipped.parquet");
  EXPECT_NE(
      e.find("flipped.parquet: column 'text', row group 0, page at byte 4: its CRC does not match its bytes"),
      std::string::npos)
      << e;
  write_file(dir / "wrong_crc.parquet", file_with_page_crc(values, 1));
  EXPECT_NE(dataset_error(dir / "wrong_crc.parquet").find("its CRC does not match"), std::string::npos);
}

// `titan train` on a Parquet file trains on the same batches as on the JSON Lines file of the same
// texts (the same losses, bit for bit), and a run resumed from a checkpoint on the Parquet file
// continues where it stopped (its losses are the uninterrupted run's).
TEST(Parquet, TrainingOnAParquetFileIsTrainingOnItsTexts) {
  const fs::path dir = temp_dir("parquet_train");
  const std::vector<std::string> docs = corpus(400);
  json values = json::array();
  for (auto& d : docs) values.push_back(d);
  write_tables(dir, json::array({{{"out", (dir / "train.parquet").string()},
                                  {"columns", {{"text", {{"type", "utf8"}, {"values", values}}}}},
                                  {"compression", "ZSTD"},
                                  {"page_bytes", 4096},
                                  {"row_group_rows", 100}}}));
  {
    std::ofstream jsonl(dir / "train.jsonl");
    for (auto& d : docs) jsonl << json{{"text", d}}.dump() << "\n";
  }
  auto train = [&](const std::string& name, const fs::path& data, int steps, bool checkpoint) {
    const Overrides o = tiny_job(dir / name, {{"training.dataset_path", data.string()},
                                              {"training.steps", std::to_string(steps)},
                                              {"validation.enable", "false"},
                                              {"checkpoint.enable", checkpoint ? "true" : "false"},
                                              {"checkpoint.interval", "2"}});
    std::string out;
    const std::string cmd =
        titan_binary().string() + " train --config " + debugmodel_toml().string() + cli_args(o);
    EXPECT_EQ(run_command(cmd, &out), 0) << cmd << "\n" << out;
    return by_step(read_metrics(dir / name), "loss");
  };
  const auto parquet = train("parquet", dir / "train.parquet", 4, false);
  ASSERT_EQ(parquet.size(), 4u);
  EXPECT_EQ(parquet, train("jsonl", dir / "train.jsonl", 4, false));
  train("resumed", dir / "train.parquet", 2, true);
  EXPECT_EQ(train("resumed", dir / "train.parquet", 4, true), parquet);
}

// ---- Arrow IPC --------------------------------------------------------------------------------

// Arrow IPC as `datasets` writes it (save_to_disk: the streaming format) and the file format
// ("Feather v2"), Utf8 and LargeUtf8: each row reads as written, nulls as nulls, across record
// batches of 400 rows, from any row sought.
TEST(Arrow, StreamAndFileFormatsReadAsWritten) {
  const fs::path dir = temp_dir("arrow_formats");
  const auto text = text_column(1500, true);
  json spec = json::array();
  std::vector<std::string> names;
  for (const std::string format : {"arrow_stream", "arrow_file"})
    for (const std::string type : {"utf8", "large_utf8"}) {
      json columns = table_json(text);
      columns["text"]["type"] = type;
      columns.erase("tags");
      names.push_back(format + "_" + type + ".arrow");
      spec.push_back({{"out", (dir / names.back()).string()},
                      {"columns", columns},
                      {"format", format},
                      {"batch_rows", 400}});
    }
  write_tables(dir, spec);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ArrowColumn c(dir / name, "text");
    EXPECT_EQ(c.rows(), text.size());
    EXPECT_EQ(c.batches(), 4u);
    EXPECT_EQ(read_column(c), text);
    std::string value;
    bool null = false;
    for (uint64_t row :
         {uint64_t(1499), uint64_t(0), uint64_t(399), uint64_t(400), uint64_t(777), uint64_t(5)}) {
      c.seek(row);
      for (uint64_t r = row; r < std::min<uint64_t>(row + 30, text.size()); ++r) {
        ASSERT_TRUE(c.next(value, null));
        ASSERT_EQ(null ? std::nullopt : std::optional<std::string>(value), text[r])
            << "row " << r << " after " << row;
      }
    }
    c.seek(text.size());
    EXPECT_FALSE(c.next(value, null));
    ArrowColumn other(dir / name, "other");
    other.seek(1234);
    ASSERT_TRUE(other.next(value, null));
    EXPECT_EQ(value, "row 1234");
  }
}

// A `save_to_disk` folder (its .arrow shards beside dataset_info.json and state.json) reads as the
// JSON Lines file of its texts: the metadata files are not documents; positions resume; shards
// partition the rows.
TEST(Arrow, ASaveToDiskFolderReadsAsItsTexts) {
  const fs::path dir = temp_dir("arrow_save_to_disk");
  const auto text = text_column(1000, false);
  const std::vector<std::optional<std::string>> first(text.begin(), text.begin() + 600),
      second(text.begin() + 600, text.end());
  write_tables(dir, json::array({{{"out", (dir / "saved" / "data-00000-of-00002.arrow").string()},
                                  {"columns", {{"text", column_json(first)}}},
                                  {"format", "arrow_stream"},
                                  {"batch_rows", 250}},
                                 {{"out", (dir / "saved" / "data-00001-of-00002.arrow").string()},
                                  {"columns", {{"text", column_json(second)}}},
                                  {"format", "arrow_stream"},
                                  {"batch_rows", 250}}}));
  write_file(dir / "saved" / "dataset_info.json",
             R"({"citation": "", "features": {"text": {"dtype": "string"}}})");
  write_file(dir / "saved" / "state.json", R"({"_data_files": [{"filename": "data-00000-of-00002.arrow"}]})");
  write_texts_jsonl(dir / "texts.jsonl", text);
  DocumentStream saved({{dir / "saved"}});
  std::vector<DocPosition> positions;
  DocumentStream from_jsonl({{dir / "texts.jsonl"}});
  const auto docs = read_texts(saved, &positions);
  EXPECT_EQ(docs, read_texts(from_jsonl));
  EXPECT_EQ(saved.files().size(), 2u);
  for (size_t i : {size_t(0), size_t(249), size_t(250), size_t(598), size_t(599), docs.size() - 1}) {
    DocumentStream resumed({{dir / "saved"}});
    resumed.seek(nlohmann::json(positions[i]).get<DocPosition>());
    Document d;
    ASSERT_TRUE(resumed.next(d)) << "document " << i;
    EXPECT_EQ(d.text, docs[i]);
    EXPECT_EQ(d.position, positions[i]);
  }
}

// Conversations stored in an Arrow file (a list of message structs, a tools column) read as the
// JSON Lines records of the same content, as from Parquet.
TEST(Arrow, ConversationsReadAsTheJsonLinesOfTheSameRecords) {
  const fs::path dir = temp_dir("arrow_chat");
  const json chats = conversations(120);
  write_tables(dir, json::array({{{"out", (dir / "chats.arrow").string()},
                                  {"columns", chat_columns(chats, "null")},
                                  {"format", "arrow_stream"},
                                  {"batch_rows", 50}}}));
  ArrowColumn messages(dir / "chats.arrow", "messages", ColumnReader::Shape::Json);
  ArrowColumn tools(dir / "chats.arrow", "tools", ColumnReader::Shape::Json);
  expect_rows_are(messages, tools, chats);
  EXPECT_EQ(chat_documents(dir / "chats.arrow"), chat_documents(write_chat_jsonl(dir, chats)));
}

// What titan cannot read is an error naming the file and the rule.
TEST(Arrow, FilesTitanCannotReadNameTheFileAndTheRule) {
  const fs::path dir = temp_dir("arrow_errors");
  const auto text = text_column(200, true);
  json columns = table_json(text);
  columns.erase("tags");
  json dictionary = columns;
  dictionary["text"]["type"] = "dictionary_utf8";
  write_tables(
      dir, json::array(
               {{{"out", (dir / "ok.arrow").string()}, {"columns", columns}, {"format", "arrow_stream"}},
                {{"out", (dir / "dict.arrow").string()}, {"columns", dictionary}, {"format", "arrow_stream"}},
                {{"out", (dir / "real.parquet").string()}, {"columns", columns}}}));
  auto expect = [](const std::string& e, const std::string& part) {
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  const fs::path ok = dir / "ok.arrow";
  expect(
      dataset_error(ok, "body"),
      "ok.arrow: has no column 'body' (training.text_field names the column to read; its columns are 'id', "
      "'text', 'other')");
  expect(dataset_error(ok, "id"),
         "ok.arrow: column 'id' holds Int values, not strings (Utf8, LargeUtf8 or Utf8View)");
  expect(dataset_error(dir / "dict.arrow"), "dict.arrow: column 'text' is dictionary-encoded");
  expect(dataset_error(ok), "ok.arrow:6: row 6's column 'text' is null, not a string");
  const std::string bytes = read_file(ok);
  write_file(dir / "cut.arrow", bytes.substr(0, bytes.size() / 2));
  expect(dataset_error(dir / "cut.arrow"), "cut.arrow: ");
  expect(dataset_error(dir / "cut.arrow"), "(truncated?)");
  fs::copy_file(dir / "real.parquet", dir / "renamed.arrow");
  expect(dataset_error(dir / "renamed.arrow"), "renamed.arrow: is not an Arrow IPC file");
  write_file(dir / "packed.arrow.gz", bytes);
  expect(dataset_error(dir / "packed.arrow.gz"), "packed.arrow.gz: a compressed Arrow file is not read");
}

}  // namespace

namespace {

// ---- hand-crafted Parquet files (tests/fixtures/parquet_crafted/README.md) -----------------------

// A fixture file as it is, or one stored gzip-compressed (NAME.gz) unpacked into a temporary folder.
fs::path unpacked(const fs::path& src) {
  if (src.extension() != ".gz") return src;
  const fs::path out = temp_dir("crafted_" + src.stem().stem().string()) / src.stem();
  gzFile in = gzopen(src.c_str(), "rb");
  std::string bytes;
  char buf[1 << 16];
  for (int n; (n = gzread(in, buf, sizeof buf)) > 0;) bytes.append(buf, size_t(n));
  gzclose(in);
  write_file(out, bytes);
  return out;
}

fs::path crafted(const std::string& name) {
  return unpacked(fixtures_dir() / "parquet_crafted" / name);
}

std::vector<json> json_rows(const fs::path& file, const std::string& column, uint64_t from = 0) {
  ParquetColumn c(file, column, ColumnReader::Shape::Json);
  c.seek(from);
  std::vector<json> rows;
  json row;
  while (c.next_json(row)) rows.push_back(row);
  return rows;
}

// Layouts that real writers produce and arrow-rs does not: each reads as the rows it holds.
TEST(Parquet, LayoutsOfOtherWritersRead) {
  // A dictionary-encoded page of nulls only, with no value bytes (Arrow C++ accepts it).
  EXPECT_EQ(json_rows(crafted("dict_allnull_empty.parquet"), "text"), (std::vector<json>{nullptr, nullptr}));
  // A v2 page of nulls whose empty value section is flagged compressed (parquet-mr, Spark).
  for (const char* name : {"v2_empty_snappy.parquet", "v2_empty_zstd.parquet"})
    EXPECT_EQ(json_rows(crafted(name), "text"), (std::vector<json>{nullptr, nullptr})) << name;
  // An empty row group whose chunk has no page and data_page_offset 0 (pyarrow's empty tables).
  EXPECT_EQ(json_rows(crafted("empty_rg.parquet"), "text"), std::vector<json>{"a"});
  // A two-level list by LogicalTypes.md's rule 3: a repeated group whose one field is repeated.
  EXPECT_EQ(json_rows(crafted("rule3.parquet"), "my_list"),
            std::vector<json>{json::array({json::array({"a"})})});
  // v2 pages whose num_rows says the value count (Arrow C++ before 12.0): a seek counts the rows
  // by decoding, so it lands on row 3, not past it.
  const std::vector<json> lists = {json::array({"a", "b"}), json::array({"c"}), json::array({"d"}),
                                   json::array({"e"}), json::array({"f"})};
  EXPECT_EQ(json_rows(crafted("v2_badrows.parquet"), "l"), lists);
  EXPECT_EQ(json_rows(crafted("v2_badrows.parquet"), "l", 3),
            std::vector<json>(lists.begin() + 3, lists.end()));
}

// Files built to break the reader (sizes that overflow, counts that would allocate gigabytes,
// nesting that would exhaust the stack) are errors naming the file and the fault, never a crash.
TEST(Parquet, MaliciousFilesAreErrorsNotCrashes) {
  auto expect = [](const fs::path& file, const std::string& column, const std::string& part) {
    const std::string e = error_of([&] { json_rows(file, column); });
    SCOPED_TRACE(file.filename().string());
    EXPECT_NE(e.find(file.filename().string() + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect(crafted("negchildren.parquet"), "text", "a schema element with -1 children");
  expect(crafted("dbp_overflow.parquet"), "text", "has blocks of 4611686018427387904 values");
  expect(crafted("deeplist.parquet.gz"), "text",
         "its footer is corrupt: Thrift values nested more than 64 deep");
  expect(crafted("deepschema.parquet"), "text", "nests more than 64 levels deep");
  expect(crafted("dict_huge.parquet"), "text", "it claims more PLAIN values than its bytes can hold");
  expect(crafted("dba_prefix.parquet"), "text",
         "DELTA_BYTE_ARRAY value 1 has a prefix of 1048576 bytes where the value before it has 1 (a prefix "
         "is part of the value before it)");
  expect(crafted("huge_page.parquet"), "text", "it claims 268435457 values");
}

// Sizes a forged header inflates are refused before the memory they claim is allocated: a page's
// uncompressed size past believed_unpacked_bytes of its stored bytes (1024 times them plus 1 MiB)
// unless its data, decoded and counted through a small buffer, proves it (so 2 GiB is never
// allocated, nor 64 MiB for a frame counted only until past them), a row of more than 2^24 values
// (counted in the page before any entry is copied).
TEST(Parquet, ForgedSizesAreRefusedBeforeTheyAreAllocated) {
  auto expect = [](const std::string& name, const std::string& column, const std::string& part) {
    const std::string e = error_of([&] { json_rows(crafted(name), column); });
    SCOPED_TRACE(name);
    EXPECT_NE(e.find(name + ": column '" + column), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  for (const auto& [name, codec] :
       std::vector<std::pair<std::string, std::string>>{{"page_ratio.parquet", "GZIP"},
                                                        {"page_ratio_zstd.parquet", "ZSTD"},
                                                        {"page_ratio_brotli.parquet", "BROTLI"}})
    expect(name, "text",
           "page at byte 4: its " + codec +
               " data decompresses to 5 bytes where the page header says 2147483647");
  expect(
      "page_ratio_lz4.parquet", "text",
      "page at byte 4: its LZ4_RAW data of 6 bytes cannot unpack to the 2147483647 its page header says (at "
      "most 255 times its bytes)");
  expect("page_over_zstd.parquet", "text",
         "page at byte 4: its ZSTD data decompresses to more than the 67108864 bytes its page header says");
  expect("row_values.parquet", "l",
         "row group 0, page at byte 4: a row holds more than 2^24 values, the most titan assembles into one "
         "row");
}

// Data past believed_unpacked_bytes (proven by counting) is held to kMaxCountedBytes for a column's row
// group: pages_past_budget's struct column has three leaves whose one page each is 2 GiB of "x" in a
// 64 KiB zstd frame (each alone a valid page, at most 2^31 - 1 bytes), 6 GiB at once from 200 KB,
// which were counted and allocated one after the other. Refused from the page headers before any
// page is decoded, naming the file, the column, the row group and the rule; the process peaks at
// 16 MiB.
TEST(Parquet, PagesPastTheCountedBudgetOfARowGroupAreRefusedBeforeTheyAreDecoded) {
  static_assert(3 * (uint64_t(1) << 31) - 3 * 16322 > kMaxCountedBytes);
  const std::string e = error_of([&] { json_rows(crafted("pages_past_budget.parquet.gz"), "m"); });
  EXPECT_NE(e.find("pages_past_budget.parquet: column 'm', row group 0: the first pages of its leaves 'm.a', "
                   "'m.b', 'm.c' claim 6442402056 bytes uncompressed, each past 1024 times its stored bytes "
                   "plus 1 MiB: " +
                   past_counted_bytes("row group")),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("more than the 4 GiB titan decodes past that ratio at once for one row group of a column"),
            std::string::npos)
      << e;
}

// The document of the crafted files of one document repeated (make.py, craft.js): 64 KiB of numbered
// lines.
std::string repeated_document() {
  std::string doc;
  char line[64];
  for (int i = 0; doc.size() < 65536; ++i) {
    std::snprintf(line, sizeof line, "%05d the quick brown fox jumps over the lazy dog\n", i);
    doc += line;
  }
  doc.resize(65536);
  return doc;
}

// Reads `c` to its end, expecting `expected` rows of the repeated document (each compared as it is
// read: the test holds one page, not 64 MiB of rows as well).
void expect_repeated_document(ColumnReader& c, size_t expected = 1024) {
  const std::string doc = repeated_document();
  std::string value;
  bool null = false;
  size_t rows = 0;
  while (c.next(value, null)) {
    ASSERT_FALSE(null) << "row " << rows;
    ASSERT_TRUE(value == doc) << "row " << rows << " is " << value.size() << " bytes";
    ++rows;
  }
  EXPECT_EQ(rows, expected);
}

// A page of one document repeated goes past 1024:1 in zstd and Brotli, as pyarrow (zstd frames that
// declare their size), arrow-rs and Polars (frames that declare none) write it: pyarrow checks a
// page's size every 1024 values, so 1024 rows of a 64 KiB document are one 64 MiB page, here of 2 KB
// (Brotli) or 7 KB (zstd). Past believed_unpacked_bytes, its size is proven by decoding the data
// once, counted, and it reads (it was refused as a forged header). The process peaks at 82 MiB: one
// 64 MiB page at a time, each row compared as it is read.
TEST(Parquet, PageOfOneDocumentRepeatedPastAThousandToOneReads) {
  for (const char* name :
       {"repeated_zstd.parquet", "repeated_zstd_stream.parquet", "repeated_brotli.parquet"}) {
    SCOPED_TRACE(name);
    EXPECT_GT(uint64_t(1024) * (65536 + 4), believed_unpacked_bytes(fs::file_size(crafted(name))));
    ParquetColumn c(crafted(name), "text");
    expect_repeated_document(c);
  }
}

// A DELTA_BYTE_ARRAY page of one document repeated stores it once, each further value the whole one
// before it: parquet-mr (Spark) ends a page at 20,000 values, so such a page rebuilds to gigabytes
// from kilobytes, while every row is one document. Each value is rebuilt as its row takes it, in
// place of the one before it, never the page's values at once: 2048 rows of the 64 KiB document, a
// v2 page of 3.5 KB (128 MiB of values, refused when the page was rebuilt whole and held to 64 times
// its stored bytes), and 20,000 rows of a 1 MB value (20 GB from 1 MB) read, seeks included, while
// the process peaks at 20 MiB.
TEST(Parquet, DeltaByteArrayPageOfOneDocumentRepeatedReadsRowByRow) {
  {
    ParquetColumn c(crafted("dba_repeated.parquet"), "text");
    EXPECT_EQ(c.rows(), 2048u);
    expect_repeated_document(c, 2048);
    c.seek(2000);
    expect_repeated_document(c, 48);
  }
  ParquetColumn c(crafted("dba_repeated_20gb.parquet.gz"), "text");
  EXPECT_EQ(c.rows(), 20000u);
  const std::string value(1000000, 'x');
  std::string got;
  bool null = true;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.next(got, null));
    EXPECT_FALSE(null);
    EXPECT_TRUE(got == value) << "row " << i << " is " << got.size() << " bytes";
  }
  c.seek(19998);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.next(got, null));
    EXPECT_TRUE(got == value) << "row " << 19998 + i << " is " << got.size() << " bytes";
  }
  EXPECT_FALSE(c.next(got, null));
}

// The rows of dba_distinct.parquet (make.py builds the same): distinct values sharing prefixes of
// every length with the value before them (none, a few bytes, all of it), nulls between them.
std::optional<std::string> distinct_text(int i) {
  static const std::string letters = "abcdefghijklmnopqrstuvwxyz";
  if (i % 13 == 6) return std::nullopt;
  if (i % 10 == 3) return std::to_string(i) + " other";
  char number[16];
  std::snprintf(number, sizeof number, "%04d", i / 2);
  return "doc " + std::string(number) + " " + letters.substr(0, size_t(i * 7 % 27));
}
json distinct_messages(int i) {
  static const std::string letters = "abcdefghijklmnopqrstuvwxyz";
  if (i % 17 == 4) return nullptr;
  json out = json::array();
  if (i % 11 == 8) return out;
  for (int j = 0; j < 1 + i % 3; ++j) {
    if ((i + j) % 13 == 9) {
      out.push_back(nullptr);
      continue;
    }
    char head[32];
    std::snprintf(head, sizeof head, "msg %04d.%d ", i, j);
    json content =
        (i + j) % 7 == 5 ? json(nullptr) : json(head + letters.substr(0, size_t((i * 5 + j * 3) % 27)));
    out.push_back({{"role", j % 2 == 0 ? "user" : "assistant"}, {"content", content}});
  }
  return out;
}

// A seek into the middle of a DELTA_BYTE_ARRAY page rebuilds every value it passes over: each value
// is the start of the one before it and its own suffix, so the first one read after the seek is only
// right when those before it were. dba_distinct.parquet's values are distinct, each sharing 0 to all
// of the value before it (every value of a page of one document repeated is the same, so any value
// kept passes there): 240 rows in two v1 pages per column, of a flat optional text column and of a
// list of {role, content} structs (two DELTA_BYTE_ARRAY leaves), read whole and from rows in the middle
// of either page, at its edges and past the first page (passed over by its header).
TEST(Parquet, DeltaByteArraySeekIntoAPageOfDistinctValues) {
  const fs::path file = crafted("dba_distinct.parquet");
  constexpr int kRows = 240;
  std::vector<std::optional<std::string>> texts;
  std::vector<json> messages;
  for (int i = 0; i < kRows; ++i) {
    texts.push_back(distinct_text(i));
    messages.push_back(distinct_messages(i));
  }
  ParquetColumn text(file, "text");
  ASSERT_EQ(text.rows(), uint64_t(kRows));
  const std::vector<std::optional<std::string>> full = read_column(text);
  ASSERT_EQ(full, texts);
  EXPECT_EQ(text.layout().encodings, std::set<std::string>{"DELTA_BYTE_ARRAY"});
  EXPECT_EQ(text.layout().v1_pages, 2u);
  EXPECT_EQ(json_rows(file, "messages"), messages);
  for (const int from : {1, 2, 37, 59, 60, 61, 119, 120, 121, 173, 200, 239}) {
    SCOPED_TRACE("from row " + std::to_string(from));
    text.seek(uint64_t(from));
    EXPECT_EQ(read_column(text), std::vector<std::optional<std::string>>(full.begin() + from, full.end()));
    EXPECT_EQ(json_rows(file, "messages", uint64_t(from)),
              std::vector<json>(messages.begin() + from, messages.end()));
  }
}

// A row that names one 1 MiB string 1025 times (a Parquet dictionary entry, or DELTA_BYTE_ARRAY values
// each the whole one before it; Arrow string views of the same bytes) is 1025 MiB of strings from a
// file of 1.2 KB (Parquet) or 17 KB (Arrow): refused,
// naming the file, the column, the row and the rule, before any of it is copied, so the test holds
// only the file's 1 MiB string (the process peaks at 16 MiB, as for any test here; unrefused, the
// Parquet row took 3.0 GiB and the Arrow one 2.0 GiB).
constexpr uint64_t kRepeatedRowBytes = 1025 * (uint64_t(1) << 20);
static_assert(kRepeatedRowBytes > kMaxRowBytes, "the crafted rows must be past the cap");

TEST(Parquet, RowRepeatingAStringPastItsBytesIsRefusedBeforeItIsCopied) {
  for (const std::string name : {"row_bytes.parquet", "dba_row_bytes.parquet"}) {
    SCOPED_TRACE(name);
    const std::string e = error_of([&] { json_rows(crafted(name), "l"); });
    EXPECT_NE(e.find(name + ": column 'l.list.element', row group 0, page at byte "), std::string::npos) << e;
    EXPECT_NE(e.find(": row 1: " + too_many_row_bytes(kRepeatedRowBytes)), std::string::npos) << e;
    EXPECT_NE(e.find("its strings add up to 1074790400 bytes or more, past the 1 GiB titan assembles into "
                     "one row (no document is that large"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("split the document into smaller rows, or leave the row out"), std::string::npos) << e;
  }
}

}  // namespace

namespace {

// ---- hand-crafted Arrow files (tests/fixtures/arrow_crafted/README.md) -------------------------

std::vector<json> arrow_rows(const fs::path& file, const std::string& column) {
  ArrowColumn c(file, column, ColumnReader::Shape::Json);
  std::vector<json> rows;
  json row;
  while (c.next_json(row)) rows.push_back(row);
  return rows;
}

// Layouts of other writers and versions read as the rows they hold; a dictionary-encoded column and
// a list of structs before the text column (written by apache-arrow) are stepped over.
TEST(Arrow, LayoutsOfOtherWritersRead) {
  const fs::path crafted = fixtures_dir() / "arrow_crafted";
  EXPECT_EQ(arrow_rows(crafted / "legacy.arrow", "text"), (std::vector<json>{"hi", "you"}));
  EXPECT_EQ(arrow_rows(crafted / "sliced.arrow", "text"), (std::vector<json>{"lo", "you"}));
  EXPECT_EQ(arrow_rows(crafted / "empty_child_offsets.arrow", "messages"), std::vector<json>{json::array()});
  // Columns stepped over by their buffer counts: a union of a V4 stream (a validity buffer of its
  // own), a Utf8View with its variadic data buffer. One buffer miscounted and the text reads wrong.
  EXPECT_EQ(arrow_rows(crafted / "union_before_v5.arrow", "text"), (std::vector<json>{"hi", "you"}));
  EXPECT_EQ(arrow_rows(crafted / "view_beside_text.arrow", "text"), (std::vector<json>{"hi", "you"}));
  EXPECT_EQ(arrow_rows(crafted / "lz4_empty_buffer.arrow", "text"), (std::vector<json>{"", ""}));

  const fs::path dir = temp_dir("arrow_layouts");
  const json lists = json::array({json::array({{{"a", "1"}, {"b", 1}}}), json::array(), nullptr,
                                  json::array({{{"a", nullptr}, {"b", 2}}}), json::array()});
  const json columns = {
      {"d", {{"type", "dictionary_utf8"}, {"values", {"x", "y", "x", nullptr, "z"}}}},
      {"n", {{"type", {{"list", {{"struct", {{"a", "utf8"}, {"b", "int64"}}}}}}}, {"values", lists}}},
      {"text", {{"type", "utf8"}, {"values", {"r0", "r1", "r2", "r3", "r4"}}}}};
  write_tables(
      dir,
      json::array({{{"out", (dir / "s.arrow").string()},
                    {"columns", columns},
                    {"format", "arrow_stream"},
                    {"batch_rows", 2}},
                   {{"out", (dir / "f.arrow").string()}, {"columns", columns}, {"format", "arrow_file"}}}));
  for (const char* name : {"s.arrow", "f.arrow"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(arrow_rows(dir / name, "text"), (std::vector<json>{"r0", "r1", "r2", "r3", "r4"}));
    EXPECT_EQ(arrow_rows(dir / name, "n"), std::vector<json>(lists.begin(), lists.end()));
  }
}

// Arrow IPC files Polars wrote (tests/fixtures/arrow_compressed/README.md): record batches compressed
// in LZ4 frames and zstd, strings as views (Polars' newest layout: inline up to 12 bytes, else in a
// data buffer) and as LargeUtf8 (its oldest), file and stream formats. Every row reads as the JSON
// Lines file the same script wrote, nulls as nulls, in three record batches and from any row sought;
// a list of {role, content} structs of views reads as the conversations.
TEST(Arrow, CompressedFilesAndStringViewsPolarsWroteRead) {
  const fs::path dir = fixtures_dir() / "arrow_compressed";
  std::vector<std::optional<std::string>> want;
  {
    std::ifstream f(dir / "rows.jsonl");
    for (std::string line; std::getline(f, line);) {
      const json text = json::parse(line).at("text");
      want.push_back(text.is_null() ? std::nullopt : std::optional<std::string>(text.get<std::string>()));
    }
  }
  ASSERT_EQ(want.size(), 700u);
  // (Polars' streaming writers, the stream format's and sinkIpc's, gather the three chunks into one batch.)
  for (const auto& [name, batches] :
       std::vector<std::pair<std::string, size_t>>{{"view.arrow", 3},
                                                   {"view_lz4.arrow", 3},
                                                   {"view_zstd.arrow", 3},
                                                   {"view_zstd_stream.arrow", 1},
                                                   {"large_lz4.arrow", 1},
                                                   {"large_zstd.arrow", 1}}) {
    SCOPED_TRACE(name);
    ArrowColumn c(dir / name, "text");
    EXPECT_EQ(c.batches(), batches);
    EXPECT_EQ(read_column(c), want);
    std::string value;
    bool null = false;
    for (const uint64_t row : {uint64_t(499), uint64_t(250), uint64_t(3), uint64_t(699)}) {
      c.seek(row);
      ASSERT_TRUE(c.next(value, null));
      EXPECT_EQ(null ? std::nullopt : std::optional<std::string>(value), want[row]) << "row " << row;
    }
  }
  std::vector<json> chats;
  {
    std::ifstream f(dir / "chats.jsonl");
    for (std::string line; std::getline(f, line);) chats.push_back(json::parse(line).at("messages"));
  }
  ASSERT_EQ(chats.size(), 60u);
  EXPECT_EQ(arrow_rows(dir / "chats_view_zstd.arrow", "messages"), chats);
}

// A compressed buffer of one document repeated goes past 1024:1 too
// (Parquet.PageOfOneDocumentRepeatedPastAThousandToOneReads): a zstd batch of 1024 rows of a 64 KiB
// document, its 64 MiB data buffer 9 KB of its body, reads (it was refused as a forged length); the
// process peaks at 78 MiB.
TEST(Arrow, BufferOfOneDocumentRepeatedPastAThousandToOneReads) {
  const fs::path file = fixtures_dir() / "arrow_crafted" / "repeated_zstd.arrow";
  EXPECT_GT(uint64_t(1024) * 65536, believed_unpacked_bytes(fs::file_size(file)));
  ArrowColumn c(file, "text");
  expect_repeated_document(c);
}

// A compressed buffer declaring more than its batch is believed to unpack to is held to what its
// array needs (a data buffer to the bytes its offsets reach), and a batch's such buffers to
// kMaxCountedBytes, before anything is counted: buffer_past_need's data buffer declares 64 GiB for
// one row of 2 bytes, and buffer_past_budget's offsets 4 GiB + 4 bytes for 2^30 empty strings (what
// they need), both in zstd frames that really decode to it, from 2 MB and 130 KB: they were counted
// and allocated (64 GiB, zero-filled, is past any host). Refused naming the file, batch, column, buffer
// and rule; the process peaks at 20 MiB.
TEST(Arrow, BuffersPastWhatTheirArrayNeedsOrTheBudgetAreRefusedBeforeTheyAreCounted) {
  auto error = [](const std::string& name) {
    return error_of([&] {
      ArrowColumn c(unpacked(fixtures_dir() / "arrow_crafted" / name), "text");
      std::string value;
      bool null = false;
      c.next(value, null);
    });
  };
  const std::string past =
      " bytes, past what the batch's body is believed to unpack to (1024 times it plus 1 MiB)";
  std::string e = error("buffer_past_need.arrow.gz");
  EXPECT_NE(
      e.find("buffer_past_need.arrow: record batch 0: column 'text': the data buffer of 'text': a zstd "
             "buffer declares 68719476736" +
             past + ", and more than the 64 its array needs (the 2 bytes its offsets reach, padded to 64)"),
      std::string::npos)
      << e;
  e = error("buffer_past_budget.arrow.gz");
  EXPECT_NE(
      e.find("buffer_past_budget.arrow: record batch 0: column 'text': the offsets buffer of 'text': a zstd "
             "buffer declares 4294967300" +
             past + "; with the 0 bytes past that ratio its column holds already, that is " +
             past_counted_bytes("record batch")),
      std::string::npos)
      << e;
  EXPECT_NE(
      e.find("more than the 4 GiB titan decodes past that ratio at once for one record batch of a column"),
      std::string::npos)
      << e;
  // Within them, a length is still proven by its data: repeated_zstd's 64 MiB data buffer (what its
  // offsets reach) declared 1 byte short is counted until past it.
  std::string data = read_file(fixtures_dir() / "arrow_crafted" / "repeated_zstd.arrow");
  const std::string zstd_magic("\x28\xb5\x2f\xfd", 4);
  const size_t frame = data.find(zstd_magic, data.find(zstd_magic) + 1);
  ASSERT_NE(frame, std::string::npos);
  const int64_t short_length = (int64_t(64) << 20) - 1;
  data.replace(frame - 8, 8, reinterpret_cast<const char*>(&short_length), 8);
  const fs::path file = temp_dir("arrow_past_need") / "repeated_zstd_short.arrow";
  write_file(file, data);
  e = error_of([&] { arrow_rows(file, "text"); });
  EXPECT_NE(
      e.find("repeated_zstd_short.arrow: record batch 0: column 'text': the data buffer of 'text': a zstd "
             "buffer holds more than the 67108863 it declares"),
      std::string::npos)
      << e;
}

// Compressed buffers whose data or stored length is wrong are errors naming the file, the batch,
// the column and the fault, before a byte is trusted: a forged length of 2^40 claims nothing (its
// data is counted, not allocated), a
// frame cut or damaged is named, and a file of apache-arrow's JavaScript writer (whose stored length
// is the compressed size) is told apart. (The first frame of Polars' files is column 'id''s values.)
TEST(Arrow, CompressedBuffersThatLieAreErrors) {
  const fs::path dir = fixtures_dir() / "arrow_compressed", out = temp_dir("arrow_compressed_lies");
  // The file with the 8 bytes before the first frame (its stored length) or the frame's bytes changed.
  auto altered = [&](const std::string& name, const std::string& magic, int64_t at,
                     const std::string& bytes) {
    std::string data = read_file(dir / name);
    const size_t frame = data.find(magic);
    EXPECT_NE(frame, std::string::npos) << name;
    data.replace(size_t(int64_t(frame) + at), bytes.size(), bytes);
    const fs::path file = out / ("altered_" + std::to_string(at) + "_" + name);
    write_file(file, data);
    return file;
  };
  auto length = [](int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  const std::string zstd_magic("\x28\xb5\x2f\xfd", 4), lz4_magic("\x04\x22\x4d\x18", 4);
  auto expect = [](const fs::path& file, const std::vector<std::string>& parts,
                   const std::string& column = "id") {
    const std::string e = error_of([&] { arrow_rows(file, column); });
    EXPECT_NE(e.find(file.filename().string() + ": record batch 0: column '" + column + "': "),
              std::string::npos)
        << e;
    for (const std::string& part : parts) EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect(
      altered("view_zstd.arrow", zstd_magic, -8, length(int64_t(1) << 40)),
      {"the values buffer of 'id': a zstd buffer declares 1099511627776 bytes, past what the batch's body is "
       "believed to unpack to (1024 times it plus 1 MiB), and more than the 2048 its array needs (250 values "
       "of 8 bytes, padded to 64)"});
  expect(altered("view_zstd.arrow", zstd_magic, -8, length(3000)),
         {"a zstd buffer holds 2000 bytes, not the 3000 it declares"});
  expect(altered("view_zstd.arrow", zstd_magic, 6, std::string(8, '\xff')), {"zstd"});
  expect(altered("view_lz4.arrow", lz4_magic, 4, std::string(4, '\x7f')), {"its LZ4 frame is corrupt: "});
  expect(altered("view_lz4.arrow", lz4_magic, -8, length(3)),
         {"an LZ4 buffer does not hold one whole frame of the 3"});
  expect(dir / "arrowjs_lz4.arrow",
         {"not the uncompressed size the Arrow format asks for: apache-arrow's JavaScript writer"}, "text");
}

// Files built to break the reader (sizes that wrap, arrays that need no bytes, schemas that share
// fields exponentially) are errors naming the file and the fault, never a crash or a runaway.
TEST(Arrow, MaliciousFilesAreErrorsNotCrashes) {
  const fs::path crafted = fixtures_dir() / "arrow_crafted";
  auto expect = [&](const std::string& name, const std::string& column, const std::string& part) {
    SCOPED_TRACE(name);
    const std::string e = error_of([&] { arrow_rows(crafted / name, column); });
    EXPECT_NE(e.find(name + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect("wrap_int64_child.arrow", "messages", "an array of 2305843009213693952 values");
  expect("wrap_int64_overread.arrow", "messages", "an array of 2305843009213693952 values");
  expect("wrap_large_utf8.arrow", "text", "an array of 2305843009213693952 values");
  expect("null_bomb.arrow", "messages", "an array of 1099511627776 values");
  expect("null_row_bomb.arrow", "messages", "row 1: column 'messages': a row holds more than 2^24 values");
  expect("schema_dag_40.arrow", "text", "more than 65536 fields");
  expect("truncated_fileformat.arrow", "text", "does not end with its footer and ARROW1 (truncated?)");
  expect("view_without_count.arrow", "text", "a view field has no variadic buffer count");
  expect("view_count_2_21.arrow", "text", "a view field has 2097152 variadic buffers");
  expect("view_shared_buffers.arrow", "text",
         "column 'text' has buffers of 2080 bytes or more in a body of 1056 (they overlap: the file is "
         "corrupt)");
}

// (Parquet.RowRepeatingAStringPastItsBytesIsRefusedBeforeItIsCopied says why.)
TEST(Arrow, RowOfViewsOfTheSameBytesPastItsBytesIsRefusedBeforeItIsCopied) {
  const std::string e =
      error_of([&] { arrow_rows(fixtures_dir() / "arrow_crafted" / "row_bytes.arrow", "messages"); });
  EXPECT_NE(e.find("row_bytes.arrow: row 1: column 'messages': " + too_many_row_bytes(kRepeatedRowBytes)),
            std::string::npos)
      << e;
}

}  // namespace
