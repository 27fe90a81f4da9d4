#pragma once
// Documents from files and folders: JSON arrays (of strings, or of objects with a text
// field), JSON Lines, plain text, and Parquet files' text column (data/parquet.h). Read as a stream, so a
// file larger than memory works, with a position that can be saved and sought back to exactly.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/chat.h"

namespace titan::data {

struct DatasetConfig {
  std::vector<std::filesystem::path> paths;  // files and folders (searched recursively)
  std::string text_field = "text";           // for JSON objects, and the column of a Parquet file
  // Plain text files: "paragraph" (documents separated by blank lines), "line" (one
  // document per line) or "file" (the whole file is one document, held in memory).
  std::string text_split = "paragraph";
  // Non-empty: every record is a conversation, an object whose field of this name holds its
  // messages (and whose "tools" field, when present, the tool signatures), rendered with Qwen3's
  // chat template (data/chat.h). Plain-text files cannot hold conversations and are an error.
  std::string chat_field = "";
};

// Where a document starts: enough to resume reading there exactly.
struct DocPosition {
  uint64_t file = 0;     // index into DocumentStream::files()
  uint64_t offset = 0;   // byte offset in that file (a Parquet file: its row, from 0)
  uint64_t line = 1;     // 1-based line number at `offset`, for error messages (Parquet: row + 1)
  bool in_array = false;  // a JSON array file whose '[' lies before `offset`
  bool operator==(const DocPosition&) const = default;
};
// to_json / from_json: a JSON object with one entry per field, named as the field.
// (Positions saved before 2026-12-06 also hold "index", a document count only sharding used: ignored.)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DocPosition, file, offset, line, in_array)

struct Document {
  std::string text;             // valid UTF-8, never empty; a conversation's rendered text
  std::vector<ChatPiece> chat;  // a conversation's pieces (text is their concatenation); empty for text
  DocPosition position;
};

// The files a dataset path list stands for: files as given, folders searched
// recursively for .parquet .json .jsonl .ndjson .txt .text .md (hidden names skipped), sorted.
std::vector<std::filesystem::path> list_dataset_files(const std::vector<std::filesystem::path>& paths);
// The regular files of the folders among `paths` (or a glob's matches) that list_dataset_files passes over as
// not data (another extension; hidden names and `datasets`' metadata files not counted), sorted: the start-up
// line names them, so a shard saved as .jsonl.bak is not missed in silence.
std::vector<std::filesystem::path> files_passed_over(const std::vector<std::filesystem::path>& paths);

// Whether this process has not yet warned of `kind` ("invalid UTF-8", ...) in `file`; records that it
// now has. Data warnings are said once per file and process, however many loaders read it (a
// validation pass opens its own each time).
bool first_warning_of(const std::filesystem::path& file, std::string_view kind);

// Whether the file's name makes it plain text (.txt .text .md or none, plain or compressed):
// the files DatasetConfig::text_split cuts into documents.
bool is_plain_text(const std::filesystem::path& file);

// Whether training reads the file as JSON Lines, one record per line: a .jsonl or .ndjson file (plain
// or compressed), or a .json file that does not begin with '[' (as Hugging Face writes them).
bool is_json_lines(const std::filesystem::path& file);

// One pass over the documents. Empty documents are skipped; invalid UTF-8 is repaired, counted,
// and reported on stderr per file.
class DocumentStream {
 public:
  explicit DocumentStream(DatasetConfig config);
  ~DocumentStream();
  DocumentStream(const DocumentStream&) = delete;
  DocumentStream& operator=(const DocumentStream&) = delete;

  bool next(Document& doc);  // false at the end of the last file
  DocPosition position() const;  // where the next call to next() starts reading
  void seek(const DocPosition& position);
  const std::vector<std::filesystem::path>& files() const;

  struct Stats {
    uint64_t documents = 0;      // returned by next()
    uint64_t empty_skipped = 0;  // of this shard
    uint64_t invalid_utf8 = 0;   // replacements in the returned documents
  };
  const Stats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
