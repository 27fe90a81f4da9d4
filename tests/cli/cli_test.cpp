// The command line as a user meets it: mistyped commands, subcommands and options get a suggestion
// and exit 2 (unknown command) or 1 (bad input); errors say "titan <command>: error:" once; options
// are checked before any work or output; an output that is a directory is refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include "models/oracle_check.h"
#include "models/small_args.h"
#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/data/assets.h"
#include "titan/data/tokenizer.h"
#include "titan/models/qwen3/generate.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"
#include "train/tiny_job.h"

namespace {

namespace fs = std::filesystem;
namespace tt = titan::testing;

struct Outcome {
  int rc = 0;
  std::string out, err;
};

// `titan ARGS`, stdout and stderr apart.
// `text` as one word of a POSIX shell command line.
std::string shell_word(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Outcome titan(const std::string& args) {
  // Its own folder per call and process: ctest runs this program's cases in parallel processes.
  static int calls = 0;
  const fs::path dir =
      tt::temp_dir("cli_streams_" + std::to_string(getpid()) + "_" + std::to_string(++calls));
  Outcome r;
  std::string ignored;
  // A group, so the helper's own 2>&1 applies to it and not to titan.
  r.rc = tt::run_command("{ " + tt::titan_binary().string() + " " + args + " >" + (dir / "out").string() + " 2>" +
                             (dir / "err").string() + "; }",
                         &ignored);
  auto read = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  r.out = read(dir / "out");
  r.err = read(dir / "err");
  return r;
}

TEST(CommandLine, AnUnknownCommandIsSuggestedAndTheUsageGoesToStderr) {
  Outcome r = titan("trian");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("titan: unknown command 'trian'; did you mean 'train'?"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("usage: titan <command>"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  // Another tool's name for a command titan has under its own.
  r = titan("chat");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("titan: unknown command 'chat'; did you mean 'titan generate --interactive'?"),
            std::string::npos)
      << r.err;
  r = titan("");  // no command: the usage, on stderr, exit 2
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("usage: titan <command>"), std::string::npos) << r.err;
}

TEST(CommandLine, HelpIsACommandToo) {
  Outcome r = titan("help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: titan <command>"), std::string::npos) << r.out;
  r = titan("help train");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: titan train --config FILE.toml"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("titan train --list-keys"), std::string::npos) << r.out;
  // The reference of every key, from the binary (an install need not carry docs/ along).
  r = titan("train --list-keys");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\n[training]\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n# mixed_precision_param = \"bfloat16\"  # bfloat16 | float32\n"), std::string::npos)
      << r.out;
  // It takes nothing else.
  r = titan("train --list-keys --config x.toml");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("titan train: error: --list-keys takes no value and no other argument"),
            std::string::npos)
      << r.err;
  for (const char* given : {"train --list-keys=true", "train --config x.toml --list-keys="}) {
    r = titan(given);
    EXPECT_EQ(r.rc, 1) << given;
    EXPECT_NE(r.err.find("titan train: error: --list-keys takes no value and no other argument"),
              std::string::npos)
        << given << ": " << r.err;
  }
}

TEST(CommandLine, ErrorsNameTheCommandOnce) {
  Outcome r = titan("train");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("titan train: error: --config FILE.toml is required"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("titan train: error: titan train:"), std::string::npos) << r.err;
  r = titan("train --config x.toml --");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("unexpected argument '--'"), std::string::npos) << r.err;
}

// An empty value (an unset shell variable: --tokenizer "$TOK") is refused, not read as the option
// left out: tokenize fell back to the bundled tokenizer, eval to the job's newest checkpoint.
TEST(CommandLine, AnEmptyOptionValueIsRefusedNotTakenForTheDefault) {
  const std::string toml = (tt::source_dir() / "configs" / "debugmodel.toml").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"tokenize --tokenizer '' --input in.json --output out.json",
            "titan tokenize: error: --tokenizer is empty; give it a value "
            "or leave it out (an unset shell variable?)"},
           {"tokenize --tokenizer= --input in.json --output out.json",
            "titan tokenize: error: --tokenizer is empty"},
           {"eval --config " + toml + " --checkpoint ''", "titan eval: error: --checkpoint is empty"},
           {"check --config " + toml + " --workdir=", "titan check: error: --workdir is empty"},
           {"train --config ''", "titan train: error: --config is empty"}}) {
    const Outcome r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
}

