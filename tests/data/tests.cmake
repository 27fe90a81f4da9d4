# The compressed-dataset tests write their gzip shards with zlib and their zstd shards with libzstd.
target_link_libraries(dataset_test PRIVATE ZLIB::ZLIB zstd::libzstd_shared)
target_link_libraries(loader_test PRIVATE ZLIB::ZLIB)
# tokenize --chat reads a gzipped file as training does.
target_link_libraries(tokenize_cmd_test PRIVATE ZLIB::ZLIB zstd::libzstd_shared)
# The checksum test computes its pages' CRC-32 with zlib.
target_link_libraries(table_files_test PRIVATE ZLIB::ZLIB)
