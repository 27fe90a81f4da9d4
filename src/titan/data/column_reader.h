#pragma once
// A column of a table file (Parquet, Arrow IPC) read row by row: what a dataset reads from the file
// formats that store records as columns. A text column gives one string per row; a nested column (a
// conversation's list of message structs) the JSON each row holds.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace titan::data {

class ColumnReader {
 public:
  // Text: one string per row (next()). Json: lists and structs of strings, each row as JSON
  // (next_json()): a list is an array, a struct an object keyed by its fields, a null null.
  enum class Shape { Text, Json };
  virtual ~ColumnReader() = default;

  virtual uint64_t rows() const = 0;    // in the whole file
  virtual uint64_t row() const = 0;     // the row the next call to next() reads (0-based)
  virtual void seek(uint64_t row) = 0;  // at most rows()
  // A Text column's next row: its bytes into `value`; `null` says it holds none. False at the end.
  virtual bool next(std::string& value, bool& null) = 0;
  // A Json column's next row; false at the end of the file.
  virtual bool next_json(nlohmann::ordered_json& value) = 0;
  // The file's top-level columns, in schema order.
  virtual const std::vector<std::string>& columns() const = 0;
};

// Whether the file's name makes it a table file (.parquet, .arrow).
bool is_table_file(const std::filesystem::path& file);

// The reader of `column` in `file`, by the file's format (its extension). An error names the file
// and the rule broken when the file or the column cannot be read as `shape`.
std::unique_ptr<ColumnReader> open_column(const std::filesystem::path& file, const std::string& column,
                                          ColumnReader::Shape shape);

}  // namespace titan::data