TEST(CommandLine, MistypedSubcommandsAndOptionsGetASuggestion) {
  const std::pair<std::string, std::string> cases[] = {
      {"debug dmp", "titan debug: unknown subcommand 'dmp'; did you mean 'dump'?"},
      {"kernels lst", "titan kernels: unknown subcommand 'lst'; did you mean 'list'?"},
      {"kernels parity --op rop", "unknown op 'rop'; did you mean 'rope'?"},
      {"tokenize --decod", "titan tokenize: error: unknown option '--decod'; did you mean '--decode'?"},
      {"info --flavor debugmodel --dtype bfloat61", "--dtype bfloat61: training computes in float32 or bfloat16; "
                                                    "did you mean 'bfloat16'?"},
  };
  for (const auto& [args, message] : cases) {
    const Outcome r = titan(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
}

// Every command's mistyped option gets the nearest of its options, the job-config commands' (train,
// check, eval, plan, info --config) as well as the others'.
TEST(CommandLine, AMistypedOptionOfEveryCommandGetsADidYouMean) {
  const std::string toml = (tt::source_dir() / "configs" / "debugmodel.toml").string();
  const std::pair<std::string, std::string> cases[] = {
      {"train --confg x.toml",
       "titan train: error: unknown option --confg (its options: --config, --list-keys; the job config's "
       "keys are --section.key=value; did you mean --config?)"},
      {"train --list-key",
       "unknown option --list-key (its options: --config, --list-keys; the job config's "
       "keys are --section.key=value; did you mean --list-keys?)"},
      {"check --config " + toml + " --jsn",
       "titan check: error: unknown option --jsn (its options: --config, "
       "--json, --steps, --workdir; the job config's keys are "
       "--section.key=value; did you mean --json?)"},
      {"eval --config " + toml + " --chekpoint x", "; did you mean --checkpoint?)"},
      {"plan --config " + toml + " --memory-per-rnak 1GiB", "; did you mean --memory-per-rank?)"},
      {"info --confg x.toml", "titan info: error: unknown option '--confg'; did you mean '--config'?"},
      {"export --chekpoint x --out y",
       "titan export: error: unknown option '--chekpoint'; did you mean "
       "'--checkpoint'?"},
      {"verify-export x --sorce y", "unknown option '--sorce'; did you mean '--source'?"},
      {"generate --promt hi", "unknown option '--promt'; did you mean '--prompt'?"},
      {"report --ot x.html", "unknown option '--ot'; did you mean '--out'?"},
      {"version --jsn", "unknown option '--jsn'; did you mean '--json'?"},
      {"kernels parity --dvice cpu", "unknown option '--dvice'; did you mean '--device'?"},
      {"debug dump --tokns x", "unknown option '--tokns'; did you mean '--tokens'?"},
  };
  for (const auto& [args, message] : cases) {
    const Outcome r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
}

// verify-export checks its options before the first check row prints.
TEST(CommandLine, OptionsAreCheckedBeforeAnyWork) {
  const Outcome r = titan("verify-export " + tt::temp_dir("cli_no_export").string() + " --batch 0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--batch 0: expected an integer >= 1"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "rows printed before the options were checked";
  // A batch whose tokens wrap an int64 (2^62 x 4 = 0) is over the bound, not 0 tokens.
  const Outcome wrapped = titan("verify-export " + tt::temp_dir("cli_no_export").string() +
                                " --batch 4611686018427387904 --seq 4");
  EXPECT_EQ(wrapped.rc, 1);
  EXPECT_NE(wrapped.err.find("the loss batch --batch 4611686018427387904 x --seq 4 is over the bound"),
            std::string::npos)
      << wrapped.err;
  EXPECT_EQ(wrapped.out, "") << "rows printed before the options were checked";
}

TEST(CommandLine, AnOutputThatIsADirectoryIsRefusedByName) {
  const fs::path dir = tt::temp_dir("cli_output_dir");
  fs::create_directories(dir / "out.json");
  std::ofstream(dir / "in.json") << "[\"hello\"]";
  const Outcome r = titan("tokenize --input " + (dir / "in.json").string() + " --output " + (dir / "out.json").string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("'" + (dir / "out.json").string() +
                       "' is a directory: a file cannot be written in its place (name a file)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "out.json"));
}

// titan generate on a transformers checkpoint without a tokenizer: ids in, ids out, the same
// greedy tokens as the library's loop; every bad request is named before the model loads.
// `titan info --model-path` on a model shorter than the default sequence (the oracle's 512
// positions) measures a step at its max_seq_len instead of refusing an option nobody gave; a --seq
// past it is still refused.
TEST(CommandLine, InfoOnASmallModelDefaultsToItsMaxSeqLen) {
  const std::string model = tt::oracle_dir("tiny_dense").string();
  Outcome r = titan("info --model-path " + model);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("FLOPs per token at seq 512:"), std::string::npos) << r.out;
  r = titan("info --model-path " + model + " --seq 2048");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--seq = 2048 exceeds the model's max_seq_len = 512"), std::string::npos) << r.err;
}

TEST(CommandLine, GenerateContinuesIdsAndNamesBadRequests) {
  const std::string model = tt::oracle_dir("tiny_dense").string();
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  const titan::qwen3::Generation g =
      titan::qwen3::generate(*titan::qwen3::load_hf_model(model, titan::DType::F32), prompt, 12,
                             titan::qwen3::SamplingOptions{}, {});
  std::string expected;
  for (int64_t id : g.ids) expected += (expected.empty() ? "" : ",") + std::to_string(id);
  Outcome r = titan("generate --model-path " + model + " --prompt-ids '17, 400,2048,5' --max-new-tokens 12");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");
  EXPECT_NE(r.err.find("12 new tokens after 4 prompt tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stopped at max new tokens"), std::string::npos) << r.err;

  const std::string m = "generate --model-path " + model + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {m + "--prompt hello", "no tokenizer.json to encode --prompt (looked for '" + model +
                                 "/tokenizer.json'); name one with --tokenizer"},
      {"generate --prompt-ids 1", "give either --model-path (a Hugging Face folder) or --checkpoint"},
      {m + "--checkpoint " + model + " --prompt-ids 1", "or --checkpoint (a native step-N folder), not both"},
      {m + "--prompt hi --prompt-ids 1",
       "give one of --prompt, --prompt-ids, --prompts-file and --interactive, not more"},
      {m, "give one of --prompt, --prompt-ids, --prompts-file and --interactive"},
      {m + "--prompt-ids 1 --batch-size 2",
       "--batch-size sets how many prompts of --prompts-file run together"},
      {m + "--prompt-ids 1,x", "--prompt-ids element 1 'x' is not an integer"},
      {m + "--prompt-ids 1,,2", "--prompt-ids element 1 '' is not an integer"},
      {m + "--prompt-ids 1,4096", "prompt token 1 is id 4096, outside the vocabulary"},
      {m + "--prompt-ids 1 --top-k 5",
       "--top-k shapes sampling, and this run decodes greedily (the model has no generation_config.json: "
       "greedy by default): it would do nothing"},
      {m + "--prompt-ids 1 --temperature -1", "temperature must be a finite number >= 0"},
      {m + "--prompt-ids 1 --temperature 1 --top-p 0", "top_p must be in (0, 1]"},
      {m + "--prompt-ids 1 --min-p 0.1", "--min-p shapes sampling, and this run decodes greedily"},
      {m + "--prompt-ids 1 --temperature 0 --eta-cutoff 0.1",
       "--eta-cutoff shapes sampling, and this run decodes greedily (--temperature 0)"},
      {m + "--prompt-ids 1 --temperature 1 --epsilon-cutoff 1", "epsilon_cutoff must be in [0, 1)"},
      {m + "--prompt-ids 1 --temperature 1 --min-p 1.5", "min_p must be in [0, 1]"},
      {m + "--prompt-ids 1 --temperature 1 --typical-p 0", "typical_p must be in (0, 1]"},
      {m + "--prompt-ids 1 --no-repeat-ngram-size -1", "no-repeat-ngram-size"},
      {m + "--prompt-ids 1 --max-new-tokens 0", "--max-new-tokens 0: expected an integer >= 1"},
      {m + "--prompt-ids 1 --dtype float16", "--dtype must be float32 or bfloat16"},
      {m + "--prompt-ids 1 --device cdua", "--device cdua: expected cpu or cuda"},
      {m + "--prompt-ids 1 --tokenizer " + titan::data::default_tokenizer_path().string(),
       "they do not belong together"},
      {m + "--prompt hi --tokenizer " + titan::data::default_tokenizer_path().string(),
       "they do not belong together"},
      {"generate --checkpoint " + model + " --prompt-ids 1",
       "is a Hugging Face folder (config.json, no manifest.json): give it as --model-path"},
      {m + "--prompt-ids 1 --temperature 0x10", "--temperature 0x10: expected a number"},
      {m + "--prompt-ids 1 --temperature ' 1'", "--temperature  1: expected a number"},
      {"generate --model-path " + tt::temp_dir("cli_generate_none").string() + "/absent --prompt-ids 1",
       "is not a folder"},
  };
  for (const auto& [args, message] : cases) {
    r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  // --device cuda on a machine without a usable GPU (or a build without the CUDA backend) fails
  // with the reason (a GPU machine runs it: tests/backend/cuda_oracle_test.cpp).
  if (!titan::device_available(titan::Device::CUDA)) {
    r = titan(m + "--prompt-ids 1 --device cuda");
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("titan generate: error: --device cuda: device 'cuda'"), std::string::npos) << r.err;
  } else {
    r = titan("generate --model-path " + model +
              " --prompt-ids '17, 400,2048,5' --max-new-tokens 12 --device cuda");
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, expected + "\n");
  }
}

// --prompts-file: every prompt of a JSON Lines file, --batch-size at a time as the rows of one batch,
// each one's line printed in the file's order: the tokens of the library's generate_batch with the
// same batch size (prompt i sampling with --seed + i); every bad line is named with its file, line and
// rule before the model loads.
TEST(CommandLine, GenerateContinuesAFileOfPromptsInBatches) {
  const std::string model = tt::oracle_dir("tiny_dense").string();
  const fs::path dir = tt::temp_dir("cli_generate_file_" + std::to_string(getpid()));
  const std::vector<std::vector<int64_t>> prompts = {{17, 400, 2048, 5}, {9}, {3, 3, 8}};
  {
    std::ofstream f(dir / "prompts.jsonl");
    f << "{\"prompt_ids\": [17, 400, 2048, 5]}\n\n{\"prompt_ids\": [9]}\r\n  {\"prompt_ids\":[3,3,8]}\n";
  }
  auto loaded = titan::qwen3::load_hf_model(model, titan::DType::F32);
  for (const bool sampled : {false, true}) {
    titan::qwen3::SamplingOptions o;
    if (sampled) o.temperature = 1.5, o.seed = 5;
    titan::qwen3::BatchOptions how;
    how.batch_size = 2;
    how.seeds = {o.seed, o.seed + 1, o.seed + 2};
    const std::vector<titan::qwen3::Generation> want =
        titan::qwen3::generate_batch(*loaded, prompts, 6, o, {}, {}, how);
    const Outcome r =
        titan("generate --model-path " + model + " --prompts-file " + (dir / "prompts.jsonl").string() +
              " --batch-size 2 --max-new-tokens 6" + (sampled ? " --temperature 1.5 --seed 5" : ""));
    ASSERT_EQ(r.rc, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(std::getline(lines, line)) << r.out;
      const nlohmann::json row = nlohmann::json::parse(line);
      EXPECT_EQ(row.at("index").get<size_t>(), i);
      EXPECT_EQ(row.at("line").get<int64_t>(), (std::vector<int64_t>{1, 3, 4}[i])) << "blank line 2 skipped";
      EXPECT_EQ(row.at("prompt_ids").get<std::vector<int64_t>>(), prompts[i]);
      EXPECT_EQ(row.at("ids").get<std::vector<int64_t>>(), want[i].ids)
          << "prompt " << i << " sampled " << sampled;
      EXPECT_EQ(row.at("stop_reason"), "max new tokens");
      EXPECT_FALSE(row.contains("text")) << "no tokenizer, no text";
    }
    EXPECT_FALSE(std::getline(lines, line)) << r.out;
    EXPECT_NE(r.err.find("3 prompts, 18 new tokens in "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("batches of 2, f32 on cpu)"), std::string::npos) << r.err;
  }

  const std::string file = (dir / "bad.jsonl").string();
  const std::string m = "generate --model-path " + model + " --prompts-file " + file;
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1,]}\n", file + ": line 2, column 18: "},
           {"{\"prompt_ids\": [1]}\n[1, 2]\n",
            file + " line 2: expected an object such as {\"prompt\": \"...\"}"},
           {"{\"prompt_ids\": [1], \"seed\": 1e400}\n", file + " line 1: number overflow parsing '1e400'"},
           {"{\"promt\": \"hi\"}\n",
            file + " line 1: unknown key \"promt\" (a line holds \"prompt\", \"prompt_ids\" or \"messages\", "
                   "and \"tools\", a \"completion\" or \"choices\" beside them); did you mean 'prompt'?"},
           {"{\"prompt\": \"hi\", \"prompt_ids\": [1]}\n",
            "line 1: give one of \"prompt\", \"prompt_ids\" and \"messages\""},
           {"{\"tools\": []}\n", "line 1: give one of \"prompt\", \"prompt_ids\" and \"messages\""},
           {"{\"prompt\": 5}\n", "line 1: \"prompt\" must be a string"},
           {"{\"prompt\": \"a\", \"prompt\": \"b\"}\n",
            "line 1: \"prompt\" is given twice (which one is meant?)"},
           {"{\"prompt_ids\": []}\n", "line 1: \"prompt_ids\" must be a non-empty array of ids"},
           {"{\"prompt_ids\": [1, \"2\"]}\n", "line 1: \"prompt_ids\" element 1 is not an integer"},
           {"{\"prompt_ids\": [1]}\n\n{\"prompt_ids\": [1, 4096]}\n",
            file + " line 3: prompt token 1 is id 4096, outside the vocabulary"},
           {"{\"prompt_ids\": [1]}\n{\"prompt\": \"hi\"}\n",
            "no tokenizer.json to encode the \"prompt\" of " + file + " line 2"},
           {"\n  \n", "--prompts-file '" + file + "' holds no prompt"}}) {
    std::ofstream(file, std::ios::trunc) << text;
    const Outcome r = titan(m);
    EXPECT_EQ(r.rc, 1) << text;
    EXPECT_NE(r.err.find(message), std::string::npos) << text << "\n" << r.err;
    EXPECT_EQ(r.out, "") << text;
  }
  std::ofstream(file, std::ios::trunc) << "{\"prompt_ids\": [1]}\n";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {m + " --prompt-ids 1",
            "give one of --prompt, --prompt-ids, --prompts-file and --interactive, not more"},
           {m + " --batch-size 0", "--batch-size 0: expected an integer >= 1"},
           {m + " --json", "--prompts-file prints JSON lines already; --json is for one prompt"},
           {m + " --max-new-tokens 4096",
            file + " line 1: 1 prompt tokens + --max-new-tokens 4096 pass the model's max_seq_len 512 (" +
                model + "/config.json's max_position_embeddings): at most 511 new tokens fit"},
           {m + " --chat",
            file + " line 1: --chat renders a \"prompt\" as a user message; \"prompt_ids\" are already ids"},
           {"generate --model-path " + model + " --prompts-file " + (dir / "absent.jsonl").string(),
            "--prompts-file: cannot read '" + (dir / "absent.jsonl").string() + "'"}}) {
    const Outcome r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
}

