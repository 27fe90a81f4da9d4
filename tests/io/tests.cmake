# libFuzzer target for the safetensors parser (tests/fuzz/), run briefly as a CTest case.
# It needs clang with libFuzzer (Debian: clang + libclang-rt-14-dev); without them the target is
# skipped with a message and the deterministic mutation test (safetensors_fuzz_test) still runs.
# Built by a custom command because the rest of the project may use g++.
option(TITAN_FUZZ "Build and run the libFuzzer target for the safetensors parser (needs clang)" ON)
set(TITAN_FUZZ_SECONDS 15 CACHE STRING "Seconds the safetensors_header_fuzz CTest case fuzzes")

if(TITAN_FUZZ)
  find_program(TITAN_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
  set(_fuzz_ok FALSE)
  if(TITAN_CLANGXX)
    set(_probe_dir ${PROJECT_BINARY_DIR}/fuzz_probe)
    file(WRITE ${_probe_dir}/probe.cpp
      "#include <cstdint>\n#include <cstddef>\n"
      "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(
      COMMAND ${TITAN_CLANGXX} -fsanitize=fuzzer,address,undefined ${_probe_dir}/probe.cpp
              -o ${_probe_dir}/probe
      RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_QUIET)
    if(_probe_rc EQUAL 0)
      set(_fuzz_ok TRUE)
    endif()
  endif()

  if(_fuzz_ok)
    set(_fuzzer ${PROJECT_BINARY_DIR}/bin/safetensors_header_fuzzer)
    set(_fuzz_sources
      ${PROJECT_SOURCE_DIR}/tests/fuzz/safetensors_header_fuzzer.cpp
      ${PROJECT_SOURCE_DIR}/src/titan/io/safetensors.cpp
      ${PROJECT_SOURCE_DIR}/src/titan/io/atomic_file.cpp
      ${PROJECT_SOURCE_DIR}/src/titan/core/check.cpp
      ${PROJECT_SOURCE_DIR}/src/titan/core/dtype.cpp)
    set(_fuzz_headers
      ${PROJECT_SOURCE_DIR}/src/titan/io/safetensors.h
      ${PROJECT_SOURCE_DIR}/src/titan/io/atomic_file.h
      ${PROJECT_SOURCE_DIR}/src/titan/core/check.h
      ${PROJECT_SOURCE_DIR}/src/titan/core/dtype.h)
    add_custom_command(
      OUTPUT ${_fuzzer}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/bin
      COMMAND ${TITAN_CLANGXX} -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
              -Wno-unknown-pragmas -I${PROJECT_SOURCE_DIR}/src ${_fuzz_sources} -o ${_fuzzer}
      DEPENDS ${_fuzz_sources} ${_fuzz_headers}
      COMMENT "Building libFuzzer target safetensors_header_fuzzer with ${TITAN_CLANGXX}"
      VERBATIM)
    add_custom_target(safetensors_header_fuzzer ALL DEPENDS ${_fuzzer})

    # New corpus entries go to a scratch folder in the build tree; the committed seeds stay read-only.
    set(_corpus ${PROJECT_BINARY_DIR}/test_tmp/safetensors_fuzz_corpus)
    set(_fuzz_run "rm -rf '${_corpus}' && mkdir -p '${_corpus}' && exec '${_fuzzer}'")
    string(APPEND _fuzz_run " -max_total_time=${TITAN_FUZZ_SECONDS} -rss_limit_mb=2048 -max_len=4096")
    string(APPEND _fuzz_run " -print_final_stats=1 -artifact_prefix='${_corpus}/'")
    string(APPEND _fuzz_run " '${_corpus}' '${PROJECT_SOURCE_DIR}/tests/fixtures/io/fuzz_seeds'")
    add_test(NAME safetensors_header_fuzz COMMAND sh -c "${_fuzz_run}")
    set_tests_properties(safetensors_header_fuzz PROPERTIES TIMEOUT 300)
  else()
    message(STATUS "safetensors libFuzzer target skipped: no clang++ with -fsanitize=fuzzer "
                   "(install Debian packages clang and libclang-rt-14-dev)")
  endif()
endif()
