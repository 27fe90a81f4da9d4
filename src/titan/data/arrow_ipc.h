#pragma once
// One column of an Apache Arrow IPC file (`.arrow`): what Hugging Face `datasets` writes with
// `save_to_disk` (data-00000-of-00001.arrow) and keeps in its cache, in Arrow's streaming format;
// the random-access file format ("Feather v2", ARROW1 magic) reads too. Record batches are read one
// at a time, and of each only the column's buffers: a file larger than memory works. Read: a
// top-level Utf8 / LargeUtf8 column (Text), or lists, structs, strings, integers and booleans of a
// nested one (Json: conversations). Refused with an error naming the file and the rule: a
// dictionary-encoded or big-endian column, compressed record batches, another type.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "titan/data/column_reader.h"

namespace titan::data {

class ArrowColumn final : public ColumnReader {
 public:
  // Opens `file` and finds its top-level column `column`, reading the schema and every record
  // batch's header (not its body) to count the rows.
  ArrowColumn(const std::filesystem::path& file, const std::string& column, Shape shape = Shape::Text);
  ~ArrowColumn() override;
  ArrowColumn(const ArrowColumn&) = delete;
  ArrowColumn& operator=(const ArrowColumn&) = delete;

  uint64_t rows() const override;
  uint64_t row() const override;
  void seek(uint64_t row) override;  // to the row's batch, whose column is read then
  bool next(std::string& value, bool& null) override;
  bool next_json(nlohmann::ordered_json& value) override;
  const std::vector<std::string>& columns() const override;
  uint64_t batches() const;  // record batches in the file

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
