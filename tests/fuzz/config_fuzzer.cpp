// libFuzzer target for the configuration parsers a user hands titan: a job config (TOML, torchtitan's
// keys and older spellings included, then validated), command-line overrides over the default
// config, and a Hugging Face config.json (read into model arguments). The first byte picks which
// (its value mod 3: '0' TOML, '1' config.json, '2' overrides, one `key=value` a line); the rest is
// the text. Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/tests.cmake and run
// for a few seconds by ctest (config_fuzz) from tests/fixtures/config_fuzz_seeds. Run longer by hand:
//   build/bin/config_fuzzer -max_total_time=600 CORPUS_DIR tests/fixtures/config_fuzz_seeds
// Any input must parse or throw titan::Error (invalid JSON too, read through io::parse_json_text as
// args_from_hf_config_file reads it); anything else (a crash, a sanitizer report, another
// exception) is a finding.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/check.h"
#include "titan/io/json_error.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const titan::train::JobConfig c = titan::train::parse_job_config(text, "fuzz.toml", {});
        c.validate(1);
        c.validate(4);
        break;
      }
      case 1: {
        // As args_from_hf_config_file reads it: invalid JSON (a syntax error, a number past double's
        // range) is a titan::Error naming the file.
        titan::qwen3::args_from_hf_config(titan::io::parse_json_text(text, "config.json"), "config.json");
        break;
      }
      case 2: {
        std::vector<std::pair<std::string, std::string>> overrides;
        size_t at = 0;
        while (at < text.size()) {
          size_t end = text.find('\n', at);
          if (end == std::string::npos) end = text.size();
          const std::string line = text.substr(at, end - at);
          const size_t eq = line.find('=');
          if (eq != std::string::npos) overrides.emplace_back(line.substr(0, eq), line.substr(eq + 1));
          at = end + 1;
        }
        titan::train::parse_job_config("", "fuzz.toml", overrides).validate(2);
        break;
      }
    }
  } catch (const titan::Error&) {
  }
  return 0;
}