// --num-beams: transformers' beam search, the sequences and scores of the library's beam_search
// (best first, --num-return-sequences of them) as JSON, as text, and per line of a --prompts-file;
// a generation_config.json's num_beams without do_sample searches too; what beam search cannot do
// is named.
TEST(CommandLine, GenerateSearchesBeamsAsTheLibrary) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  auto loaded = titan::qwen3::load_hf_model(oracle, titan::DType::F32);
  titan::qwen3::BeamSearchOptions beams;
  beams.num_beams = 3;
  beams.length_penalty = 0.5;
  beams.early_stopping = titan::qwen3::EarlyStopping::Never;
  beams.num_return_sequences = 2;
  const std::vector<titan::qwen3::Generation> want =
      titan::qwen3::beam_search(*loaded, prompt, 6, beams, titan::qwen3::SamplingOptions{}, {});
  ASSERT_EQ(want.size(), 2u);
  const std::string m = "generate --model-path " + oracle.string() + " --max-new-tokens 6 ";
  const std::string search =
      "--num-beams 3 --num-return-sequences 2 --length-penalty 0.5 --early-stopping never";
  Outcome r = titan(m + "--prompt-ids 17,400,2048,5 --json " + search);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("sequence").get<size_t>(), s);
    EXPECT_EQ(row.at("ids").get<std::vector<int64_t>>(), want[s].ids);
    EXPECT_NEAR(row.at("score").get<double>(), *want[s].score, 1e-12);
    EXPECT_EQ(row.at("stop_reason"), "max new tokens");
  }
  EXPECT_FALSE(std::getline(lines, line)) << r.out;
  EXPECT_NE(r.err.find("beam search: 3 beams, length_penalty 0.5, early_stopping never, 2 sequences each"),
            std::string::npos)
      << r.err;
  auto joined = [](const std::vector<int64_t>& ids) {
    std::string text;
    for (int64_t id : ids) text += (text.empty() ? "" : ",") + std::to_string(id);
    return text;
  };
  r = titan(m + "--prompt-ids 17,400,2048,5 " + search);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("--- sequence 1 of 2: score "), 0u) << r.out;
  EXPECT_NE(r.out.find(", max new tokens ---\n" + joined(want[0].ids) + "\n--- sequence 2 of 2"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(r.out.ends_with("---\n" + joined(want[1].ids) + "\n")) << r.out;

  const fs::path dir = tt::temp_dir("cli_generate_beams_" + std::to_string(getpid()));
  std::ofstream(dir / "prompts.jsonl") << "{\"prompt_ids\": [9, 8]}\n{\"prompt_ids\": [17, 400, 2048, 5]}\n";
  r = titan(m + "--prompts-file " + (dir / "prompts.jsonl").string() + " --batch-size 2 " + search);
  ASSERT_EQ(r.rc, 0) << r.err;
  // The library's search of the same batch (f32 rounding depends on the batch's shape).
  const std::vector<std::vector<titan::qwen3::Generation>> batch = titan::qwen3::beam_search_batch(
      *loaded, {{9, 8}, {17, 400, 2048, 5}}, 6, beams, titan::qwen3::SamplingOptions{}, {}, {}, 2);
  lines = std::istringstream(r.out);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("index").get<size_t>(), i / 2);
    EXPECT_EQ(row.at("line").get<int64_t>(), int64_t(i / 2 + 1));
    EXPECT_EQ(row.at("sequence").get<size_t>(), i % 2);
    EXPECT_EQ(row.at("ids").get<std::vector<int64_t>>(), batch[i / 2][i % 2].ids) << "line " << i;
  }
  EXPECT_FALSE(std::getline(lines, line)) << r.out;

  // The model's generation_config.json: num_beams without do_sample is beam search, its other keys
  // with it; with sampling (a flag's temperature, or the config's do_sample) it is beam sampling.
  const fs::path model = dir / "model";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(oracle / f, model / f);
  std::ofstream(model / "generation_config.json")
      << R"({"num_beams": 3, "length_penalty": 0.5, "early_stopping": "never", "num_return_sequences": 2})";
  const std::string local =
      "generate --model-path " + model.string() + " --max-new-tokens 6 --prompt-ids 17,400,2048,5 ";
  r = titan(local + "--json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(0, r.out.find('\n'))).at("ids").get<std::vector<int64_t>>(),
            want[0].ids);
  EXPECT_NE(r.err.find("beam search as " + (model / "generation_config.json").string() + " says: 3 beams"),
            std::string::npos)
      << r.err;
  r = titan(local + "--temperature 0.8 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("beam sampling as " + (model / "generation_config.json").string() + " says: 3 beams"),
            std::string::npos)
      << r.err;
  titan::qwen3::SamplingOptions at_08;
  at_08.temperature = 0.8;
  EXPECT_EQ(
      nlohmann::json::parse(r.out.substr(0, r.out.find('\n'))).at("ids").get<std::vector<int64_t>>(),
      titan::qwen3::beam_search(*titan::qwen3::load_hf_model(oracle, titan::DType::F32), {17, 400, 2048, 5},
                                6, {3, 0.5, titan::qwen3::EarlyStopping::Never, 2}, at_08, {})[0]
          .ids)
      << r.err;
  std::ofstream(model / "generation_config.json", std::ios::trunc)
      << R"({"do_sample": true, "temperature": 0.7})";
  r = titan(local + "--num-beams 2");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("beam sampling: 2 beams"), std::string::npos) << r.err;
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {m + "--prompt-ids 1 --length-penalty 2",
            "--length-penalty shapes beam search; add --num-beams N"},
           {m + "--prompt-ids 1 --num-return-sequences 2",
            "--num-return-sequences 2: greedy search gives one sequence; sample (--temperature T > 0) or "
            "search beams"},
           {m + "--prompt-ids 1 --num-beams 2 --num-return-sequences 3",
            "num_return_sequences must be in [1, num_beams = 2], got 3"},
           {m + "--prompt-ids 1 --num-beams 2 --early-stopping soon",
            "--early-stopping soon: expected false, true or never"},
           {m + "--prompts-file " + (dir / "prompts.jsonl").string() + " --num-beams 0",
            "--num-beams 0: expected an integer >= 1"}}) {
    r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

// --num-return-sequences with sampling: that many samples of each prompt, sample j of prompt i
// seeded --seed + i * N + j: the library's generate_batch over the prompts repeated, as one JSON line
// (or one text block) each.
TEST(CommandLine, GenerateSamplesAPromptSeveralTimes) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  auto loaded = titan::qwen3::load_hf_model(oracle, titan::DType::F32);
  titan::qwen3::SamplingOptions o;
  o.temperature = 1.2;
  o.seed = 7;
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  titan::qwen3::BatchOptions how;
  how.seeds = {7, 8, 9};
  const std::vector<titan::qwen3::Generation> want =
      titan::qwen3::generate_batch(*loaded, std::vector<std::vector<int64_t>>(3, prompt), 5, o, {}, {}, how);
  const std::string m =
      "generate --model-path " + oracle.string() + " --max-new-tokens 5 --temperature 1.2 --seed 7 ";
  Outcome r = titan(m + "--prompt-ids 17,400,2048,5 --num-return-sequences 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  for (size_t j = 0; j < 3; ++j) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("sequence").get<size_t>(), j);
    EXPECT_EQ(row.at("ids").get<std::vector<int64_t>>(), want[j].ids) << "sample " << j;
  }
  EXPECT_FALSE(std::getline(lines, line)) << r.out;
  EXPECT_NE(want[0].ids, want[1].ids) << "two samples alike: the seeds did not differ";
  // --logprobs: each sample's tokens' log-probabilities, as the library gives them.
  how.logprobs = true;
  const std::vector<titan::qwen3::Generation> with_logprobs =
      titan::qwen3::generate_batch(*loaded, std::vector<std::vector<int64_t>>(3, prompt), 5, o, {}, {}, how);
  r = titan(m + "--prompt-ids 17,400,2048,5 --num-return-sequences 3 --json --logprobs");
  ASSERT_EQ(r.rc, 0) << r.err;
  lines = std::istringstream(r.out);
  for (size_t j = 0; j < 3; ++j) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const std::vector<double> got = nlohmann::json::parse(line).at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(got.size(), with_logprobs[j].logprobs.size());
    for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], with_logprobs[j].logprobs[k], 1e-12);
  }
  how.logprobs = false;
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {m + "--prompt-ids 1 --logprobs", "--logprobs are printed in JSON: add --json"},
           {"generate --model-path " + oracle.string() + " --prompt-ids 1 --num-beams 2 --json --logprobs",
            "--logprobs: beam search gives each sequence's score instead"}}) {
    r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
  r = titan(m + "--prompt-ids 17,400,2048,5 --num-return-sequences 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("--- sample 1 of 3 (seed 7), max new tokens ---\n"), 0u) << r.out;
  EXPECT_NE(r.out.find("--- sample 3 of 3 (seed 9)"), std::string::npos) << r.out;

  const fs::path dir = tt::temp_dir("cli_generate_samples_" + std::to_string(getpid()));
  std::ofstream(dir / "prompts.jsonl") << "{\"prompt_ids\": [9, 8]}\n{\"prompt_ids\": [17, 400, 2048, 5]}\n";
  how.seeds = {7, 8, 9, 10};
  how.batch_size = 4;
  const std::vector<titan::qwen3::Generation> file_want =
      titan::qwen3::generate_batch(*loaded, {{9, 8}, {9, 8}, prompt, prompt}, 5, o, {}, {}, how);
  r = titan(m + "--prompts-file " + (dir / "prompts.jsonl").string() +
            " --batch-size 4 --num-return-sequences 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  lines = std::istringstream(r.out);
  for (size_t k = 0; k < 4; ++k) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("index").get<size_t>(), k / 2);
    EXPECT_EQ(row.at("sequence").get<size_t>(), k % 2);
    EXPECT_EQ(row.at("ids").get<std::vector<int64_t>>(), file_want[k].ids) << "line " << k;
  }
  EXPECT_FALSE(std::getline(lines, line)) << r.out;
}

// A --prompts-file whose lines hold completions scores them instead of generating: each
// completion token's log-probability (qwen3::score_continuation), their sum and whether all were
// greedy, one JSON line each; every bad line or generation flag is named.
TEST(CommandLine, GenerateScoresTheCompletionsOfAFile) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  auto loaded = titan::qwen3::load_hf_model(oracle, titan::DType::F32);
  const fs::path dir = tt::temp_dir("cli_generate_score_" + std::to_string(getpid()));
  const std::vector<int64_t> greedy_tail =
      titan::qwen3::generate(*loaded, {17, 400}, 3, titan::qwen3::SamplingOptions{}, {}).ids;
  std::ofstream(dir / "scores.jsonl")
      << "{\"prompt_ids\": [17, 400], \"completion_ids\": " << nlohmann::json(greedy_tail).dump()
      << "}\n{\"prompt_ids\": [9, 8, 7], \"completion_ids\": [5, 1000]}\n";
  const std::string m = "generate --model-path " + oracle.string() + " --prompts-file ";
  Outcome r = titan(m + (dir / "scores.jsonl").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> pairs = {{{17, 400}, greedy_tail},
                                                                                    {{9, 8, 7}, {5, 1000}}};
  double total = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const nlohmann::json row = nlohmann::json::parse(line);
    const titan::qwen3::ContinuationScore want =
        titan::qwen3::score_continuation(*loaded, pairs[i].first, pairs[i].second);
    EXPECT_EQ(row.at("completion_ids").get<std::vector<int64_t>>(), pairs[i].second);
    const std::vector<double> got = row.at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.logprobs.size());
    double sum = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_NEAR(got[k], want.logprobs[k], 1e-12);
      sum += want.logprobs[k];
    }
    EXPECT_NEAR(row.at("logprob").get<double>(), sum, 1e-9);
    EXPECT_EQ(row.at("greedy").get<bool>(), want.greedy);
    EXPECT_EQ(row.at("greedy").get<bool>(), i == 0) << "line 1 holds the greedy tokens";
    total += sum;
  }
  EXPECT_FALSE(std::getline(lines, line)) << r.out;
  EXPECT_NE(r.err.find("scored 2 completions, 5 tokens in "), std::string::npos) << r.err;
  char perplexity[64];
  std::snprintf(perplexity, sizeof perplexity, "perplexity %.6g", std::exp(-total / 5));
  EXPECT_NE(r.err.find(perplexity), std::string::npos) << r.err;

  const std::string file = (dir / "bad.jsonl").string();
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt_ids\": [1], \"completion_ids\": [2]}\n{\"prompt_ids\": [1]}\n",
            file + " line 2: no completion to score, where line 1 has one"},
           {"{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1], \"completion\": \"x\"}\n",
            file + " line 2: a completion to score, where line 1 is a prompt to continue"},
           {"{\"prompt_ids\": [1], \"completion\": \"x\", \"completion_ids\": [2]}\n",
            "line 1: give one of \"completion\", \"completion_ids\" and \"choices\""},
           {"{\"prompt_ids\": [1], \"completion\": \"\"}\n",
            "line 1: \"completion\" must be a non-empty string"},
           {"{\"prompt_ids\": [1], \"completion_ids\": [4096]}\n",
            file + " line 1: completion token 0 is id 4096, outside the vocabulary"},
           {"{\"prompt_ids\": [1], \"completion\": \"x\"}\n",
            "no tokenizer.json to encode the \"completion\" of " + file + " line 1"}}) {
    std::ofstream(file, std::ios::trunc) << text;
    r = titan(m + file);
    EXPECT_EQ(r.rc, 1) << text;
    EXPECT_NE(r.err.find(message), std::string::npos) << text << "\n" << r.err;
    EXPECT_EQ(r.out, "") << text;
  }
  r = titan(m + (dir / "scores.jsonl").string() + " --temperature 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--temperature shapes generation, and the lines of " +
                       (dir / "scores.jsonl").string() + " hold completions to score"),
            std::string::npos)
      << r.err;
}

