# The compressed-dataset tests write their gzip shards with zlib.
target_link_libraries(dataset_test PRIVATE ZLIB::ZLIB)
target_link_libraries(loader_test PRIVATE ZLIB::ZLIB)
