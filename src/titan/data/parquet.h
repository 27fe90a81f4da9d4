#pragma once
// One text column of an Apache Parquet file (the format Hugging Face datasets are stored in), read
// row by row. The footer's schema finds the column; its column chunk in each row group is then read
// page by page, so only that column's bytes are read and only one decompressed page (and the row
// group's dictionary) is in memory: a file larger than memory works. What is read is what the
// Parquet format allows for a string column (docs/data.md, "Parquet"): data pages v1 and v2; PLAIN,
// dictionary, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY values; uncompressed, Snappy, gzip,
// zstd, Brotli and LZ4_RAW pages; page CRCs are checked where the writer stored them. Anything else
// (an encrypted file, a nested or non-string column, another codec) is an error naming the file and
// the rule, said when the file is opened.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

namespace titan::data {

class ParquetColumn {
 public:
  // Opens `file` and finds its top-level column `column`. A file that is not Parquet, a truncated
  // footer, a missing column (the error lists the columns there are), a nested, repeated or
  // non-string column, or a codec titan cannot decompress is an error naming the file.
  ParquetColumn(const std::filesystem::path& file, const std::string& column);
  ~ParquetColumn();
  ParquetColumn(const ParquetColumn&) = delete;
  ParquetColumn& operator=(const ParquetColumn&) = delete;

  uint64_t rows() const;  // in the whole file
  uint64_t row() const;   // the row the next call to next() reads (0-based)
  // Positions at `row` (at most rows()): pages before it are skipped by their headers, unread.
  void seek(uint64_t row);
  // The next row's value into `value` (its bytes as stored); `null` says the row holds no value.
  // False at the end of the file. A corrupted page is an error naming the file, the row group and
  // the page's byte offset.
  bool next(std::string& value, bool& null);

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
