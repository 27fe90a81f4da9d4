// `titan tokenize`: a JSON array of strings -> a JSON array of id arrays (or back with
// --decode), with the tokenizer of an HF checkpoint folder or a tokenizer.json.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/tokenizer.h"
#include "titan/io/json_error.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kUsage =
    "usage: titan tokenize [--tokenizer PATH] --input IN.json --output OUT.json [--add-special-tokens] [--decode]\n"
    "\n"
    "  --tokenizer PATH       folder with tokenizer.json (+ tokenizer_config.json), or the tokenizer.json\n"
    "                         itself (default: the Qwen3 tokenizer in assets/, from scripts/setup.sh)\n"
    "  --input IN.json        a JSON array of strings (with --decode: a JSON array of id arrays)\n"
    "  --output OUT.json      receives a JSON array of id arrays (with --decode: of strings)\n"
    "  --add-special-tokens   add bos/eos as tokenizer_config.json asks (none for Qwen3)\n"
    "  --decode               ids to text instead; --skip-special-tokens drops special tokens\n";

// Writes next to the target and renames, so a failed run leaves no half-written file.
void write_atomically(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    TITAN_CHECK(f, "tokenize: cannot write ", tmp);
    f << text << '\n';
    f.close();
    TITAN_CHECK(f, "tokenize: writing ", tmp, " failed");
  }
  fs::rename(tmp, path);
}

int run(int argc, char** argv) {
  fs::path tokenizer_path, input, output;
  bool add_special = false, decode = false, skip_special = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      TITAN_CHECK(i + 1 < argc, "tokenize: ", a, " needs a value\n", kUsage);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--tokenizer") {
      tokenizer_path = value();
    } else if (a == "--input") {
      input = value();
    } else if (a == "--output") {
      output = value();
    } else if (a == "--add-special-tokens") {
      add_special = true;
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--skip-special-tokens") {
      skip_special = true;
    } else {
      std::fprintf(stderr, "titan tokenize: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (input.empty() || output.empty()) {
    std::fprintf(stderr, "titan tokenize: --input and --output are required\n%s", kUsage);
    return 2;
  }
  if (tokenizer_path.empty()) tokenizer_path = titan::data::default_tokenizer_path();
  auto tokenizer = titan::data::Tokenizer::load(tokenizer_path);

  const json in = titan::io::read_json_file(input, "tokenize");
  TITAN_CHECK(in.is_array(), "tokenize: ", input, " must hold a JSON array, got ", in.type_name());
  json out = json::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const json& item = in[i];
    if (decode) {
      TITAN_CHECK(item.is_array(), "tokenize --decode: ", input, " element ", i, " is not an array of ids");
      std::vector<int32_t> ids;
      for (auto& id : item) {
        TITAN_CHECK(id.is_number_integer(), "tokenize --decode: ", input, " element ", i, " holds a non-integer");
        ids.push_back(id.get<int32_t>());
      }
      out.push_back(tokenizer.decode(ids, skip_special));
    } else {
      TITAN_CHECK(item.is_string(), "tokenize: ", input, " element ", i, " is ", item.type_name(),
                  ", not a string");
      out.push_back(tokenizer.encode(item.get_ref<const std::string&>(), add_special));
    }
  }
  write_atomically(output, out.dump(-1, ' ', false, json::error_handler_t::replace));
  return 0;
}

}  // namespace

TITAN_COMMAND("tokenize", "text <-> token ids with an HF tokenizer.json (byte-level BPE)", run);
