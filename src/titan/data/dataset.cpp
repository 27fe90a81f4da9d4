#include "titan/data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/data/column_reader.h"
#include "titan/data/text_guard.h"
#include "titan/data/text_stream.h"
#include "titan/data/utf8.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"

namespace titan::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The extension that names the format, lower-cased (".JSONL" from Windows tools is ".jsonl"),
// after a compression suffix (".jsonl.gz" -> ".jsonl").
std::string extension_of(const fs::path& path) {
  std::string ext = TextStream::uncompressed_name(path).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

bool has_glob_characters(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// The paths a shell glob ("shards/part-*.jsonl.gz") matches, sorted; none is an error.
std::vector<fs::path> expand_glob(const fs::path& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<fs::path> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  TITAN_CHECK(rc == 0 || rc == GLOB_NOMATCH, "dataset: cannot expand the pattern ", pattern);
  TITAN_CHECK(!out.empty(), "dataset: the pattern ", pattern, " matches no file");
  return out;  // glob() sorts
}

}  // namespace

namespace {
// A file named explicitly must be a format titan reads: said when the dataset is listed (before any
// compute, under the config key that named it), not when the stream reaches it.
void check_readable_format(const fs::path& path) {
  const std::string ext = extension_of(path);
  TITAN_CHECK(ext == ".json" || ext == ".jsonl" || ext == ".ndjson" || ext == ".csv" || ext == ".tsv" ||
                  is_table_file(TextStream::uncompressed_name(path)) || is_plain_text(path),
              "dataset: ", path.string(), ": '", ext,
              "' files are not a format titan reads (.parquet, .arrow; .json, .jsonl, .ndjson, .csv, .tsv, "
              ".txt, .text, .md, each also .gz or .zst; a name without an extension is plain text)");
  // A table file is read by its footer and offsets (Parquet compresses its pages itself): a compressed copy
  // of the whole file has no random access.
  TITAN_CHECK(
      !is_table_file(TextStream::uncompressed_name(path)) || TextStream::uncompressed_name(path) == path,
      "dataset: ", path.string(), ": a compressed ", ext == ".parquet" ? "Parquet" : "Arrow",
      " file is not read (it is read by its offsets; Parquet compresses its pages itself): decompress it to ",
      TextStream::uncompressed_name(path).filename().string());
}
}  // namespace

namespace {

// Folder `p`'s data files, searched recursively (hidden names skipped), sorted; `passed_over`, when
// given, gets its other regular files (not hidden, not `datasets`' metadata), sorted.
std::vector<fs::path> data_files_in_folder(const fs::path& p, std::vector<fs::path>* passed_over) {
  static const char* kExtensions[] = {".json",    ".jsonl", ".ndjson", ".csv",  ".tsv",
                                      ".parquet", ".arrow", ".txt",    ".text", ".md"};
  std::vector<fs::path> found;
  fs::path entry = p;  // the entry the listing is at: a folder it cannot enter fails the next step
  try {
    for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      entry = it->path();
      std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      const std::string ext = extension_of(it->path());
      const bool data_name =
          std::find(std::begin(kExtensions), std::end(kExtensions), ext) != std::end(kExtensions);
      // A data file's link that leads nowhere is a file of the dataset gone missing, not a skip.
      TITAN_CHECK(!(data_name && it->is_symlink() && !fs::exists(it->path())), "dataset: ", it->path(),
                  " in folder ", p, " is a symbolic link to nothing (", fs::read_symlink(it->path()), ")");
      // Hugging Face `datasets`' own files beside its .arrow shards (save_to_disk) are not documents.
      const bool datasets_metadata =
          name == "dataset_info.json" || name == "state.json" || name == "dataset_dict.json";
      if (it->is_regular_file() && data_name && !datasets_metadata)
        found.push_back(it->path());
      else if (passed_over && it->is_regular_file() && !datasets_metadata)
        passed_over->push_back(it->path());
    }
  } catch (const fs::filesystem_error& e) {  // a link loop, a folder that cannot be read
    TITAN_FAIL("dataset: folder ", p, " cannot be listed: ", e.code().message(), " at ",
               e.path1().empty() ? entry : e.path1());
  }
  std::sort(found.begin(), found.end());
  if (passed_over) std::sort(passed_over->begin(), passed_over->end());
  return found;
}

// The paths given, each glob (a path that does not exist, with pattern characters) replaced by its
// matches.
std::vector<fs::path> expand_globs(const std::vector<fs::path>& given) {
  std::vector<fs::path> paths;
  for (auto& p : given) {
    if (!fs::exists(p) && has_glob_characters(p.string())) {
      auto matched = expand_glob(p);
      paths.insert(paths.end(), matched.begin(), matched.end());
    } else {
      paths.push_back(p);
    }
  }
  return paths;
}

}  // namespace

