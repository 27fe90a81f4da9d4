#include "titan/data/column_reader.h"

#include <cctype>

#include "titan/data/arrow_ipc.h"
#include "titan/data/parquet.h"

namespace titan::data {

namespace {
std::string lower_extension(const std::filesystem::path& file) {
  std::string ext = file.extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}
}  // namespace

bool is_table_file(const std::filesystem::path& file) {
  const std::string ext = lower_extension(file);
  return ext == ".parquet" || ext == ".arrow";
}

std::unique_ptr<ColumnReader> open_column(const std::filesystem::path& file, const std::string& column,
                                          ColumnReader::Shape shape) {
  if (lower_extension(file) == ".arrow") return std::make_unique<ArrowColumn>(file, column, shape);
  return std::make_unique<ParquetColumn>(file, column, shape);
}

}  // namespace titan::data