// --chat: the prompt is a user message (after --system's) in Qwen3's chat template with the
// assistant's turn opened, --no-think with its empty <think> block: the ids transformers'
// apply_chat_template(..., add_generation_prompt=True, enable_thinking=False) gives (the rendering is
// checked against the Jinja template in tests/data/chat_test.cpp); the streamed text is the whole.
TEST(CommandLine, GenerateChatRendersThePromptWithTheChatTemplate) {
  const fs::path dir = tt::temp_dir("cli_generate_chat_" + std::to_string(getpid())) / "model";
  {
    titan::qwen3::ModelArgs a = tt::small_args(1, false);
    a.vocab_size = 151936;  // the real tokenizer's ids
    titan::qwen3::Qwen3Model model(a, titan::DType::F32);
    model.initialize(3);
    titan::qwen3::export_hf_model(model, dir, titan::DType::F32);
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(titan::data::default_tokenizer_path() / f, dir / f);
  const auto tokenizer = titan::data::Tokenizer::load(dir);
  const std::string m = "generate --model-path " + dir.string() + " --max-new-tokens 2 --json ";
  Outcome r = titan(m + "--chat --system 'Be brief.' --prompt 'Hi there' --no-think");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<int64_t> want;
  for (int32_t id :
       tokenizer.encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n\n</think>\n\n"))
    want.push_back(id);
  EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_ids").get<std::vector<int64_t>>(), want) << r.out;
  r = titan(m + "--chat --prompt 'Hi there'");
  ASSERT_EQ(r.rc, 0) << r.err;
  want.clear();
  for (int32_t id : tokenizer.encode("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"))
    want.push_back(id);
  EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_ids").get<std::vector<int64_t>>(), want) << r.out;
  // --tools: the chat template shows them to the model, as a conversation's own "tools" in a prompts
  // file show them (the file's line keeps its own; a line without takes --tools).
  {
    const std::string tool_list =
        R"([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
    const fs::path tools_file = dir.parent_path() / "tools.json";
    std::ofstream(tools_file) << tool_list;
    r = titan(m + "--chat --prompt 'Hi there' --tools " + tools_file.string());
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<int64_t> with_tools =
        nlohmann::json::parse(r.out).at("prompt_ids").get<std::vector<int64_t>>();
    EXPECT_NE(with_tools, want);
    const std::string shown = tokenizer.decode(std::vector<int32_t>(with_tools.begin(), with_tools.end()));
    EXPECT_NE(shown.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
              std::string::npos)
        << shown;
    const fs::path lines = dir.parent_path() / "tools_lines.jsonl";
    std::ofstream(lines) << R"({"messages": [{"role": "user", "content": "Hi there"}], "tools": )"
                         << nlohmann::ordered_json::parse(tool_list).dump() << "}\n"
                         << R"({"messages": [{"role": "user", "content": "Hi there"}]})"
                         << "\n"
                         << R"({"prompt": "Hi there"})"
                         << "\n";
    for (const std::string& extra : {std::string(), " --tools " + tools_file.string()}) {
      r = titan("generate --model-path " + dir.string() + " --max-new-tokens 2 --chat --prompts-file " +
                lines.string() + extra);
      ASSERT_EQ(r.rc, 0) << r.err;
      std::istringstream out(r.out);
      std::vector<std::vector<int64_t>> ids;
      for (std::string line; std::getline(out, line);)
        ids.push_back(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int64_t>>());
      ASSERT_EQ(ids.size(), 3u) << r.out;
      EXPECT_EQ(ids[0], with_tools) << "a line's own tools" << extra;
      EXPECT_EQ(ids[1], extra.empty() ? want : with_tools) << "a line without tools" << extra;
      EXPECT_EQ(ids[2], extra.empty() ? want : with_tools) << "a prompt line" << extra;
    }
    r = titan(m + "--prompt 'Hi there' --tools " + tools_file.string());
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("--tools are shown to the model by the chat template; add --chat"),
              std::string::npos)
        << r.err;
    std::ofstream(tools_file, std::ios::trunc) << R"({"name": "get_weather"})";
    r = titan(m + "--chat --prompt 'Hi there' --tools " + tools_file.string());
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(
        r.err.find(tools_file.string() + ": must hold a JSON list of tools (function schemas), got object"),
        std::string::npos)
        << r.err;
  }
  // The text streams out token by token (a character cut between tokens waits for its end): what
  // is printed in all is the --json text, here over 48 tokens of a random model, many of them
  // pieces of multi-byte characters.
  const std::string sampled =
      "generate --model-path " + dir.string() +
      " --max-new-tokens 48 --ignore-eos --temperature 1 --seed 5 --prompt 'Hi there' ";
  r = titan(sampled + "--json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string text = nlohmann::json::parse(r.out).at("text").get<std::string>();
  r = titan(sampled);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, text + "\n");
  // A text prompt and completion to score are encoded as lm-eval-harness encodes a pair: the prompt's
  // trailing space moves to the completion, and the completion's ids are what follows the prompt's.
  {
    std::ofstream(dir.parent_path() / "pair.jsonl")
        << R"({"prompt": "The capital of France is ", "completion": "Paris"})"
        << "\n";
    r = titan("generate --model-path " + dir.string() + " --prompts-file " +
              (dir.parent_path() / "pair.jsonl").string());
    ASSERT_EQ(r.rc, 0) << r.err;
    const nlohmann::json row = nlohmann::json::parse(r.out);
    std::vector<int64_t> context, whole;
    for (int32_t id : tokenizer.encode("The capital of France is")) context.push_back(id);
    for (int32_t id : tokenizer.encode("The capital of France is Paris")) whole.push_back(id);
    EXPECT_EQ(row.at("prompt_ids").get<std::vector<int64_t>>(), context);
    EXPECT_EQ(row.at("completion_ids").get<std::vector<int64_t>>(),
              std::vector<int64_t>(whole.begin() + ptrdiff_t(context.size()), whole.end()));
    EXPECT_EQ(row.at("completion").get<std::string>(), " Paris");
  }
  // A multiple-choice line scores each choice as a "completion" line of the same prompt would be
  // scored, and ranks them: "pred" by summed log-probability, "pred_norm" per character (lm-eval's
  // acc and acc_norm), against its "answer" when it has one; stderr gives the accuracies.
  {
    const fs::path mc = dir.parent_path() / "mc.jsonl", each = dir.parent_path() / "each.jsonl";
    const std::vector<std::pair<std::string, std::vector<std::string>>> questions = {
        {"The capital of France is ", {"Paris", "Berlin", " a town of many bridges"}},
        {"Water boils at", {" 100 degrees", " ten", " the top of the mountain"}}};
    {
      std::ofstream mc_file(mc), each_file(each);
      for (size_t q = 0; q < questions.size(); ++q) {
        nlohmann::json line = {{"prompt", questions[q].first}, {"choices", questions[q].second}};
        if (q == 0) line["answer"] = 2;
        mc_file << line.dump() << "\n";
        for (const std::string& choice : questions[q].second)
          each_file << nlohmann::json{{"prompt", questions[q].first}, {"completion", choice}}.dump() << "\n";
      }
    }
    const std::string scoring = "generate --model-path " + dir.string() + " --prompts-file ";
    r = titan(scoring + mc.string());
    ASSERT_EQ(r.rc, 0) << r.err;
    const Outcome singles = titan(scoring + each.string());
    ASSERT_EQ(singles.rc, 0) << singles.err;
    std::istringstream mc_lines(r.out), single_lines(singles.out);
    std::string mc_line, single_line;
    size_t right = 0, right_norm = 0;
    for (size_t q = 0; q < questions.size(); ++q) {
      ASSERT_TRUE(std::getline(mc_lines, mc_line)) << r.out;
      const nlohmann::json row = nlohmann::json::parse(mc_line);
      const nlohmann::json& choices = row.at("choices");
      ASSERT_EQ(choices.size(), questions[q].second.size()) << mc_line;
      std::vector<double> sums, per_character;
      for (size_t c = 0; c < choices.size(); ++c) {
        ASSERT_TRUE(std::getline(single_lines, single_line)) << singles.out;
        const nlohmann::json single = nlohmann::json::parse(single_line);
        EXPECT_EQ(row.at("prompt_ids"), single.at("prompt_ids"));
        EXPECT_EQ(choices[c].at("completion_ids"), single.at("completion_ids")) << c;
        EXPECT_NEAR(choices[c].at("logprob").get<double>(), single.at("logprob").get<double>(), 1e-9) << c;
        EXPECT_EQ(choices[c].at("greedy"), single.at("greedy")) << c;
        sums.push_back(single.at("logprob").get<double>());
        per_character.push_back(sums.back() / double(questions[q].second[c].size()));  // ASCII
      }
      const int64_t pred = std::max_element(sums.begin(), sums.end()) - sums.begin();
      const int64_t pred_norm =
          std::max_element(per_character.begin(), per_character.end()) - per_character.begin();
      EXPECT_EQ(row.at("pred"), pred) << mc_line;
      EXPECT_EQ(row.at("pred_norm"), pred_norm) << mc_line;
      if (q == 0) {
        EXPECT_EQ(row.at("acc"), int(pred == 2)) << mc_line;
        EXPECT_EQ(row.at("acc_norm"), int(pred_norm == 2)) << mc_line;
        right += pred == 2;
        right_norm += pred_norm == 2;
      } else {
        EXPECT_FALSE(row.contains("answer") || row.contains("acc")) << mc_line;
      }
    }
    char accuracy[128];
    std::snprintf(accuracy, sizeof accuracy,
                  "1 multiple-choice questions with an answer: acc %.4f (%zu right), acc_norm %.4f",
                  double(right), right, double(right_norm));
    EXPECT_NE(r.err.find(accuracy), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("scored 6 completions"), std::string::npos) << r.err;
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {R"({"prompt": "x", "completion": "y", "answer": 0})",
              "\"answer\" is the index of the right one of \"choices\""},
             {R"({"prompt": "x", "choices": ["a", "b"], "answer": 2})",
              "\"answer\" must be the index of one of the 2 choices (0 .. 1)"},
             {R"({"prompt": "x", "choices": ["a"]})", "\"choices\" must be an array of at least two strings"},
             {R"({"prompt": "x", "choices": ["a", 3]})", "\"choices\" element 1 must be a non-empty string"},
             {R"({"prompt": "x", "choices": ["a", "b"], "completion": "c"})",
              "give one of \"completion\", \"completion_ids\" and \"choices\""}}) {
      std::ofstream(mc, std::ios::trunc) << text << "\n";
      r = titan(scoring + mc.string());
      EXPECT_EQ(r.rc, 1) << text;
      EXPECT_NE(r.err.find(mc.string() + " line 1: " + message), std::string::npos) << text << "\n" << r.err;
    }
  }
  // --stop: the text stops once it holds the string (kept), greedy and in beam search; a JSON array
  // gives several; without a tokenizer it is an error.
  const std::string greedy = "generate --model-path " + dir.string() +
                             " --max-new-tokens 12 --ignore-eos --prompt 'Hi there' --json ";
  r = titan(greedy);
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json whole = nlohmann::json::parse(r.out);
  const std::vector<int64_t> whole_ids = whole.at("ids").get<std::vector<int64_t>>();
  std::string third;  // the text of the third token, if it decodes to something to look for
  for (size_t k = 2; k < whole_ids.size() && third.empty(); ++k) {
    const std::string before =
        tokenizer.decode(std::vector<int32_t>(whole_ids.begin(), whole_ids.begin() + ptrdiff_t(k)));
    const std::string after =
        tokenizer.decode(std::vector<int32_t>(whole_ids.begin(), whole_ids.begin() + ptrdiff_t(k) + 1));
    if (after.starts_with(before) && after.size() > before.size() &&
        before.find(after.substr(before.size())) == std::string::npos &&
        after.substr(before.size()).find("\xEF\xBF\xBD") == std::string::npos)
      third = after.substr(before.size());
  }
  ASSERT_FALSE(third.empty()) << "no token of " << r.out << " adds text seen for the first time";
  const nlohmann::json stop_json = third;
  for (const std::string& flag :
       {"--stop " + shell_word(third),
        "--stop " + shell_word("[\"never seen here\", " + stop_json.dump() + "]")}) {
    r = titan(greedy + flag);
    ASSERT_EQ(r.rc, 0) << flag << "\n" << r.err;
    const nlohmann::json cut = nlohmann::json::parse(r.out);
    EXPECT_EQ(cut.at("stop_reason"), "stop string") << flag;
    const std::string text = cut.at("text").get<std::string>();
    EXPECT_TRUE(text.find(third) != std::string::npos &&
                whole.at("text").get<std::string>().starts_with(text))
        << flag << ": " << text;
    EXPECT_LT(cut.at("ids").size(), whole_ids.size()) << flag;
  }
  r = titan(greedy + "--num-beams 2 --stop " + shell_word(third));
  ASSERT_EQ(r.rc, 0) << r.err;
  {
    const nlohmann::json best = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
    if (best.at("stop_reason") == "stop string")
      EXPECT_NE(best.at("text").get<std::string>().find(third), std::string::npos) << r.out;
    else
      EXPECT_EQ(best.at("text").get<std::string>().find(third), std::string::npos)
          << "ran on past it: " << r.out;
  }
  r = titan(greedy + "--stop '[\"[INST]\"]'");  // a string that starts with '[': an array of one
  EXPECT_EQ(r.rc, 0) << r.err;
  // --bad-words: the text's tokens (as the tokenizer splits it alone) are never generated; a JSON
  // array gives several.
  {
    std::vector<int64_t> banned;
    for (int32_t id : tokenizer.encode(third)) banned.push_back(id);
    for (const std::string& flag : {"--bad-words " + shell_word(third),
                                    "--bad-words " + shell_word("[\"zzqx\", " + stop_json.dump() + "]")}) {
      r = titan(greedy + flag);
      ASSERT_EQ(r.rc, 0) << flag << "\n" << r.err;
      const std::vector<int64_t> ids = nlohmann::json::parse(r.out).at("ids").get<std::vector<int64_t>>();
      EXPECT_NE(ids, whole_ids) << flag;
      for (size_t k = 0; k + banned.size() <= ids.size(); ++k)
        EXPECT_FALSE(std::equal(banned.begin(), banned.end(), ids.begin() + ptrdiff_t(k)))
            << flag << " at " << k;
    }
    r = titan(greedy + "--bad-words ''");
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("--bad-words is empty; give it a value or leave it out"), std::string::npos)
        << r.err;
  }
  for (const char* bad : {"--stop ''", "--stop '[1, 2]'"}) {
    r = titan(greedy + bad);
    EXPECT_EQ(r.rc, 1) << bad;
    EXPECT_NE(r.err.find("error: --stop"), std::string::npos) << r.err;
  }
  // A file's "prompt" lines under --chat are user messages as --prompt is, and come back as text; a
  // "messages" line is a whole conversation, rendered with the assistant's turn opened.
  {
    const fs::path file = dir.parent_path() / "chat.jsonl";
    std::ofstream(file) << "{\"prompt\": \"Hi there\"}\n"
                           "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                           "{\"role\": \"user\", \"content\": \"Hi there\"}]}\n";
    r = titan("generate --model-path " + dir.string() + " --max-new-tokens 2 --chat --prompts-file " +
              file.string());
    ASSERT_EQ(r.rc, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    EXPECT_EQ(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int64_t>>(), want) << line;
    EXPECT_TRUE(nlohmann::json::parse(line).at("text").is_string()) << line;
    ASSERT_TRUE(std::getline(lines, line));
    EXPECT_EQ(nlohmann::json::parse(line).at("index"), 1) << line;
    std::vector<int64_t> conversation;
    for (int32_t id :
         tokenizer.encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                          "<|im_start|>assistant\n"))
      conversation.push_back(id);
    EXPECT_EQ(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int64_t>>(), conversation) << line;
    // "continue_final_message": the final assistant message is left open for the model to go on
    // with (transformers' continue_final_message: cut after its content, here with its trailing
    // space, which the template keeps), not a new turn.
    {
      std::ofstream(file, std::ios::trunc)
          << "{\"messages\": [{\"role\": \"user\", \"content\": \"Name a colour.\"}, {\"role\": "
             "\"assistant\", \"content\": \"The colour is \"}], \"continue_final_message\": true}\n";
      const Outcome open = titan("generate --model-path " + dir.string() +
                                 " --max-new-tokens 2 --chat --prompts-file " + file.string());
      ASSERT_EQ(open.rc, 0) << open.err;
      std::vector<int64_t> continued;
      for (int32_t id : tokenizer.encode("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
                                         "<think>\n\n</think>\n\nThe colour is "))
        continued.push_back(id);
      EXPECT_EQ(nlohmann::json::parse(open.out).at("prompt_ids").get<std::vector<int64_t>>(), continued)
          << open.out;
    }
    const std::string base =
        "generate --model-path " + dir.string() + " --max-new-tokens 2 --prompts-file " + file.string();
    const std::string user = "{\"role\": \"user\", \"content\": \"x\"}";
    for (const auto& [text, args, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"{\"messages\": [" + user + "]}\n", "",
              file.string() +
                  " line 1: \"messages\" is a conversation, rendered with the chat template: add --chat"},
             {"\n{\"messages\": [" + user + "]}\n", " --chat --system hi",
              file.string() + " line 2: --system goes before each \"prompt\""},
             {"{\"prompt\": \"x\", \"tools\": []}\n", " --chat",
              "line 1: \"tools\" go with a conversation's \"messages\""},
             {"{\"messages\": []}\n", " --chat", "line 1: \"messages\" must be a non-empty array"},
             {"{\"messages\": [" + user + ", {\"role\": \"narrator\", \"content\": \"y\"}]}\n", " --chat",
              file.string() +
                  " line 1: message 1: role 'narrator' is not one of system, user, assistant, tool"},
             {"{\"prompt\": \"x\", \"continue_final_message\": true}\n", " --chat",
              "line 1: \"continue_final_message\" goes with a conversation's \"messages\""},
             {"{\"messages\": [" + user + "], \"continue_final_message\": 1}\n", " --chat",
              "line 1: \"continue_final_message\" must be true or false"},
             {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"content\": \"y\"}, " + user +
                  "], \"continue_final_message\": true}\n",
              " --chat", "line 1: message 2: continue_final_message continues the assistant's message"}}) {
      std::ofstream(file, std::ios::trunc) << text;
      r = titan(base + args);
      EXPECT_EQ(r.rc, 1) << text;
      EXPECT_NE(r.err.find(message), std::string::npos) << text << "\n" << r.err;
    }
  }
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {m + "--prompt hi --no-think", "--no-think shapes a --chat prompt; add --chat"},
           {m + "--prompt hi --system x", "--system shapes a --chat prompt; add --chat"},
           {m + "--chat --prompt-ids 1", "--chat renders --prompt as a user message; give --prompt"}}) {
    r = titan(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  }
}

