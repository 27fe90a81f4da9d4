// libFuzzer target for the table readers of datasets (data/parquet.h, data/arrow_ipc.h): every input
// is read as a Parquet file and as an Arrow IPC file, each column asked as text and as nested JSON,
// rows read, a seek to the middle. Built with clang -fsanitize=fuzzer,address,undefined by
// tests/fuzz/tests.cmake and run for a few seconds by ctest (table_file_fuzz), from the crafted
// fixtures. Run longer by hand:
//   build/bin/table_file_fuzzer -max_total_time=600 CORPUS_DIR tests/fixtures/parquet_crafted \
//       tests/fixtures/arrow_crafted tests/fixtures/arrow_compressed
// Any input must read or throw titan::Error; anything else (a crash, a sanitizer report, another
// exception, memory past -rss_limit_mb) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "titan/core/check.h"
#include "titan/data/arrow_ipc.h"
#include "titan/data/parquet.h"

namespace {

using titan::data::ColumnReader;

// The readers open files (they read at offsets, by the footers): the input goes to one in memory.
std::string write_input(const uint8_t* data, size_t size, const char* extension) {
  const std::string file = "/dev/shm/titan_table_fuzz_" + std::to_string(getpid()) + extension;
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return file;
}

template <class Reader>
void read_columns(const std::string& file) {
  for (const ColumnReader::Shape shape : {ColumnReader::Shape::Text, ColumnReader::Shape::Json})
    for (const char* column : {"text", "messages", "conversations", "a"}) {
      try {
        Reader r(file, column, shape);
        std::string value;
        bool null = false;
        nlohmann::ordered_json row;
        auto next = [&] {
          return shape == ColumnReader::Shape::Text ? r.next(value, null) : r.next_json(row);
        };
        for (int i = 0; i < 64 && next(); ++i) {
        }
        if (r.rows() > 1) {
          r.seek(r.rows() / 2);
          next();
        }
      } catch (const titan::Error&) {
      }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string parquet = write_input(data, size, ".parquet"), arrow = write_input(data, size, ".arrow");
  read_columns<titan::data::ParquetColumn>(parquet);
  read_columns<titan::data::ArrowColumn>(arrow);
  std::remove(parquet.c_str());
  std::remove(arrow.c_str());
  return 0;
}
