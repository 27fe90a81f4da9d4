if(TITAN_CUDA)
  # cuda_cudnn_graph_test asks cuDNN's heuristics about our attention graphs without a GPU:
  # cuDNN's runtime-compiled engines want a CUDA driver library to load first, so on a machine
  # without one the test loads this stand-in (tests/backend/fake_cuda_driver.c) by its path.
  add_library(fake_cuda_driver SHARED ${CMAKE_CURRENT_SOURCE_DIR}/backend/fake_cuda_driver.c)
  set_target_properties(fake_cuda_driver PROPERTIES OUTPUT_NAME cuda PREFIX lib SUFFIX .so.1 NO_SONAME OFF
                        LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests/fake_cuda_driver)
  add_dependencies(cuda_cudnn_graph_test fake_cuda_driver)
  target_compile_definitions(cuda_cudnn_graph_test PRIVATE
    TITAN_FAKE_CUDA_DRIVER="$<TARGET_FILE:fake_cuda_driver>")
endif()
