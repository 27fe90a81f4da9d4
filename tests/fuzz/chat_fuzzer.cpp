// libFuzzer target for the chat renderer (data/chat.h): a conversation record from a dataset or a
// prompts file, as JSON ({"messages": [...], "tools": [...]} or the messages array alone), rendered
// as Qwen3's chat template renders it under each of ChatPrompt's switches, then tokenized with the
// real Qwen3 tokenizer (assets/, scripts/setup.sh). Any input must render or throw titan::Error (JSON
// the parser refuses is skipped: the readers report it before rendering), and a rendering keeps its
// promises: one trained flag per token, the ids those of encode(chat_text(pieces)). Built with
// clang -fsanitize=fuzzer,address,undefined by tests/fuzz/tests.cmake and run for a few seconds by
// ctest (chat_fuzz) from tests/fixtures/chat_fuzz_seeds. Run longer by hand:
//   build/bin/chat_fuzzer -max_total_time=600 CORPUS_DIR tests/fixtures/chat_fuzz_seeds
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/chat.h"
#include "titan/data/tokenizer.h"

namespace {

const titan::data::Tokenizer& tokenizer() {
  static const titan::data::Tokenizer t = titan::data::Tokenizer::load(titan::data::default_tokenizer_path());
  return t;
}

[[noreturn]] void broken(const char* promise) {
  std::fprintf(stderr, "chat_fuzzer: broken: %s\n", promise);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();  // loaded once, before the first input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::ordered_json record;
  try {
    record = nlohmann::ordered_json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {  // a syntax error, a number past double's range
    return 0;
  }
  const bool whole = record.is_object() && record.contains("messages");
  const nlohmann::ordered_json messages = whole ? record["messages"] : record;
  const nlohmann::ordered_json tools = whole && record.contains("tools") ? record["tools"] : nullptr;
  for (int switches = 0; switches < 3; ++switches) {
    titan::data::ChatPrompt prompt;
    prompt.add_generation_prompt = switches == 1;
    prompt.enable_thinking = switches != 1;
    prompt.continue_final_message = switches == 2;
    try {
      const std::vector<titan::data::ChatPiece> pieces =
          titan::data::render_qwen3_chat(messages, tools, prompt);
      const titan::data::ChatTokens tokens = titan::data::tokenize_chat(tokenizer(), pieces);
      if (tokens.trained.size() != tokens.ids.size()) broken("one trained flag per token");
      const std::vector<int32_t> whole_text = tokenizer().encode(titan::data::chat_text(pieces));
      if (tokens.ids != std::vector<int32_t>(whole_text.begin(), whole_text.end()))
        broken("the conversation's ids are those of its rendered text");
    } catch (const titan::Error&) {
    }
  }
  return 0;
}