// --interactive: a conversation on stdin, one message a line. Each turn's reply is what a fresh
// --chat run gives the whole conversation so far (the earlier replies as assistant messages, the
// stop token dropped, as a --prompts-file "messages" line renders it) with the turn's seed, and only
// the positions after those the conversation shares with the KV cache run again: "cached_tokens" is
// that shared start. /reset forgets the conversation but the system message; a line ending in a
// backslash goes on to the next; the streamed text is the JSON text. A turn that would pass
// max_seq_len is refused, the others answered, and the run exits 1.
TEST(CommandLine, GenerateChatsOnStdinAsAFreshRunWouldAnswerTheConversation) {
  const fs::path dir = tt::temp_dir("cli_generate_interactive_" + std::to_string(getpid())) / "model";
  titan::qwen3::ModelArgs a = tt::small_args(1, false);
  a.vocab_size = 151936;  // the real tokenizer's ids
  a.max_seq_len = 128;
  {
    titan::qwen3::Qwen3Model model(a, titan::DType::F32);
    model.initialize(4);
    titan::qwen3::export_hf_model(model, dir, titan::DType::F32);
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(titan::data::default_tokenizer_path() / f, dir / f);
  const auto tokenizer = titan::data::Tokenizer::load(dir);
  const fs::path input = dir.parent_path() / "input.txt";
  std::ofstream(input) << "Hi there\nTell me \\\nmore\n/reset\nAgain\n";
  // Sampled among the 5 most likely ids: a random model's logits are all but even, and a draw from
  // all of them would follow the rounding of a prompt run in pieces or whole.
  const std::string model =
      "generate --model-path " + dir.string() + " --max-new-tokens 6 --system 'Be brief.' ";
  const std::string sampled = " --temperature 1 --top-k 5 --seed 5 ";
  Outcome r = titan(model + sampled + "--interactive --no-think --json < " + input.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<nlohmann::json> turns;
  {
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) turns.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(turns.size(), 3u) << r.out;
  // The conversation of each turn, as a fresh run gets it: a --prompts-file line.
  auto message = [](const std::string& role, const std::string& content) {
    return nlohmann::ordered_json{{"role", role}, {"content", content}};
  };
  auto reply = [&](const nlohmann::json& turn) {
    std::vector<int32_t> ids = turn.at("ids").get<std::vector<int32_t>>();
    if (turn.at("stop_reason") == "stop token") ids.pop_back();
    return tokenizer.decode(ids);
  };
  const auto system = message("system", "Be brief.");
  const std::vector<nlohmann::ordered_json> conversations = {
      {system, message("user", "Hi there")},
      {system, message("user", "Hi there"), message("assistant", reply(turns[0])),
       message("user", "Tell me \nmore")},
      {system, message("user", "Again")}};
  std::vector<int64_t>
      cached;  // what the KV cache holds after each turn: prompt and reply but its last token
  for (size_t t = 0; t < turns.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t + 1));
    const fs::path file = dir.parent_path() / "turn.jsonl";
    std::ofstream(file, std::ios::trunc)
        << nlohmann::ordered_json{{"messages", conversations[t]}}.dump() << "\n";
    const Outcome fresh = titan("generate --model-path " + dir.string() +
                                " --max-new-tokens 6 --temperature 1 --top-k 5 --chat --no-think --seed " +
                                std::to_string(5 + t) + " --prompts-file " + file.string());
    ASSERT_EQ(fresh.rc, 0) << fresh.err;
    const nlohmann::json want = nlohmann::json::parse(fresh.out);
    EXPECT_EQ(turns[t].at("turn"), t + 1);
    EXPECT_EQ(turns[t].at("ids"), want.at("ids"));
    EXPECT_EQ(turns[t].at("text"), reply(want)) << "the reply, without the stop token that ended it";
    EXPECT_EQ(turns[t].at("stop_reason"), want.at("stop_reason"));
    const std::vector<int64_t> prompt = want.at("prompt_ids").get<std::vector<int64_t>>();
    EXPECT_EQ(turns[t].at("prompt_tokens"), prompt.size());
    size_t shared = 0;
    while (shared + 1 < prompt.size() && shared < cached.size() && cached[shared] == prompt[shared]) ++shared;
    EXPECT_EQ(turns[t].at("cached_tokens"), shared);
    if (t > 0) {
      EXPECT_GT(shared, 0u) << "the system message at least is cached";
    }
    cached = prompt;
    const std::vector<int64_t> ids = want.at("ids").get<std::vector<int64_t>>();
    cached.insert(cached.end(), ids.begin(), ids.end() - 1);
  }
  // Streamed, the replies are the JSON texts, a line each.
  r = titan(model + sampled + "--interactive --no-think < " + input.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string texts;
  for (const nlohmann::json& turn : turns) texts += turn.at("text").get<std::string>() + "\n";
  EXPECT_EQ(r.out, texts);
  EXPECT_NE(r.err.find("generate: turn 2: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the conversation is forgotten"), std::string::npos) << r.err;
  // A turn past max_seq_len is refused and left out of the conversation: the next is answered as a
  // first turn; the status says so.
  {
    std::ofstream long_input(dir.parent_path() / "long.txt");
    for (int i = 0; i < 120; ++i) long_input << "word" << i << ' ';
    long_input << "\nHi\n";
  }
  r = titan("generate --model-path " + dir.string() + " --max-new-tokens 8 --interactive --json < " +
            (dir.parent_path() / "long.txt").string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("they pass the model's max_seq_len (" + std::to_string(a.max_seq_len) +
                       "); the message is left out"),
            std::string::npos)
      << r.err;
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  {
    const nlohmann::json answered = nlohmann::json::parse(r.out);
    EXPECT_EQ(answered.at("turn"), 1) << r.out;
    std::vector<int64_t> hi;
    for (int32_t id : tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"))
      hi.push_back(id);
    EXPECT_EQ(answered.at("prompt_tokens"), hi.size()) << "the refused message is not in the conversation";
  }
  // An answer that could never fit is an error before any turn.
  r = titan("generate --model-path " + dir.string() + " --max-new-tokens 125 --interactive < " +
            input.string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(
      r.err.find("--interactive: 9 tokens of the shortest first turn + --max-new-tokens 125 pass the model's "
                 "max_seq_len (128)"),
      std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  for (const auto& [args, error] : std::vector<std::pair<std::string, std::string>>{
           {"--interactive --prompt hi",
            "give one of --prompt, --prompt-ids, --prompts-file and --interactive, not more"},
           {"--interactive --num-beams 2 --temperature 0", "--num-beams 2: --interactive streams each reply"},
           {"--interactive --length-penalty 2",
            "--length-penalty shapes beam search; --interactive streams its replies"},
           {"--interactive --num-return-sequences 2 --temperature 1",
            "--num-return-sequences 2: --interactive gives one reply a turn"}}) {
    r = titan(model + args + " < " + input.string());
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(error), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

// --prompt-lookup (and generation_config.json's prompt_lookup_num_tokens): the tokens of greedy
// search (and sampling's, for the same seed), in fewer passes on a prompt that repeats itself, said on
// stderr; beside beams the flag is an error and the file's key a note.
TEST(CommandLine, GeneratePromptLookupGivesGreedysTokens) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  const fs::path dir = tt::temp_dir("cli_generate_lookup_" + std::to_string(getpid()));
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(oracle / f, dir / f);
  const std::string args =
      "generate --model-path " + dir.string() +
      " --prompt-ids 17,400,2048,5,99,17,400,2048,5,99,17,400,2048,5,99 --max-new-tokens 24";
  const Outcome greedy = titan(args);
  ASSERT_EQ(greedy.rc, 0) << greedy.err;
  Outcome r = titan(args + " --prompt-lookup 5");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, greedy.out);
  EXPECT_NE(r.err.find("prompt lookup decoding: up to 5 draft tokens a step (n-grams of 2)"),
            std::string::npos)
      << r.err;
  const size_t at = r.err.find("generate: prompt lookup: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  long long kept = 0, drafted = 0, passes = 0;
  ASSERT_EQ(std::sscanf(r.err.c_str() + at,
                        "generate: prompt lookup: %lld of %lld drafted tokens kept, %lld passes", &kept,
                        &drafted, &passes),
            3)
      << r.err;
  EXPECT_GT(kept, 0) << r.err;
  EXPECT_EQ(passes + kept, 24) << r.err;
  // Sampled: the same text for the same seed.
  const Outcome sampled = titan(args + " --temperature 0.8 --seed 7");
  r = titan(args + " --temperature 0.8 --seed 7 --prompt-lookup 5");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, sampled.out) << r.err;
  r = titan(args + " --prompt-lookup 5 --num-beams 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--prompt-lookup 5: beam search runs its beams as one batch"), std::string::npos)
      << r.err;
  const std::string file = (dir / "generation_config.json").string();
  std::ofstream(file) << R"({"prompt_lookup_num_tokens": 4})";
  r = titan(args);
  EXPECT_EQ(r.out, greedy.out);
  EXPECT_NE(r.err.find("up to 4 draft tokens a step (n-grams of 2), as " + file + " says"), std::string::npos)
      << r.err;
  std::ofstream(file, std::ios::trunc) << R"({"prompt_lookup_num_tokens": 4, "num_beams": 2})";
  r = titan(args);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(
      r.err.find("sets prompt_lookup_num_tokens 4, not applied: beam search runs its beams as one batch"),
      std::string::npos)
      << r.err;
}

// The model's own eos_token_id stops generation as transformers' generate stops: config.json's
// (a number), or generation_config.json's (a list); --ignore-eos goes on past it.
TEST(CommandLine, GenerateStopsAtTheModelsEosTokenId) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  const titan::qwen3::Generation g =
      titan::qwen3::generate(*titan::qwen3::load_hf_model(oracle, titan::DType::F32), prompt, 8,
                             titan::qwen3::SamplingOptions{}, {});
  const int64_t eos = g.ids[3];
  const size_t first = size_t(std::find(g.ids.begin(), g.ids.end(), eos) - g.ids.begin());
  std::string until_eos;
  for (size_t i = 0; i <= first; ++i) until_eos += (until_eos.empty() ? "" : ",") + std::to_string(g.ids[i]);

  const fs::path dir = tt::temp_dir("cli_generate_eos_" + std::to_string(getpid()));
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(oracle / f, dir / f);
  auto set_eos = [&](const fs::path& file, const nlohmann::json& value) {
    nlohmann::json c =
        fs::exists(file) ? nlohmann::json::parse(std::ifstream(file)) : nlohmann::json::object();
    c["eos_token_id"] = value;
    std::ofstream(file) << c.dump();
  };
  const std::string args =
      "generate --model-path " + dir.string() + " --prompt-ids 17,400,2048,5 --max-new-tokens 8";
  set_eos(dir / "config.json", eos);
  Outcome r = titan(args);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, until_eos + "\n");
  EXPECT_NE(r.err.find("stopped at stop token"), std::string::npos) << r.err;
  r = titan(args + " --ignore-eos");
  EXPECT_NE(r.err.find("8 new tokens"), std::string::npos) << r.err;

  set_eos(dir / "config.json", nullptr);
  set_eos(dir / "generation_config.json", nlohmann::json::array({4095, eos}));
  r = titan(args);
  EXPECT_EQ(r.out, until_eos + "\n") << r.err;
}

// Without a sampling flag, generation samples as the model's generation_config.json says (Qwen3's
// own: do_sample, temperature 0.6, top_k 20, top_p 0.95; here with a min_p too) and with its
// repetition_penalty and no_repeat_ngram_size, as transformers' generate does: the ids are the
// library's sampler's with those options and the seed; a sampling flag overrides the sampling
// (--temperature 0: greedy), --repetition-penalty and --no-repeat-ngram-size the processors; a key
// titan's sampler lacks is named.
TEST(CommandLine, GenerateSamplesAsTheModelsGenerationConfigSays) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  const fs::path dir = tt::temp_dir("cli_generate_sampling_" + std::to_string(getpid()));
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(oracle / f, dir / f);
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": true, "temperature": 0.6, "top_k": 20,
      "top_p": 0.95, "repetition_penalty": 3, "min_p": 0.05, "no_repeat_ngram_size": 2, "num_beams": 2,
      "eta_cutoff": 0.05})";
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  auto ids_of = [&](const titan::qwen3::SamplingOptions& o) {
    const titan::qwen3::Generation g =
        titan::qwen3::generate(*titan::qwen3::load_hf_model(oracle, titan::DType::F32), prompt, 10, o, {});
    std::string line;
    for (int64_t id : g.ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    return line + "\n";
  };
  titan::qwen3::SamplingOptions qwen3_defaults;
  qwen3_defaults.temperature = 0.6;
  qwen3_defaults.top_k = 20;
  qwen3_defaults.top_p = 0.95;
  qwen3_defaults.min_p = 0.05;
  qwen3_defaults.eta_cutoff = 0.05;
  qwen3_defaults.repetition_penalty = 3;
  qwen3_defaults.no_repeat_ngram_size = 2;
  qwen3_defaults.seed = 3;
  const std::string file = (dir / "generation_config.json").string();
  const std::string args =
      "generate --model-path " + dir.string() + " --prompt-ids 17,400,2048,5 --max-new-tokens 10";
  Outcome r = titan(args + " --seed 3");
  EXPECT_EQ(r.rc, 0) << r.err;
  {  // num_beams 2 with do_sample: beam sampling, the library's
    const titan::qwen3::Generation best =
        titan::qwen3::beam_search(*titan::qwen3::load_hf_model(oracle, titan::DType::F32), prompt, 10,
                                  {2, 1.0, titan::qwen3::EarlyStopping::Heuristic, 1}, qwen3_defaults, {})[0];
    std::string line;
    for (int64_t id : best.ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    EXPECT_EQ(r.out, line + "\n") << r.err;
  }
  EXPECT_NE(
      r.err.find("sampling as " + file +
                 " says: temperature 0.6, top_k 20, top_p 0.95, min_p 0.05, typical_p 1, epsilon_cutoff 0, "
                 "eta_cutoff 0.05 (seed 3"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("repetition_penalty 3, as " + file + " says"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no_repeat_ngram_size 2, as " + file + " says"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("beam sampling as " + file + " says: 2 beams"), std::string::npos) << r.err;
  // --temperature 0 turns sampling off: the file's num_beams then searches, as transformers'
  // generate(do_sample=False) would; --num-beams 1 is greedy, still with the file's repetition penalty
  // (transformers applies it to greedy search too) unless --repetition-penalty says otherwise.
  titan::qwen3::SamplingOptions greedy;
  greedy.repetition_penalty = 3;
  greedy.no_repeat_ngram_size = 2;
  r = titan(args + " --temperature 0");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("beam search as " + file + " says: 2 beams"), std::string::npos) << r.err;
  r = titan(args + " --temperature 0 --num-beams 1");
  EXPECT_EQ(r.out, ids_of(greedy)) << r.err;
  EXPECT_EQ(r.err.find("sampling as"), std::string::npos) << r.err;
  r = titan(args + " --temperature 0 --num-beams 1 --repetition-penalty 1 --no-repeat-ngram-size 0");
  EXPECT_EQ(r.out, ids_of({})) << r.err;
  EXPECT_NE(ids_of(greedy), ids_of({}))
      << "the penalty changes these ten tokens, so the runs above tell them apart";
  // Each flag replaces its own field of the file's sampling, the others stay, as transformers'
  // generate(temperature=1.4) keeps the config's top_k and top_p (--num-beams 1: without the file's
  // beams).
  titan::qwen3::SamplingOptions flags = qwen3_defaults;
  flags.seed = 0;
  flags.temperature = 1.4;
  flags.epsilon_cutoff = 0.02;
  flags.eta_cutoff = 0.1;
  flags.repetition_penalty = 3;
  flags.no_repeat_ngram_size = 2;
  r = titan(args + " --temperature 1.4 --epsilon-cutoff 0.02 --eta-cutoff 0.1 --num-beams 1");
  EXPECT_EQ(r.out, ids_of(flags)) << r.err;
  EXPECT_NE(
      r.err.find("sampling as " + file +
                 " says, except --temperature, --epsilon-cutoff, --eta-cutoff: temperature 1.4, top_k 20, "
                 "top_p 0.95, min_p 0.05"),
      std::string::npos)
      << r.err;
  // Its max_new_tokens and min_new_tokens, unless the flags say otherwise.
  std::ofstream(dir / "generation_config.json", std::ios::trunc)
      << R"({"max_new_tokens": 3, "min_new_tokens": 2, "stop_strings": ["x"], "suppress_tokens": [], "eos_token_id": )"
      << ids_of({}).substr(0, ids_of({}).find(',')) << "}";
  const std::string bare = "generate --model-path " + dir.string() + " --prompt-ids 17,400,2048,5";
  r = titan(bare);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("max_new_tokens 3, as " + file + " says"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("min_new_tokens 2, as " + file + " says"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file + "'s stop_strings not applied: there is no tokenizer to read the text"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("suppress_tokens"), std::string::npos)
      << "an empty list suppresses nothing: " << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 2)
      << "three new tokens, the first not the stop id: " << r.out;
  r = titan(bare + " --max-new-tokens 5 --min-new-tokens 0");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, ids_of({}).substr(0, ids_of({}).find(',')) + "\n")
      << "the greedy first token is the config's eos_token_id: it stops there";
  // Its processors beyond the sampler's, greedy here, each alone: applied as the library applies them
  // (the same tokens), each changing the free run's tokens, and said.
  {
    auto run_of = [&](const titan::qwen3::SamplingOptions& o, const std::vector<int64_t>& stop) {
      const titan::qwen3::Generation g = titan::qwen3::generate(
          *titan::qwen3::load_hf_model(oracle, titan::DType::F32), prompt, 10, o, stop);
      std::string line;
      for (int64_t id : g.ids) line += (line.empty() ? "" : ",") + std::to_string(id);
      return line + "\n";
    };
    std::vector<int64_t> f;
    for (std::stringstream free_ids(ids_of({})); free_ids.good();) {
      std::string id;
      if (std::getline(free_ids, id, ',') && !id.empty() && id != "\n") f.push_back(std::stoll(id));
    }
    ASSERT_EQ(f.size(), 10u);
    const std::string f0 = std::to_string(f[0]), f1 = std::to_string(f[1]);
    struct Case {
      const char* key;
      std::string config;
      titan::qwen3::SamplingOptions options;
      std::vector<int64_t> stop;
    };
    std::vector<Case> cases(7);
    cases[0] = {"begin_suppress_tokens", R"({"begin_suppress_tokens": [)" + f0 + "]}", {}, {}};
    cases[0].options.begin_suppress_tokens = {f[0]};
    cases[1] = {"suppress_tokens", R"({"suppress_tokens": [)" + f1 + "]}", {}, {}};
    cases[1].options.suppress_tokens = {f[1]};
    cases[2] = {"bad_words_ids", R"({"bad_words_ids": [[)" + f0 + ", " + f1 + "]]}", {}, {}};
    cases[2].options.bad_words_ids = {{f[0], f[1]}};
    cases[3] = {
        "sequence_bias", R"({"sequence_bias": [[[)" + f0 + "], -100], [[" + f0 + ", 7], 1.5]]}", {}, {}};
    cases[3].options.sequence_bias = {{{f[0]}, -100}, {{f[0], 7}, 1.5}};
    const std::string eos_at = std::to_string(prompt.size() + 4);
    cases[4] = {"min_length", R"({"eos_token_id": )" + f1 + R"(, "min_length": )" + eos_at + "}", {}, {f[1]}};
    cases[4].options.min_length = int64_t(prompt.size()) + 4;
    int64_t other = 7;  // an id the free run does not take
    while (std::find(f.begin(), f.end(), other) != f.end()) ++other;
    const std::string o = std::to_string(other);
    cases[5] = {"forced_eos_token_id", R"({"forced_eos_token_id": )" + o + "}", {}, {}};
    cases[5].options.forced_eos_token_ids = {other};
    cases[6] = {"exponential_decay_length_penalty",
                R"({"eos_token_id": )" + o + R"(, "exponential_decay_length_penalty": [3, 100.0]})",
                {},
                {other}};
    cases[6].options.length_decay_start = 3;
    cases[6].options.length_decay_factor = 100;
    for (const Case& c : cases) {
      std::ofstream(dir / "generation_config.json", std::ios::trunc) << c.config;
      r = titan(args);
      EXPECT_EQ(r.rc, 0) << c.key << "\n" << r.err;
      EXPECT_EQ(r.out, run_of(c.options, c.stop)) << c.key << "\n" << r.err;
      EXPECT_NE(run_of(c.options, c.stop), run_of({}, c.stop))
          << c.key << " changes nothing here: the case proves nothing";
      EXPECT_NE(r.err.find(std::string("generate: ") + c.key + " applied, as " + file + " says"),
                std::string::npos)
          << c.key << "\n"
          << r.err;
    }
    std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"bad_words_ids": [[5, 99999999]]})";
    r = titan(args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("bad_words_ids[0][1] is id 99999999, outside the model's vocabulary"),
              std::string::npos)
        << r.err;
  }
  std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"([0.6, 20])";
  r = titan(args);
  EXPECT_NE(r.err.find("generation_config.json: a generation config is a JSON object, got array"),
            std::string::npos)
      << r.err;
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": true, "top_k": "twenty"})";
  r = titan(args);
  EXPECT_NE(r.err.find("generation_config.json: 'top_k' must be a number or null, got \"twenty\""),
            std::string::npos)
      << r.err;
}

