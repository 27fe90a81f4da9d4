// libFuzzer target for the safetensors parser (header length, UTF-8, JSON, entries, offsets).
// Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/tests.cmake and run for a few
// seconds by ctest (safetensors_header_fuzz). Run longer by hand:
//   build/bin/safetensors_header_fuzzer -max_total_time=600 CORPUS_DIR tests/fixtures/io/fuzz_seeds
// Any input must either parse into a self-consistent file or throw titan::Error; anything else
// (a crash, a sanitizer report, another exception, an inconsistent result) is a finding.
#include <cstdint>
#include <cstdlib>

#include "titan/core/check.h"
#include "titan/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan::io;
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    ParsedSafetensors p = parse_safetensors(file, "fuzz-input");
    size_t expect = 0;
    for (const TensorInfo& t : p.tensors) {
      if (t.offset_begin != expect || t.data != file.data() + 8 + p.header_bytes + t.offset_begin ||
          uint64_t(t.numel()) * titan::dtype_size(t.dtype) != t.nbytes())
        std::abort();
      expect = t.offset_end;
    }
    if (8 + p.header_bytes + expect != size) std::abort();
  } catch (const titan::Error&) {
  }
  return 0;
}
