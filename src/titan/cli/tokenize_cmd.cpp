// `titan tokenize`: a JSON array of strings -> a JSON array of id arrays (or back with
// --decode), with the tokenizer of an HF checkpoint folder or a tokenizer.json; with --chat, a file of
// conversation records, read as training.chat_field reads it -> what supervised fine-tuning trains on
// (their text, ids, and which ids the loss trains on).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/chat.h"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"
#include "titan/data/utf8.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The input file read as training reads its records: invalid UTF-8 and unpaired surrogate escapes
// become U+FFFD (counted on stderr, with the lines holding them), so what this command shows is what a
// run trains on.
std::string read_input_text(const fs::path& input, const std::string& who) {
  const std::string file = titan::io::read_regular_file(input, who);
  std::string text = file;
  if (titan::data::sanitize_utf8(text) + titan::data::repair_surrogate_escapes(text) == 0) return text;
  // Again line by line, to name the lines (no UTF-8 sequence or escape spans a newline).
  text.clear();
  size_t replaced = 0;
  std::vector<int64_t> lines;
  int64_t line = 1;
  for (size_t start = 0; start <= file.size(); ++line) {
    size_t end = file.find('\n', start);
    if (end == std::string::npos) end = file.size();
    std::string piece = file.substr(start, end - start);
    if (const size_t n = titan::data::sanitize_utf8(piece) + titan::data::repair_surrogate_escapes(piece)) {
      replaced += n;
      lines.push_back(line);
    }
    text += piece;
    if (end < file.size()) text += '\n';
    start = end + 1;
  }
  std::string where = lines.size() == 1 ? "line " : "lines ";
  for (size_t i = 0; i < lines.size() && i < 10; ++i) where += (i ? ", " : "") + std::to_string(lines[i]);
  if (lines.size() > 10) where += ", ... (" + std::to_string(lines.size()) + " lines in all)";
  std::fprintf(
      stderr,
      "%s: %zu invalid UTF-8 sequence(s) or unpaired surrogate escape(s) in '%s' (%s) read as U+FFFD, "
      "as training reads them\n",
      who.c_str(), replaced, input.string().c_str(), where.c_str());
  return text;
}

json read_input(const fs::path& input, const std::string& who) {
  return titan::io::parse_json_text(read_input_text(input, who), who + ": '" + input.string() + "'");
}

// Without --chat the input is JSON; a file training reads otherwise (a table, JSON Lines of text
// records, compressed) is named as such before its bytes fail to parse. With --chat it is read by
// training's own reader, which takes every format training does.
void check_input_kind(const fs::path& input, bool chat, bool decode) {
  titan::io::check_regular_file(input, chat ? "tokenize --chat: --input" : "tokenize: --input");
  if (chat) return;
  std::string name = input.filename().string();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::string wanted =
      decode ? "one JSON array of id arrays" : "one JSON array of strings ([\"first text\", \"second\"])";
  for (const char* tail : {".gz", ".zst", ".parquet", ".arrow", ".csv", ".tsv"})
    TITAN_CHECK(!ends(tail), "tokenize: '", input.string(), "' is a ", std::string(tail).substr(1),
                " file, which titan train reads and this command reads with --chat only: its input is ",
                wanted);
  TITAN_CHECK(!titan::data::is_json_lines(input), "tokenize: '", input.string(),
              "' is JSON Lines, which this command reads with --chat only (conversation records)",
              decode ? ": --decode reads " : ": without it the input is ", wanted);
}