// The trial's findings, each as the user met it.

// A native checkpoint of the tiny job, trained once per program (two steps, one checkpoint).
fs::path tiny_checkpoint() {
  static const fs::path step = [] {
    const fs::path dump = tt::temp_dir("cli_tiny_run_" + std::to_string(getpid()));
    std::string out;
    const int rc =
        tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                            tt::cli_args(tt::tiny_job(dump, {{"training.steps", "2"},
                                                             {"checkpoint.enable", "true"},
                                                             {"checkpoint.interval", "2"},
                                                             {"validation.enable", "false"}})),
                        &out);
    EXPECT_EQ(rc, 0) << out;
    return dump / "checkpoint" / "step-2";
  }();
  return step;
}

// --overwrite replaces the whole folder: one holding anything but an export's own files (a user's
// notes, a nested export) is refused naming the first such entry, and an export inside another is
// refused at once; a folder of an export's files alone is still replaced.
TEST(CommandLine, ExportOverwriteReplacesOnlyAFolderOfAnExportsOwnFiles) {
  const fs::path step = tiny_checkpoint();
  const fs::path ex = tt::temp_dir("cli_export_overwrite_" + std::to_string(getpid()));
  const std::string export_to = "export --checkpoint " + step.string() + " --out ";
  ASSERT_EQ(titan(export_to + (ex / "f32").string()).rc, 0);

  Outcome r = titan(export_to + (ex / "f32" / "sub").string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("titan export: error: --out: '" + (ex / "f32" / "sub").string() +
                       "' lies inside the export '" + (ex / "f32").string() +
                       "' (a later --overwrite of that one would delete it); export elsewhere"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(ex / "f32" / "sub"));

  std::ofstream(ex / "f32" / "eval_notes.txt") << "kept";
  r = titan(export_to + (ex / "f32").string() + " --overwrite");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(
      r.err.find("titan export: error: --out: '" + (ex / "f32").string() +
                 "' holds 'eval_notes.txt', which is not a file of a titan export: --overwrite replaces "
                 "the whole folder and would delete it; move it out, or export elsewhere"),
      std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(ex / "f32" / "eval_notes.txt"));
  fs::remove(ex / "f32" / "eval_notes.txt");
  fs::create_directories(ex / "f32" / "sub");
  r = titan(export_to + (ex / "f32").string() + " --overwrite");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("holds 'sub/', which is not a file of a titan export"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_directory(ex / "f32" / "sub"));
  fs::remove(ex / "f32" / "sub");
  r = titan(export_to + (ex / "f32").string() + " --overwrite");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(ex / "f32" / "tokenizer.json")) << "the replaced export ships its tokenizer again";

  // A symbolic link at --out (to an export, to an empty folder, or dangling) is named before the export
  // is written, where --overwrite failed at its end ("cannot replace ...: not a directory") and a
  // dangling one was said to "already exist"; the folder it points to is untouched.
  fs::create_directories(ex / "empty");
  for (const fs::path& target : {ex / "f32", ex / "empty", ex / "absent"}) {
    fs::remove(ex / "link");
    fs::create_directory_symlink(target, ex / "link");
    r = titan(export_to + (ex / "link").string() + " --overwrite");
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(
        r.err.find("titan export: error: --out: '" + (ex / "link").string() + "' is a symbolic link (to '" +
                   target.string() + "'): an export is written in place of --out, not through a link"),
        std::string::npos)
        << r.err;
    EXPECT_TRUE(fs::is_symlink(ex / "link"));
  }
  EXPECT_TRUE(fs::exists(ex / "f32" / "tokenizer.json"));
  EXPECT_TRUE(fs::is_empty(ex / "empty"));
}

