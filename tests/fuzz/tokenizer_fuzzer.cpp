// libFuzzer target for the tokenizer (data/tokenizer.h) with the real Qwen3 tokenizer.json (assets/,
// fetched by scripts/setup.sh): any bytes encode, and what the header promises holds for them: every
// id is one decode() accepts, the tokens' bytes concatenated are normalize(text) (invalid UTF-8
// replaced by U+FFFD, NFC between added tokens), and decode(ids) gives that text back. Built with
// clang -fsanitize=fuzzer,address,undefined by tests/fuzz/tests.cmake and run for a few seconds by
// ctest (tokenizer_fuzz) from tests/fixtures/tokenizer_fuzz_seeds. Run longer by hand:
//   build/bin/tokenizer_fuzzer -max_total_time=600 CORPUS_DIR tests/fixtures/tokenizer_fuzz_seeds
// A broken promise aborts naming it; an exception or a sanitizer report is a finding too.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/assets.h"
#include "titan/data/tokenizer.h"

namespace {

const titan::data::Tokenizer& tokenizer() {
  static const titan::data::Tokenizer t = titan::data::Tokenizer::load(titan::data::default_tokenizer_path());
  return t;
}

[[noreturn]] void broken(const char* promise) {
  std::fprintf(stderr, "tokenizer_fuzzer: broken: %s\n", promise);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();  // loaded once, before the first input (an error here names the missing assets)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const titan::data::Tokenizer& t = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = t.encode(text);
  const std::string normalized = t.normalize(text);
  std::string joined;
  for (int32_t id : ids) {
    if (!t.has_id(id)) broken("every id of encode() is one decode() accepts");
    joined += t.token_bytes(id);
  }
  if (joined != normalized) broken("the tokens' bytes concatenated are normalize(text)");
  if (t.decode(ids) != normalized) broken("decode(encode(text)) is normalize(text)");
  return 0;
}