std::vector<fs::path> files_passed_over(const std::vector<fs::path>& given) {
  std::vector<fs::path> passed_over;
  for (const fs::path& p : expand_globs(given))
    if (fs::is_directory(p)) data_files_in_folder(p, &passed_over);
  return passed_over;
}

std::vector<fs::path> list_dataset_files(const std::vector<fs::path>& given) {
  std::vector<fs::path> files;
  for (auto& p : expand_globs(given)) {
    TITAN_CHECK(fs::exists(p), "dataset: ", p, " does not exist");
    if (!fs::is_directory(p)) {
      io::check_regular_file(p, "dataset");  // a FIFO or device would hang or never end
      check_readable_format(p);
      files.push_back(p);
      continue;
    }
    const std::vector<fs::path> found = data_files_in_folder(p, nullptr);
    TITAN_CHECK(!found.empty(), "dataset: folder ", p,
                " holds no .parquet or .arrow files, nor .json/.jsonl/.ndjson/.csv/.tsv/.txt/.text/.md files "
                "(plain, .gz or .zst)");
    files.insert(files.end(), found.begin(), found.end());
  }
  TITAN_CHECK(!files.empty(), "dataset: no dataset paths given");
  // Every file opens now, before any compute: not when the stream, or a checkpoint's fingerprint of
  // the data, reaches it hours later.
  for (const fs::path& f : files) {
    errno = 0;
    TITAN_CHECK(std::ifstream(f, std::ios::binary).is_open(), "dataset: cannot read ", f, ": ",
                errno ? std::strerror(errno) : "cannot be opened");
  }
  return files;
}

bool first_warning_of(const fs::path& file, std::string_view kind) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  return warned.insert(std::string(kind) + '\0' + file.string()).second;
}

bool is_plain_text(const fs::path& file) {
  // Plain text: its own names, and a name without an extension. Any other extension (.csv,
  // .parquet, ...) is a format titan does not read, not text to train on as it is.
  const std::string ext = extension_of(file);
  return ext.empty() || ext == ".txt" || ext == ".text" || ext == ".md";
}

namespace {

enum class Format { JsonArray, JsonLines, Csv, Text, Table };  // Table: Parquet, Arrow IPC

// Buffered reader that knows its byte offset (in the decompressed bytes of a .gz file) and line number.
class Reader {
 public:
  void open(const fs::path& path, uint64_t offset, uint64_t line) {
    path_ = path;
    stream_.open(path, offset);
    base_ = offset;
    pos_ = len_ = 0;
    line_ = line;
    line_start_ = offset;
  }
  void close() { stream_.close(); }
  bool is_open() const { return stream_.is_open(); }
  int peek() {
    if (pos_ == len_ && !fill()) return EOF;
    return static_cast<unsigned char>(buf_[pos_]);
  }
  // Reads past a UTF-8 byte-order mark (EF BB BF) at the reader's position, where a file opens: its
  // first read holds the three bytes whenever the file does.
  void skip_bom() {
    if (peek() == 0xEF && len_ - pos_ >= 3 && std::memcmp(buf_.data() + pos_, "\xEF\xBB\xBF", 3) == 0)
      for (int i = 0; i < 3; ++i) get();
  }
  // A line ends at LF, CRLF or a lone CR (old Mac files, which CSV readers take): line() counts them
  // so, as an editor would number the lines.
  int get() {
    int c = peek();
    if (c != EOF) {
      ++pos_;
      if (c == '\n' || (c == '\r' && peek() != '\n')) {
        ++line_;
        line_start_ = offset();
      }
    }
    return c;
  }
  // Appends bytes up to and including the next '\n' (or EOF) to `out`; false at EOF.
  bool read_line(std::string& out) {
    bool any = false;
    while (true) {
      if (pos_ == len_ && !fill()) return any;
      any = true;
      const char* start = buf_.data() + pos_;
      auto* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
      size_t n = nl ? size_t(nl - start) + 1 : len_ - pos_;
      out.append(start, n);
      pos_ += n;
      if (nl) {
        ++line_;
        line_start_ = offset();
        return true;
      }
    }
  }
  void skip_whitespace() {
    for (int c = peek(); c == ' ' || c == '\t' || c == '\n' || c == '\r'; c = peek()) get();
  }
  uint64_t offset() const { return base_ + pos_; }
  uint64_t line() const { return line_; }
  // 1-based column (in bytes) of offset(); exact once a line start has been read past, which holds
  // for every position within a file read from its beginning or from a document start.
  uint64_t column() const { return offset() - line_start_ + 1; }