// A --stop or --bad-words that starts as a JSON array but is not one is an error naming the flag and
// the fault, not one literal string that never matches.
TEST(CommandLine, GenerateRefusesAMalformedArrayOfStrings) {
  // (A model of the tokenizer's vocabulary: --stop and --bad-words are texts.)
  const std::string m = "generate --checkpoint " + tiny_checkpoint().string() + " --prompt hi ";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--stop '[\"<l\"'", "titan generate: error: --stop [\"<l\": invalid JSON at line 1, column "},
           {"--stop '[\"<l\",]'",
            "titan generate: error: --stop [\"<l\",]: invalid JSON at line 1, column 6: trailing comma"},
           {"--stop \"['<l']\"", "titan generate: error: --stop ['<l']: invalid JSON at line 1, column 2: "},
           {"--bad-words '[\"<l\"'", "titan generate: error: --bad-words [\"<l\": invalid JSON"},
           {"--stop '[INST]'",
            "(a text starting with '[' is read as a JSON array of strings); a string that starts with '[' is "
            "given as an array of one, e.g. '[\"[INST]\"]'"},
           {"--stop '[1]'",
            "--stop [1]: a JSON array gives several strings; this one holds something else"}}) {
    const Outcome r = titan(m + args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  // The way out the error names works.
  const Outcome r = titan(m + "--stop '[\"[INST]\"]' --max-new-tokens 2");
  EXPECT_EQ(r.rc, 0) << r.err;
}

// generation_config.json's eos_token_id must be ids of the vocabulary: a string or an id past it is
// an error naming the file, the field and the rule (not a stop that silently never happens).
TEST(CommandLine, GenerateRefusesAnEosTokenIdOutsideTheVocabulary) {
  const fs::path oracle = tt::oracle_dir("tiny_dense");
  const fs::path dir = tt::temp_dir("cli_generate_bad_eos_" + std::to_string(getpid()));
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(oracle / f, dir / f);
  const std::string file = (dir / "generation_config.json").string();
  for (const std::string value : {"\"x\"", "99999", "[2, -1]", "[2, 1.5]"}) {
    std::ofstream(file) << "{\"eos_token_id\": " << value << "}";
    for (const char* more : {"", " --ignore-eos"}) {
      const Outcome r = titan("generate --model-path " + dir.string() + " --prompt-ids 1" + more);
      EXPECT_EQ(r.rc, 1) << value << more;
      EXPECT_NE(
          r.err.find("titan generate: error: " + file +
                     ": 'eos_token_id' must be a token id or a list of them, each an integer within the "
                     "model's vocabulary [0, 4096), got " +
                     nlohmann::json::parse(value).dump()),
          std::string::npos)
          << value << more << "\n"
          << r.err;
    }
  }
  // config.json's may come from another model with a larger vocabulary (a run that took a Qwen3
  // config for its own smaller tokenizer trains and exports it, and transformers loads it): a note,
  // and generation goes on.
  fs::remove(file);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config["eos_token_id"] = nlohmann::json::array({2, 151645});
  std::ofstream(dir / "config.json") << config.dump();
  const Outcome r = titan("generate --model-path " + dir.string() + " --prompt-ids 1 --max-new-tokens 2");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("note: " + (dir / "config.json").string() +
                       ": eos_token_id 151645 is outside the model's vocabulary [0, 4096): not a stop token"),
            std::string::npos)
      << r.err;
}

