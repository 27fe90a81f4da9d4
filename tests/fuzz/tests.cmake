# libFuzzer targets for the parsers of untrusted files (tests/fuzz/), each run briefly as a CTest
# case: the safetensors header parser, the dataset table readers (Parquet, Arrow IPC), the config
# parsers (job TOML, overrides, config.json), the tokenizer (encode / decode) and the chat renderer.
# They need
# clang with libFuzzer (Debian: clang + libclang-rt-14-dev); without them the targets are skipped
# with a message, and the deterministic tests of those parsers still run. Built by custom commands
# because the rest of the project may use g++.
option(TITAN_FUZZ "Build and run the libFuzzer targets of the file parsers (needs clang)" ON)
set(TITAN_FUZZ_SECONDS 15 CACHE STRING "Seconds each fuzz CTest case fuzzes")

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

  # titan_fuzzer(NAME TEST SOURCES ... HEADERS ... DEFINES ... LIBS ... SEEDS ... MAX_LEN N): the
  # libFuzzer program bin/NAME from tests/fuzz/NAME.cpp and the titan SOURCES it parses with
  # (HEADERS: what else rebuilds it), compiled with DEFINES, linked with LIBS, and the CTest case
  # TEST fuzzing it for TITAN_FUZZ_SECONDS from the committed SEEDS folders (read-only: new corpus
  # entries go to a scratch folder).
  function(titan_fuzzer name)
    cmake_parse_arguments(F "" "TEST;MAX_LEN" "SOURCES;HEADERS;DEFINES;LIBS;SEEDS" ${ARGN})
    set(_fuzzer ${PROJECT_BINARY_DIR}/bin/${name})
    set(_sources ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}.cpp)
    foreach(s ${F_SOURCES})
      list(APPEND _sources ${PROJECT_SOURCE_DIR}/src/titan/${s})
    endforeach()
    set(_headers)
    foreach(h ${F_HEADERS})
      list(APPEND _headers ${PROJECT_SOURCE_DIR}/src/titan/${h})
    endforeach()
    set(_libs)
    foreach(l ${F_LIBS})
      list(APPEND _libs -l${l})
    endforeach()
    set(_defines)
    foreach(d ${F_DEFINES})
      list(APPEND _defines -D${d})
    endforeach()
    add_custom_command(
      OUTPUT ${_fuzzer}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/bin
      COMMAND ${TITAN_CLANGXX} -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
              -Wno-unknown-pragmas ${_defines} -I${PROJECT_SOURCE_DIR}/src ${_sources} ${_libs} -o ${_fuzzer}
      DEPENDS ${_sources} ${_headers}
      COMMENT "Building libFuzzer target ${name} with ${TITAN_CLANGXX}"
      VERBATIM)
    add_custom_target(${name} ALL DEPENDS ${_fuzzer})
    set(_corpus ${PROJECT_BINARY_DIR}/test_tmp/${name}_corpus)
    set(_run "rm -rf '${_corpus}' && mkdir -p '${_corpus}' && exec '${_fuzzer}'")
    string(APPEND _run " -max_total_time=${TITAN_FUZZ_SECONDS} -rss_limit_mb=2048 -max_len=${F_MAX_LEN}")
    string(APPEND _run " -print_final_stats=1 -artifact_prefix='${_corpus}/' '${_corpus}'")
    foreach(seeds ${F_SEEDS})
      string(APPEND _run " '${PROJECT_SOURCE_DIR}/${seeds}'")
    endforeach()
    add_test(NAME ${F_TEST} COMMAND sh -c "${_run}")
    set_tests_properties(${F_TEST} PROPERTIES TIMEOUT 300)
  endfunction()

  if(_fuzz_ok)
    titan_fuzzer(safetensors_header_fuzzer TEST safetensors_header_fuzz MAX_LEN 4096
      SOURCES io/safetensors.cpp io/atomic_file.cpp core/check.cpp core/dtype.cpp
      HEADERS io/safetensors.h io/atomic_file.h core/check.h core/dtype.h
      SEEDS tests/fixtures/io/fuzz_seeds)
    titan_fuzzer(table_file_fuzzer TEST table_file_fuzz MAX_LEN 65536
      SOURCES data/parquet.cpp data/arrow_ipc.cpp data/table_file.cpp data/column_reader.cpp core/check.cpp
              core/suggest.cpp
      HEADERS data/parquet.h data/arrow_ipc.h data/table_file.h data/column_reader.h core/check.h core/suggest.h
      LIBS brotlidec lz4 snappy z zstd
      SEEDS tests/fixtures/parquet_crafted tests/fixtures/arrow_crafted tests/fixtures/arrow_compressed)
    titan_fuzzer(config_fuzzer TEST config_fuzz MAX_LEN 8192
      SOURCES train/job_config.cpp train/torchtitan_keys.cpp models/qwen3/args.cpp models/qwen3/size_check.cpp
              io/json_error.cpp io/path_guard.cpp core/check.cpp core/glob.cpp core/parse.cpp core/suggest.cpp
              core/host_memory.cpp core/cgroup.cpp data/assets.cpp
      HEADERS train/job_config.h train/torchtitan_keys.h models/qwen3/args.h models/qwen3/size_check.h data/assets.h
              io/json_error.h io/path_guard.h core/check.h core/glob.h core/parse.h core/suggest.h
              core/host_memory.h core/cgroup.h dist/communicator.h core/device_services.h core/dtype.h core/check.h
              kernels/substitution.h
      # toml++ as titan links it (Debian's release build of the library, not compiled in here): its
      # header-only debug build asserts on malformed table headers such as "[[[1]]]" (a precondition
      # the release build only assumes and reports as a parse error; toml++ pull request 301).
      DEFINES TOML_HEADER_ONLY=0 TOML_SHARED_LIB=1
      LIBS tomlplusplus
      SEEDS tests/fixtures/config_fuzz_seeds)
    titan_fuzzer(tokenizer_fuzzer TEST tokenizer_fuzz MAX_LEN 4096
      SOURCES data/tokenizer.cpp data/utf8.cpp data/assets.cpp io/json_error.cpp io/path_guard.cpp core/check.cpp
      HEADERS data/tokenizer.h data/utf8.h data/assets.h io/json_error.h io/path_guard.h core/check.h
      LIBS pcre2-8 icuuc
      SEEDS tests/fixtures/tokenizer_fuzz_seeds)
    titan_fuzzer(chat_fuzzer TEST chat_fuzz MAX_LEN 4096
      SOURCES data/chat.cpp data/tokenizer.cpp data/utf8.cpp data/assets.cpp io/json_error.cpp io/path_guard.cpp
              core/check.cpp core/suggest.cpp
      HEADERS data/chat.h data/tokenizer.h data/utf8.h data/assets.h io/json_error.h io/path_guard.h core/check.h
              core/suggest.h
      LIBS pcre2-8 icuuc
      SEEDS tests/fixtures/chat_fuzz_seeds)
  else()
    message(STATUS "libFuzzer targets skipped: no clang++ with -fsanitize=fuzzer "
                   "(install Debian packages clang and libclang-rt-14-dev)")
  endif()
endif()