 private:
  bool fill() {
    base_ += len_;
    pos_ = 0;
    len_ = stream_.read(buf_.data(), buf_.size());
    return len_ > 0;
  }
  fs::path path_;
  TextStream stream_;
  std::vector<char> buf_ = std::vector<char>(1 << 20);
  size_t pos_ = 0, len_ = 0;
  uint64_t base_ = 0, line_ = 1, line_start_ = 0;
};

Format detect_format(const fs::path& path) {
  std::string ext = extension_of(path);
  if (ext == ".jsonl" || ext == ".ndjson") return Format::JsonLines;
  if (ext == ".csv" || ext == ".tsv") return Format::Csv;
  if (is_plain_text(path)) return Format::Text;
  check_readable_format(path);
  if (is_table_file(path)) return Format::Table;
  // A .json file holding an array is one; otherwise it is read as JSON Lines (HF style).
  Reader r;
  r.open(path, 0, 1);
  r.skip_bom();
  r.skip_whitespace();
  return r.peek() == '[' ? Format::JsonArray : Format::JsonLines;
}

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string_view chomp(std::string_view s) {
  if (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

// One record of a CSV (RFC 4180) or TSV file into `fields`, from the reader's position, read as
// Python's csv module (and so pandas and Hugging Face `datasets`) reads it: fields split at
// `delimiter`; a field opening with '"' is quoted, holds delimiters, newlines and '""' (one '"'),
// and ends at its closing quote, characters after which join the field as they are ("a"b is ab);
// the record ends at a newline outside quotes: LF, CRLF or a lone CR. False at the end of the file.
// `fail(line, what)` reports a malformed record: a quote never closed, a field over 64 MiB.
template <class Fail>
bool read_csv_record(Reader& r, char delimiter, std::vector<std::string>& fields, const Fail& fail) {
  constexpr size_t kMaxField = size_t(64) << 20;
  fields.clear();
  if (r.peek() == EOF) return false;
  fields.emplace_back();
  auto too_long = [&](uint64_t line, uint64_t column) {
    fail(line, "the field starting at column " + std::to_string(column) +
                   " runs past 64 MiB (a quote never closed, or not CSV)");
  };
  while (true) {
    std::string& field = fields.back();
    const uint64_t field_line = r.line(), field_column = r.column();
    int c = r.get();
    if (c == '"') {  // a quoted field
      while (true) {
        c = r.get();
        if (c == EOF)
          fail(field_line,
               "the quoted field opened at column " + std::to_string(field_column) + " is never closed");
        if (c == '"') {
          if (r.peek() != '"') break;
          r.get();  // "" is one quote
        }
        field += char(c);
        if (field.size() > kMaxField) too_long(field_line, field_column);
      }
      c = r.get();
    }
    while (c != delimiter && c != '\n' && c != '\r' && c != EOF) {
      field += char(c);
      if (field.size() > kMaxField) too_long(field_line, field_column);
      c = r.get();
    }
    if (c == '\r' && r.peek() == '\n') c = r.get();
    if (c != delimiter) return true;  // a newline or the end of the file ends the record
    fields.emplace_back();
  }
}

// A line with nothing but spaces and tabs is blank, as an empty one is (pandas skips both).
bool blank_record(const std::vector<std::string>& fields) {
  return fields.size() == 1 && fields[0].find_first_not_of(" \t") == std::string::npos;
}

char csv_delimiter(const fs::path& path) {
  return extension_of(path) == ".tsv" ? '\t' : ',';
}

// Reads past a CSV/TSV file's byte-order mark and header (its first non-blank record) into `header`.
template <class Fail>
void read_csv_header(Reader& r, char delimiter, std::vector<std::string>& header, const Fail& fail) {
  r.skip_bom();
  while (read_csv_record(r, delimiter, header, fail) && blank_record(header)) {
  }
}

}  // namespace

bool is_json_lines(const fs::path& file) {
  const std::string ext = extension_of(file);
  // Only a regular file is opened to look: a FIFO would be waited on, and a missing file is its
  // reader's error to name.
  return ext == ".jsonl" || ext == ".ndjson" ||
         (ext == ".json" && fs::is_regular_file(file) && detect_format(file) == Format::JsonLines);
}

struct DocumentStream::Impl {
  DatasetConfig config;
  std::vector<fs::path> files;
  std::vector<Format> formats;
  Reader reader;
  std::vector<size_t> csv_columns;  // per file: the index of a CSV/TSV file's text column in its header
  std::vector<size_t> csv_widths;   // per file: the header's field count
  std::vector<std::string> fields;  // the CSV record being read
  // The open file's text column, when it is a table file (Parquet, Arrow), or its conversations (chat_field)
  // and their tool signatures (a "tools" column, when it has one) as JSON.
  std::unique_ptr<ColumnReader> table, table_tools;
  nlohmann::ordered_json record;  // a table file's conversation: {chat_field: messages, "tools": ...}
  DocPosition pos;  // of the next element
  Stats stats;
  std::string raw;
  uint64_t at_column = 1;  // of the element next_raw() returned, for error positions

  [[noreturn]] void fail(uint64_t line, const std::string& what) const {
    TITAN_FAIL("dataset: ", files[pos.file].string(), ":", line, ": ", what);
  }

  void open_current() {
    if (pos.file >= files.size()) return;
    if (formats[pos.file] == Format::Table) {
      if (!table) {
        const bool chat = !config.chat_field.empty();
        table = open_column(files[pos.file], chat ? config.chat_field : config.text_field,
                            chat ? ColumnReader::Shape::Json : ColumnReader::Shape::Text);
        table->seek(pos.offset);
        const auto& columns = table->columns();
        if (chat && std::find(columns.begin(), columns.end(), "tools") != columns.end()) {
          table_tools = open_column(files[pos.file], "tools", ColumnReader::Shape::Json);
          table_tools->seek(pos.offset);
        }
      }
    } else if (!reader.is_open()) {
      reader.open(files[pos.file], pos.offset, pos.line);
    }
  }

  void finish_file() {
    reader.close();
    table.reset();
    table_tools.reset();
    pos = DocPosition{pos.file + 1, 0, 1, false};
  }

  // The text of a parsed JSON element: a string, or an object's text field.
  std::string element_text(const json& j, uint64_t line) const {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object()) {
      auto it = j.find(config.text_field);
      if (it == j.end()) {
        std::vector<std::string> fields;
        for (const auto& [key, value] : j.items()) fields.push_back(key);
        fail(line, "object has no field '" + config.text_field +
                       "' (training.text_field names the field to read; its fields are " +
                       quoted_names(fields) + ")");
      }
      if (!it->is_string()) fail(line, "field '" + config.text_field + "' is " + it->type_name() + ", not a string");
      return it->get<std::string>();
    }
    fail(line, std::string("expected a string or an object, got ") + j.type_name());
  }

  // A conversation record: its messages (and tools) rendered into `doc`.
  void element_chat(const nlohmann::ordered_json& j, uint64_t line, Document& doc) const {
    try {
      doc.chat = render_chat_record(j, config.chat_field);
    } catch (const Error& e) {
      fail(line, e.what());
    }
    doc.text = chat_text(doc.chat);
  }

  // Invalid UTF-8 in the strings of a record assembled from a table file (whose bytes no JSON parser
  // checked) replaced by U+FFFD; returns the replacements.
  static uint64_t sanitize_strings(nlohmann::ordered_json& j) {
    uint64_t invalid = 0;
    if (j.is_string()) {
      invalid += sanitize_utf8(j.get_ref<std::string&>());
    } else if (j.is_structured()) {
      for (auto& child : j) invalid += sanitize_strings(child);
    }
    return invalid;
  }

  // Parses one JSON element into `doc` (its text, and a conversation's pieces).
  void parse_element(std::string& bytes, uint64_t line, uint64_t column, uint64_t& invalid,
                     Document& doc) const {
    // Counted together: an unpaired surrogate escape is text no UTF-8 can hold, as an invalid byte is.
    invalid = sanitize_utf8(bytes) + repair_surrogate_escapes(bytes);
    // Conversations keep their objects' key order: the chat template writes tool arguments as given.
    auto parse = [&](auto& j) {
      try {
        j = std::remove_reference_t<decltype(j)>::parse(bytes);
      } catch (const json::parse_error& e) {
        const io::JsonErrorAt at = io::locate_json_error(bytes, e, line, column);
        // A .json that is not an array is read one value per line: a pretty-printed object is not.
        const bool lines_of_json =
            formats[pos.file] == Format::JsonLines && extension_of(files[pos.file]) == ".json";
        fail(at.line,
             "malformed JSON at column " + std::to_string(at.column) + ": " + at.what +
                 (lines_of_json ? " (a .json file holds one JSON array, or one JSON value per line)" : ""));
      } catch (const json::exception& e) {  // a number past double's range (1e400)
        std::string what = e.what();
        if (const size_t end = what.find("] ");
            what.rfind("[json.exception", 0) == 0 && end != std::string::npos)
          what = what.substr(end + 2);
        fail(line, "invalid JSON: " + what);
      }
    };
    if (config.chat_field.empty()) {
      json j;
      parse(j);
      doc.text = element_text(j, line);
      doc.chat.clear();
    } else {
      nlohmann::ordered_json j;
      parse(j);
      element_chat(j, line, doc);
    }
  }

  // Copies one JSON value (already positioned at its first byte) into `raw`. Brackets are matched as
  // they are read: one that closes nothing, or another kind than the one open, is an error where it
  // stands (else the rest of the file would be read into the value, to fail at its end).
  void scan_json_value(uint64_t line) {
    raw.clear();
    std::string open;  // the brackets open, innermost last
    bool in_string = false, escape = false;
    while (true) {
      int c = reader.peek();
      if (c == EOF) fail(line, "JSON array ends inside a value");
      if (in_string) {
        reader.get();
        raw += char(c);
        if (escape) {
          escape = false;
        } else if (c == '\\') {
          escape = true;
        } else if (c == '"') {
          in_string = false;
          if (open.empty()) return;
        }
        continue;
      }
      if (open.empty() && !raw.empty() &&
          (c == ',' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t'))
        return;  // end of a scalar
      if ((c == ']' || c == '}') && (open.empty() || open.back() != (c == ']' ? '[' : '{')))
        fail(reader.line(),
             std::string("unexpected '") + char(c) + "' at column " + std::to_string(reader.column()) +
                 (open.empty() ? std::string(": it closes no bracket of this array element")
                               : std::string(": the bracket open here is '") + open.back() + "'"));
      reader.get();
      raw += char(c);
      if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        open += char(c);
      } else if (c == ']' || c == '}') {
        open.pop_back();
        if (open.empty()) return;
      }
    }
  }

  // Next element of the current file, or false at its end. `raw` holds its bytes;
  // `at` its position.
  bool next_raw(DocPosition& at, Format format) {
    if (format == Format::Table) {  // a row's text column; the position counts rows
      at = DocPosition{pos.file, table->row(), table->row() + 1, false};
      if (!config.chat_field.empty()) {  // a row's conversation, into `record`
        nlohmann::ordered_json messages, tools;
        if (!table->next_json(messages)) return false;
        record = nlohmann::ordered_json::object();
        record[config.chat_field] = std::move(messages);
        if (table_tools) {
          TITAN_CHECK(table_tools->next_json(tools), "dataset: ", files[pos.file].string(),
                      ": its tools column ends before its rows");
          if (!tools.is_null()) record["tools"] = std::move(tools);  // a row without tools has none
        }
        return true;
      }
      bool null = false;
      if (!table->next(raw, null)) return false;
      if (null)
        fail(at.line, "row " + std::to_string(at.line) + "'s column '" + config.text_field +
                          "' is null, not a string");
      return true;
    }
    if (format == Format::Csv) {  // a record's text field; the header is read past at the file's start
      const char delimiter = csv_delimiter(files[pos.file]);
      auto fail_at = [&](uint64_t line, const std::string& what) { fail(line, what); };
      if (reader.offset() == 0) read_csv_header(reader, delimiter, fields, fail_at);
      while (true) {
        at = DocPosition{pos.file, reader.offset(), reader.line(), false};
        if (!read_csv_record(reader, delimiter, fields, fail_at)) return false;
        if (blank_record(fields)) continue;
        if (fields.size() != csv_widths[pos.file])
          fail(at.line, "the record has " + std::to_string(fields.size()) + " fields, the header " +
                            std::to_string(csv_widths[pos.file]) +
                            " (a field holding the delimiter or a newline must be quoted)");
        raw.swap(fields[csv_columns[pos.file]]);
        return true;
      }
    }
    if (format == Format::JsonArray) {
      if (!pos.in_array) {
        reader.skip_bom();
        reader.skip_whitespace();
        if (reader.get() != '[') fail(reader.line(), "expected a JSON array");
        pos.in_array = true;
      }
      reader.skip_whitespace();
      int c = reader.peek();
      if (c == ']') {
        reader.get();
        reader.skip_whitespace();
        if (reader.peek() != EOF) fail(reader.line(), "data after the end of the JSON array");
        return false;
      }
      // An unclosed array is named where the file ends: the line and column the ']' was missed at.
      const auto unclosed = [&] {
        fail(reader.line(), "JSON array is not closed with ']' (the file ends at column " +
                                std::to_string(reader.column()) + ")");
      };
      if (c == EOF) unclosed();
      at = DocPosition{pos.file, reader.offset(), reader.line(), true};
      at_column = reader.column();
      scan_json_value(at.line);
      reader.skip_whitespace();
      c = reader.peek();
      if (c == ',') {
        const uint64_t comma_line = reader.line(), comma_column = reader.column();
        reader.get();
        reader.skip_whitespace();
        if (reader.peek() == ']')
          fail(comma_line, "trailing comma at column " + std::to_string(comma_column) +
                               " before ']' (JSON allows no comma after the last element)");
      } else if (c == EOF) {
        unclosed();
      } else if (c != ']') {
        const std::string got =
            c >= 0x20 && c < 0x7f ? "'" + std::string(1, char(c)) + "'" : "byte " + std::to_string(c);
        fail(reader.line(), "unexpected " + got + " at column " + std::to_string(reader.column()) +
                                ": expected ',' or ']' after an array element" +
                                (c == '}' ? " (a bracket too many?)" : ""));
      }
      return true;
    }
    while (true) {
      at = DocPosition{pos.file, reader.offset(), reader.line(), false};
      raw.clear();
      if (!reader.read_line(raw)) return false;
      if (format == Format::JsonLines || config.text_split == "line") {
        if (blank(raw)) continue;
        raw.resize(chomp(raw).size());
        return true;
      }
      if (config.text_split == "file") {
        while (reader.read_line(raw)) {
        }
        return true;
      }
      if (blank(raw)) continue;
      // A paragraph: lines up to the next blank line (or the end of the file).
      std::string line;
      while (true) {
        line.clear();
        if (!reader.read_line(line) || blank(line)) break;
        raw += line;
      }
      raw.resize(chomp(raw).size());
      return true;
    }
  }

  bool next(Document& doc) {
    while (pos.file < files.size()) {
      open_current();
      Format format = formats[pos.file];
      DocPosition at;
      at_column = 1;
      if (!next_raw(at, format)) {
        finish_file();
        continue;
      }
      if (format == Format::Table) {
        pos.offset = table->row();
        pos.line = pos.offset + 1;
      } else {
        pos.offset = reader.offset();
        pos.line = reader.line();
      }
      uint64_t invalid = 0;
      if (format == Format::Table && !config.chat_field.empty()) {
        invalid = sanitize_strings(record);
        element_chat(record, at.line, doc);
      } else if (format == Format::Text || format == Format::Table || format == Format::Csv) {
        // The byte-order mark some editors open UTF-8 files with is not text to train on (the JSON
        // readers skip it too).
        if (format == Format::Text && at.offset == 0 && raw.compare(0, 3, "\xEF\xBB\xBF") == 0)
          raw.erase(0, 3);
        invalid = sanitize_utf8(raw);
        doc.text.swap(raw);
        doc.chat.clear();
      } else {
        parse_element(raw, at.line, at_column, invalid, doc);
      }
      check_document_is_text(doc.text, files[pos.file], at.line);
      if (doc.text.empty()) {
        ++stats.empty_skipped;
        continue;
      }
      if (invalid > 0 &&
          first_warning_of(files[pos.file], "invalid UTF-8")) {  // at the first, not when the file ends
        std::fprintf(stderr,
                     "warning: dataset %s:%llu: invalid UTF-8 replaced by U+FFFD (%llu sequence(s) in this "
                     "document; one warning per file)\n",
                     files[pos.file].c_str(), static_cast<unsigned long long>(at.line),
                     static_cast<unsigned long long>(invalid));
      }
      stats.invalid_utf8 += invalid;
      ++stats.documents;
      doc.position = at;
      return true;
    }
    return false;
  }
};

DocumentStream::DocumentStream(DatasetConfig config) : impl_(std::make_unique<Impl>()) {
  TITAN_CHECK(config.text_split == "paragraph" || config.text_split == "line" || config.text_split == "file",
              "dataset: text_split '", config.text_split, "' is not one of paragraph, line, file");
  impl_->files = list_dataset_files(config.paths);
  for (auto& f : impl_->files) {
    impl_->formats.push_back(detect_format(f));
    TITAN_CHECK(config.chat_field.empty() || impl_->formats.back() != Format::Text, "dataset: ", f.string(),
                " is plain text, but conversations (chat_field '", config.chat_field,
                "') are read from JSON records (.json, .jsonl, .ndjson), Parquet and Arrow files");
    TITAN_CHECK(config.chat_field.empty() || impl_->formats.back() != Format::Csv, "dataset: ", f.string(),
                " is CSV, but conversations (chat_field '", config.chat_field,
                "') are read from JSON records (.json, .jsonl, .ndjson), Parquet and Arrow files");
    // A CSV file's header names its columns: the text column is found now, before any compute.
    size_t csv_column = 0, csv_width = 0;
    if (impl_->formats.back() == Format::Csv) {
      Reader r;
      r.open(f, 0, 1);
      std::vector<std::string> header;
      read_csv_header(r, csv_delimiter(f), header, [&](uint64_t line, const std::string& what) {
        TITAN_FAIL("dataset: ", f.string(), ":", line, ": ", what);
      });
      TITAN_CHECK(!header.empty() && !blank_record(header), "dataset: ", f.string(),
                  " has no header row (a CSV file's first row names its columns)");
      const auto it = std::find(header.begin(), header.end(), config.text_field);
      if (it == header.end()) {
        TITAN_FAIL("dataset: ", f.string(), ": its header has no column '", config.text_field,
                   "' (training.text_field names the column to read; its columns are ", quoted_names(header),
                   ")");
      }
      csv_column = size_t(it - header.begin());
      csv_width = header.size();
    }
    impl_->csv_columns.push_back(csv_column);
    impl_->csv_widths.push_back(csv_width);
    // Opened now, so that a missing column or an unreadable codec is said before any compute.
    if (impl_->formats.back() == Format::Table) {
      if (config.chat_field.empty()) {
        open_column(f, config.text_field, ColumnReader::Shape::Text);
      } else {
        const auto messages = open_column(f, config.chat_field, ColumnReader::Shape::Json);
        const auto& columns = messages->columns();
        if (std::find(columns.begin(), columns.end(), "tools") != columns.end())
          open_column(f, "tools", ColumnReader::Shape::Json);
      }
    }
  }
  impl_->config = std::move(config);
}

DocumentStream::~DocumentStream() = default;

bool DocumentStream::next(Document& doc) { return impl_->next(doc); }
DocPosition DocumentStream::position() const { return impl_->pos; }

void DocumentStream::seek(const DocPosition& position) {
  TITAN_CHECK(position.file <= impl_->files.size(), "dataset: position names file ", position.file, " but only ",
              impl_->files.size(), " files are listed");
  impl_->reader.close();
  impl_->table.reset();
  impl_->table_tools.reset();
  impl_->pos = position;
}

const std::vector<fs::path>& DocumentStream::files() const { return impl_->files; }
const DocumentStream::Stats& DocumentStream::stats() const { return impl_->stats; }

}  // namespace titan::data
