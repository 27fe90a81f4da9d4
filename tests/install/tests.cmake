# `cmake --install` into a temporary prefix, then examples/train_debugmodel configured, built and
# run against it (find_package(titan) + titan::titan): the library is usable from another project.
add_test(NAME install_and_build_example
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/install_test.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                 ${PROJECT_BINARY_DIR}/test_tmp/install_example ${CMAKE_CXX_COMPILER})
set_tests_properties(install_and_build_example PROPERTIES TIMEOUT 600)
