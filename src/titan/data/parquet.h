#pragma once
// One column of an Apache Parquet file (the format Hugging Face datasets are stored in), read row by
// row: a text column as strings, or a nested one (a conversation's list of message structs) as the
// JSON each row holds. The footer's schema finds the column; its leaves' column chunks in each row
// group are then read page by page, so only that column's bytes are read and only one decompressed
// page per leaf (and the row group's dictionary) is in memory: a file larger than memory works.
// Read (docs/data.md, "Parquet"): data pages v1 and v2; strings PLAIN, dictionary-encoded,
// DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY, and in nested columns integers, floats and booleans
// too; uncompressed, Snappy, gzip, zstd, Brotli and LZ4_RAW pages; page CRCs are checked where the
// writer stored them. Anything else (an encrypted file, a map, a text column that is not strings,
// another codec) is an error naming the file and the rule, said when the file is opened; a file
// built to exhaust memory or the stack is an error too (caps on counts, sizes and nesting).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "titan/data/column_reader.h"

namespace titan::data {

class ParquetColumn final : public ColumnReader {
 public:
  // Opens `file` and finds its top-level column `column`. A file that is not Parquet, a truncated
  // footer, a missing column (the error lists the columns there are), a column not of `shape` (a
  // nested, repeated or non-string one for Text; a map or a non-string leaf for Json), or a codec
  // titan cannot decompress is an error naming the file.
  ParquetColumn(const std::filesystem::path& file, const std::string& column, Shape shape = Shape::Text);
  ~ParquetColumn() override;
  ParquetColumn(const ParquetColumn&) = delete;
  ParquetColumn& operator=(const ParquetColumn&) = delete;

  uint64_t rows() const override;
  uint64_t row() const override;
  // Pages before the row are passed over by their headers where they give their row count, unread.
  void seek(uint64_t row) override;
  // A corrupted page is an error naming the file, the column, the row group and the page's offset.
  bool next(std::string& value, bool& null) override;
  bool next_json(nlohmann::ordered_json& value) override;
  const std::vector<std::string>& columns() const override;

  // What the pages read so far were (those a seek passed over by their headers are not counted):
  // which of the format's options a writer used, for tests and diagnostics.
  struct Layout {
    std::set<std::string> codecs, encodings;  // as the format names them: "ZSTD", "RLE_DICTIONARY"
    uint64_t dictionary_pages = 0, v1_pages = 0, v2_pages = 0;
    uint64_t row_groups = 0;  // entered
  };
  const Layout& layout() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