// A prompt that leaves too few positions names the flag, how many new tokens fit and the config
// field, once.
TEST(CommandLine, GenerateSaysHowManyNewTokensFit) {
  const std::string model = tt::oracle_dir("tiny_dense").string();
  std::string ids = "1";
  for (int i = 1; i < 510; ++i) ids += ",1";
  Outcome r = titan("generate --model-path " + model + " --prompt-ids " + ids + " --max-new-tokens 5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("titan generate: error: 510 prompt tokens + --max-new-tokens 5 pass the model's "
                       "max_seq_len 512 (" +
                       model +
                       "/config.json's max_position_embeddings): at most 2 new "
                       "tokens fit; lower --max-new-tokens or shorten the prompt\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("generate: 510"), std::string::npos) << "the command named twice: " << r.err;
  r = titan("generate --model-path " + model + " --prompt-ids " + ids + " --max-new-tokens 2");
  EXPECT_EQ(r.rc, 0) << r.err;
}

// Under greedy decoding --seed does nothing, and is refused as the truncation flags are.
TEST(CommandLine, GenerateRefusesASeedUnderGreedyDecoding) {
  const std::string m = "generate --model-path " + tt::oracle_dir("tiny_dense").string() + " --prompt-ids 1";
  Outcome r = titan(m + " --seed 5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--seed seeds sampling, and this run decodes greedily (the model has no "
                       "generation_config.json: greedy by default): it would do nothing"),
            std::string::npos)
      << r.err;
  r = titan(m + " --seed 5 --temperature 1 --max-new-tokens 2");
  EXPECT_EQ(r.rc, 0) << r.err;
}

// The help says what applies when a flag is absent: the model's generation_config.json, else a
// value; no "[default: X]" that the generation config would contradict.
TEST(CommandLine, GenerateHelpStatesTheDefaultsThatApply) {
  const Outcome r = titan("generate --help");
  EXPECT_EQ(r.rc, 0);
  for (const char* option :
       {"--temperature", "--top-k", "--top-p", "--repetition-penalty", "--max-new-tokens", "--num-beams",
        "--length-penalty", "--early-stopping", "--min-new-tokens"}) {
    const size_t at = r.out.find(std::string("  ") + option + " VALUE");
    ASSERT_NE(at, std::string::npos) << option << "\n" << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_EQ(line.find("[default: "), std::string::npos) << line;
    EXPECT_NE(line.find("generation_config.json"), std::string::npos) << line;
  }
  EXPECT_NE(r.out.find("[default: float32]"), std::string::npos) << "other options still show theirs";
}

// Smaller findings: each error names the flag and the way out.
TEST(CommandLine, ErrorsNameTheFlagAndTheWayOut) {
  const fs::path dir = tt::temp_dir("cli_errors_" + std::to_string(getpid()));
  const std::string model = tt::oracle_dir("tiny_dense").string();
  const fs::path step = tiny_checkpoint();
  // A run that has started (run_info.json) but logged no step.
  fs::create_directories(dir / "run");
  std::ofstream(dir / "run" / "run_info.json") << "{}";
  fs::create_directories(dir / "broken");
  std::ofstream(dir / "broken" / "metrics.jsonl")
      << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2,, \"loss\": 2}\n";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"plan --config " + tt::debugmodel_toml().string() + " --memory-per-rank 96",
            "titan plan: error: --memory-per-rank '96' is 96 bytes, too few for a rank's memory: give a "
            "unit"},
           {"report " + (dir / "run").string(),
            "titan report: error: '" + (dir / "run" / "metrics.jsonl").string() +
                "' does not exist: the run (its run_info.json is there) logged no step (yet)"},
           {"report " + (dir / "broken").string(),
            "'" + (dir / "broken" / "metrics.jsonl").string() + "', line 2: not a JSON record: column "},
           {"report " + (dir / "broken").string() + " --out " + (dir / "missing" / "a.html").string(),
            "titan report: error: --out: the folder '" + (dir / "missing").string() + "' does not exist"},
           {"debug dump --model-path " + model + " --tokens " + (dir / "t.safetensors").string() + " --out " +
                (dir / "missing" / "x.safetensors").string(),
            "titan debug dump: error: --out: the folder '" + (dir / "missing").string() + "' does not exist"},
           {"check --config " + tt::debugmodel_toml().string() + " --workdir /proc/titan_x",
            "titan check: error: --workdir '/proc/titan_x' cannot be created ("},
           {"generate --model-path " + model + " --prompt-ids 1 --device gpu",
            "--device gpu: expected cpu or cuda; did you mean 'cuda'?"},
           {"generate --model-path " + step.string() + " --prompt-ids 1",
            "titan generate: error: --model-path '" + step.string() +
                "' is a native titan checkpoint (manifest.json, no config.json): give it as --checkpoint"},
           {"verify-export " + model + " --seq 100000",
            "titan verify-export: error: --seq 100000 passes the export's " + model +
                "/config.json max_position_embeddings 512: give --seq of at most that"}}) {
    const Outcome r = titan(args);
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err << r.out;
    EXPECT_EQ(r.err.find("[json.exception"), std::string::npos) << args << "\n" << r.err;
    EXPECT_NE(r.rc, 0) << args;
  }
  const Outcome help = titan("verify-export --help");
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.out.find("usage: titan verify-export DIR [options]"), std::string::npos) << help.out;
}

}  // namespace