int run(int argc, char** argv) {
  titan::cli::ArgParser p(
      "tokenize",
      "A JSON array of strings -> a JSON array of id arrays (or back with --decode), with the\n"
      "tokenizer of an HF checkpoint folder or a tokenizer.json. With --chat FIELD: a file of\n"
      "conversation records, read as training.chat_field reads it (JSON array, JSON Lines, Parquet,\n"
      "Arrow; .gz/.zst) -> a JSON array of {\"text\": the rendered conversation, \"ids\",\n"
      "\"trained\": 1 per id the loss trains on, \"trained_text\": those ids' text}.");
  p.option("tokenizer",
           "folder with tokenizer.json (+ tokenizer_config.json), or the tokenizer.json itself (default: the "
           "Qwen3 tokenizer in assets/, from scripts/setup.sh)")
      .required("input",
                "a JSON array of strings (with --decode: of id arrays; with --chat: a file of records in any "
                "format training reads)")
      .required("output", "receives a JSON array of id arrays (with --decode: of strings)")
      .option("chat", "the records' field holding each conversation's messages (as training.chat_field)")
      .flag("add-special-tokens", "add bos/eos as tokenizer_config.json asks (none for Qwen3)")
      .flag("decode", "ids to text instead")
      .flag("skip-special-tokens", "with --decode: drop special tokens");
  if (!p.parse(argc, argv)) return 0;
  const fs::path input = p.get("input"), output = p.get("output");
  fs::path tokenizer_path = p.get_optional("tokenizer").value_or("");
  const bool add_special = p.has("add-special-tokens"), decode = p.has("decode"),
             skip_special = p.has("skip-special-tokens");
  TITAN_CHECK(!skip_special || decode, "tokenize: --skip-special-tokens applies to --decode only");
  TITAN_CHECK(!(add_special && decode),
              "tokenize: --add-special-tokens applies to encoding only (not --decode)");
  const std::string chat_field = p.get_optional("chat").value_or("");
  TITAN_CHECK(chat_field.empty() || !(decode || add_special),
              "tokenize: --chat renders and tokenizes conversations; --decode and --add-special-tokens do not apply");
  check_input_kind(input, !chat_field.empty(), decode);
  if (tokenizer_path.empty()) tokenizer_path = titan::data::default_tokenizer_path();
  titan::io::check_output_path(output, {input, tokenizer_path}, "titan tokenize --output");
  auto tokenizer = titan::data::Tokenizer::load(tokenizer_path);

  json out = json::array();
  if (!chat_field.empty()) {
    titan::data::check_qwen3_chat_template(tokenizer);
    // Training's reader, as training.chat_field reads the file: its formats (JSON, JSON Lines,
    // Parquet, Arrow, compressed), its errors (file:line, record, message, field), its warnings and
    // its rule on what is text. What it returns is what a run trains on.
    titan::data::DatasetConfig dataset;
    dataset.paths = {input};
    dataset.chat_field = chat_field;
    titan::data::DocumentStream stream(dataset);
    titan::data::Document doc;
    while (stream.next(doc)) {
      const titan::data::ChatTokens t = titan::data::tokenize_chat(tokenizer, doc.chat);
      std::string trained_text;
      for (size_t k = 0; k < t.ids.size(); ++k)
        if (t.trained[k]) trained_text += tokenizer.token_bytes(t.ids[k]);
      out.push_back(
          {{"text", doc.text}, {"ids", t.ids}, {"trained", t.trained}, {"trained_text", trained_text}});
    }
    titan::io::write_file_atomic(output, out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
    return 0;
  }
  const json in = read_input(input, "tokenize");
  TITAN_CHECK(in.is_array(), "tokenize: ", input, " must hold a JSON array, got ", in.type_name());
  for (size_t i = 0; i < in.size(); ++i) {
    const json& item = in[i];
    if (decode) {
      TITAN_CHECK(item.is_array(), "tokenize --decode: ", input, " element ", i, " is not an array of ids");
      std::vector<int32_t> ids;
      for (auto& id : item) {
        TITAN_CHECK(id.is_number_integer(), "tokenize --decode: ", input, " element ", i, " holds a non-integer");
        // Read whole: a large id must be named as out of the vocabulary, never wrap into it.
        const bool in_range = id.is_number_unsigned()
                                  ? id.get<uint64_t>() <= uint64_t(INT32_MAX)
                                  : id.get<int64_t>() >= INT32_MIN && id.get<int64_t>() <= INT32_MAX;
        TITAN_CHECK(in_range, "tokenize --decode: ", input, " element ", i, ": id ", id.dump(),
                    " is not in the vocabulary");
        ids.push_back(id.get<int32_t>());
      }
      try {
        out.push_back(tokenizer.decode(ids, skip_special));
      } catch (const titan::Error& e) {  // an id past the vocabulary: say where it is
        TITAN_FAIL("tokenize --decode: ", input, " element ", i, ": ", e.what());
      }
    } else {
      TITAN_CHECK(item.is_string(), "tokenize: ", input, " element ", i, " is ", item.type_name(),
                  ", not a string");
      out.push_back(tokenizer.encode(item.get_ref<const std::string&>(), add_special));
    }
  }
  // Written to a temporary beside it and renamed: a failed run leaves no half-written file.
  titan::io::write_file_atomic(output, out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
  return 0;
}

}  // namespace

TITAN_COMMAND("tokenize", "text <-> token ids with an HF tokenizer.json (byte-level BPE)", run);
