// `titan tokenize` end to end: the binary's ids equal the library's, --decode inverts,
// bad input is a clear error that leaves no output file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "data_test_util.h"
#include "gzip_test_util.h"

namespace {
using namespace titan::testing;
using json = nlohmann::json;

TEST(TokenizeCommand, EncodesAndDecodes) {
  auto dir = temp_dir("tokenize_cmd");
  auto docs = json::parse(read_file(fixtures_dir() / "tokenizer" / "parity_corpus.json"));
  write_file(dir / "docs.json", docs.dump());
  std::string tok = (assets_dir() / "tokenizer" / "qwen3").string();
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --tokenizer " + tok + " --input " +
                            (dir / "docs.json").string() + " --output " + (dir / "ids.json").string(),
                        &out),
            0)
      << out;
  auto ids = json::parse(read_file(dir / "ids.json"));
  ASSERT_EQ(ids.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i)
    EXPECT_EQ(ids[i].get<std::vector<int32_t>>(), qwen3_tokenizer().encode(docs[i].get<std::string>())) << i;

  // The tokenizer.json path itself works too; decoding gives back the (NFC) text.
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --decode --tokenizer " + tok + "/tokenizer.json" +
                            " --input " + (dir / "ids.json").string() + " --output " + (dir / "text.json").string(),
                        &out),
            0)
      << out;
  auto text = json::parse(read_file(dir / "text.json"));
  for (size_t i = 0; i < docs.size(); ++i)
    EXPECT_EQ(text[i].get<std::string>(), qwen3_tokenizer().decode(ids[i].get<std::vector<int32_t>>())) << i;
}

TEST(TokenizeCommand, BadInputIsAClearError) {
  auto dir = temp_dir("tokenize_cmd_bad");
  write_file(dir / "docs.json", "[\"ok\", 5]");
  std::string out;
  std::string tok = (assets_dir() / "tokenizer" / "qwen3").string();
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --tokenizer " + tok + " --input " +
                            (dir / "docs.json").string() + " --output " + (dir / "ids.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("element 1 is number, not a string"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "ids.json"));
  out.clear();
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --tokenizer " + (dir / "nowhere").string() +
                            " --input " + (dir / "docs.json").string() + " --output " + (dir / "ids.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
  // An id beyond 32 bits is named, never wrapped into the vocabulary (4294967296 would read as 0).
  for (const char* id : {"4294967296", "18446744073709551615", "-1", "999999999"}) {
    write_file(dir / "ids_in.json", std::string("[[") + id + "]]");
    out.clear();
    EXPECT_NE(run_command(titan_binary().string() + " tokenize --decode --tokenizer " + tok + " --input " +
                              (dir / "ids_in.json").string() + " --output " + (dir / "text.json").string(),
                          &out),
              0)
        << id;
    EXPECT_NE(out.find(std::string("id ") + id + " is not in the vocabulary"), std::string::npos) << out;
    EXPECT_NE(out.find((dir / "ids_in.json").string() + "\" element 0"), std::string::npos) << out;  // where
  }
  // Each direction's flag is refused in the other, not ignored.
  for (const auto& [flags, message] :
       {std::pair{" --skip-special-tokens", "--skip-special-tokens applies to --decode only"},
        std::pair{" --decode --add-special-tokens", "--add-special-tokens applies to encoding only"}}) {
    out.clear();
    EXPECT_NE(
        run_command(titan_binary().string() + " tokenize" + flags + " --tokenizer " + tok + " --input " +
                        (dir / "docs.json").string() + " --output " + (dir / "out.json").string() + " 2>&1",
                    &out),
        0)
        << flags;
    EXPECT_NE(out.find(message), std::string::npos) << flags << ": " << out;
  }
  // A file training reads and this command does not: named as such, with what the command takes,
  // before its bytes fail to parse as JSON.
  write_file(dir / "docs.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  write_file(dir / "chat.parquet", "PAR1");
  for (const auto& [input, flags, message] :
       {std::tuple{"docs.jsonl", "", "' is JSON Lines, which this command reads with --chat only"},
        std::tuple{
            "chat.parquet", "",
            "' is a parquet file, which titan train reads and this command reads with --chat only: its "
            "input is one JSON array of strings"}}) {
    out.clear();
    EXPECT_NE(
        run_command(titan_binary().string() + " tokenize" + flags + " --tokenizer " + tok + " --input " +
                        (dir / input).string() + " --output " + (dir / "out.json").string() + " 2>&1",
                    &out),
        0);
    EXPECT_NE(out.find((dir / input).string() + message), std::string::npos) << out;
    EXPECT_EQ(out.find("invalid JSON"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir / "out.json"));
  }
}

}  // namespace

// --chat shows what fine-tuning trains on: the rendered conversation, its ids, and the ids the loss
// trains on (the assistant's answer and its <|im_end|>), as the loader computes them; tool arguments
// keep their key order.
TEST(TokenizeCommand, ChatShowsWhatFineTuningTrainsOn) {
  auto dir = temp_dir("tokenize_cmd_chat");
  write_file(dir / "chats.json", R"([
    {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"name": "weather", "arguments": {"city": "Oslo", "at": "now"}}]}],
     "tools": [{"name": "weather"}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
  ])");
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "chats.json").string() + " --output " + (dir / "out.json").string(),
                        &out),
            0)
      << out;
  const json got = json::parse(read_file(dir / "out.json"));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].at("text").get<std::string>(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
  EXPECT_EQ(got[1].at("trained_text").get<std::string>(), "<think>\n\n</think>\n\nHello!<|im_end|>");
  EXPECT_EQ(got[0].at("trained_text").get<std::string>(),
            "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\", \"at\": "
            "\"now\"}}\n</tool_call><|im_end|>");
  for (const json& c : got) {
    EXPECT_EQ(c.at("ids").get<std::vector<int32_t>>(), qwen3_tokenizer().encode(c.at("text").get<std::string>()));
    EXPECT_EQ(c.at("trained").size(), c.at("ids").size());
  }
  // A bad conversation names the element, the message and the field; no output is written.
  write_file(dir / "bad.json", R"([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]}])");
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " + (dir / "bad.json").string() +
                            " --output " + (dir / "bad_out.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find((dir / "bad.json").string() + ":1: field 'messages': message 1: has no field 'content'"),
            std::string::npos)
      << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad_out.json"));
  // The same records as a .jsonl file, and gzipped, as training reads them (by training's own reader):
  // one per line, blank lines skipped; a bad one is named by its line.
  std::string lines;
  for (const auto& record : nlohmann::ordered_json::parse(read_file(dir / "chats.json")))
    lines += record.dump() + "\n\n";  // key order kept: the tool arguments render as written
  write_file(dir / "chats.jsonl", lines);
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "chats.jsonl").string() + " --output " + (dir / "out_lines.json").string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(json::parse(read_file(dir / "out_lines.json")), got);
  write_file(dir / "chats.jsonl.gz", gzip_bytes(lines));
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "chats.jsonl.gz").string() + " --output " + (dir / "out_gz.json").string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(json::parse(read_file(dir / "out_gz.json")), got);
  // JSON Lines in a .json file (as Hugging Face's to_json writes them): training reads it by lines, and
  // so does this command, where it used to fail to parse it as one JSON value.
  write_file(dir / "hf_lines.json", lines);
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "hf_lines.json").string() + " --output " + (dir / "out_hf.json").string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(json::parse(read_file(dir / "out_hf.json")), got);
  // Without --chat those lines are records this command does not read: named as JSON Lines.
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --input " + (dir / "hf_lines.json").string() +
                            " --output " + (dir / "out_text.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("hf_lines.json' is JSON Lines, which this command reads with --chat only"),
            std::string::npos)
      << out;
  write_file(dir / "bad.jsonl",
             lines + R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]})");
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "bad.jsonl").string() + " --output " + (dir / "bad_out.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("bad.jsonl:5: field 'messages': "), std::string::npos) << out;
  // A record that is no conversation object gets training's error (its fields, and ShareGPT's messages
  // named with how to write them), where it used to get a bare "is not an object with a field".
  write_file(dir / "other.jsonl",
             "{\"id\": 1, \"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}]}\n\"text\"\n");
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "other.jsonl").string() + " --output " + (dir / "other_out.json").string(),
                        &out),
            0);
  EXPECT_NE(
      out.find("other.jsonl:1: object has no field 'messages' (training.chat_field names the messages; its "
               "fields are 'id', 'conversations'): its 'conversations' holds ShareGPT messages"),
      std::string::npos)
      << out;
  write_file(dir / "other.jsonl", "\"text\"\n");
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "other.jsonl").string() + " --output " + (dir / "other_out.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("other.jsonl:1: expected a conversation object, got string"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "other_out.json"));
}

// Text a JSON parser would refuse, as training reads it: an invalid UTF-8 byte and an unpaired
// surrogate escape (Python's json.dumps writes one for a string holding a lone surrogate) each read
// as U+FFFD, with a note on stderr, where they used to stop the command with a parse error.
TEST(TokenizeCommand, ReadsBrokenTextAsTrainingDoes) {
  auto dir = temp_dir("tokenize_cmd_broken");
  const std::string replacement = "\xEF\xBF\xBD";
  write_file(dir / "docs.json", "[\"a\xFF b\", \"c\\ud800 d\"]");
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --input " + (dir / "docs.json").string() +
                            " --output " + (dir / "ids.json").string(),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("2 invalid UTF-8 sequence(s) or unpaired surrogate escape(s) in '" +
                     (dir / "docs.json").string() + "' (line 1) read as U+FFFD"),
            std::string::npos)
      << out;
  const json ids = json::parse(read_file(dir / "ids.json"));
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0].get<std::vector<int32_t>>(), qwen3_tokenizer().encode("a" + replacement + " b"));
  EXPECT_EQ(ids[1].get<std::vector<int32_t>>(), qwen3_tokenizer().encode("c" + replacement + " d"));

  // Counted with the lines holding them, as training's warning names each record's line.
  write_file(dir / "lines.json", "[\"ok\",\n\"a\xFF\",\n\"fine\",\n\"b\\udc00 \xFE\"]");
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --input " + (dir / "lines.json").string() +
                            " --output " + (dir / "lines_ids.json").string(),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("3 invalid UTF-8 sequence(s) or unpaired surrogate escape(s) in '" +
                     (dir / "lines.json").string() + "' (lines 2, 4) read as U+FFFD"),
            std::string::npos)
      << out;
  EXPECT_EQ(json::parse(read_file(dir / "lines_ids.json"))[3].get<std::vector<int32_t>>(),
            qwen3_tokenizer().encode("b" + replacement + " " + replacement));
  write_file(dir / "chats.json",
             "[{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\\udc00\"}, "
             "{\"role\": \"assistant\", \"content\": \"Yo\xC3\"}]}]");
  out.clear();
  ASSERT_EQ(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "chats.json").string() + " --output " + (dir / "out.json").string(),
                        &out),
            0)
      << out;
  const json got = json::parse(read_file(dir / "out.json"));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].at("text").get<std::string>(),
            "<|im_start|>user\nHi" + replacement +
                "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo" + replacement +
                "<|im_end|>\n");
  // A conversation training rejects as not text (Latin-1 bytes: more than 10% U+FFFD) is refused
  // here too, naming its line, where it used to be shown as if a run would train on it.
  write_file(dir / "latin1.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"\xE9t\xE9 \xE0 \xE9\xE8\xEA\xE0\xF9\"}, "
             "{\"role\": \"assistant\", \"content\": \"\xE7"
             "a \xEE\xF4 \xE9\xE8\xEA\xE0\xF9\"}]}\n");
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                            (dir / "latin1.jsonl").string() + " --output " + (dir / "latin1.out").string(),
                        &out),
            0);
  EXPECT_NE(out.find("latin1.jsonl:1: the document starting here is "), std::string::npos) << out;
  EXPECT_NE(out.find("characters U+FFFD (invalid UTF-8) or control characters"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "latin1.out"));
}

// Tool arguments and tool signatures nested 100,000 levels deep (JSON parses iteratively; writing
// them recursed once per level and overflowed the stack) are an error naming the element, message
// and field and the limit, not a crash.
TEST(TokenizeCommand, ChatRefusesValuesNestedPastTheLimit) {
  auto dir = temp_dir("tokenize_cmd_deep");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string conversation = R"({"role": "user", "content": "q"}, {"role": "assistant", "content": "")";
  write_file(dir / "arguments.json", "[{\"messages\": [" + conversation +
                                         R"(, "tool_calls": [{"name": "f", "arguments": )" + deep + "}]}]}]");
  write_file(dir / "tools.json",
             "[{\"messages\": [" + conversation + "}], \"tools\": [{\"parameters\": " + deep + "}]}]");
  for (const auto& [file, where] : {std::pair{"arguments.json", "message 1: tool_calls[0].arguments"},
                                    std::pair{"tools.json", "tools[0]"}}) {
    std::string out;
    EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --input " +
                              (dir / file).string() + " --output " + (dir / "out.json").string(),
                          &out),
              0);
    EXPECT_NE(out.find((dir / file).string() + ":1: field 'messages': "), std::string::npos) << out;
    EXPECT_NE(out.find(std::string(where) + ": nested more than 512 arrays and objects deep"),
              std::string::npos)
        << out;
    EXPECT_FALSE(std::filesystem::exists(dir / "out.json"));
  }
}

// A tokenizer whose tokenizer_config.json carries another chat template (another model family's) is
// refused: titan renders Qwen3's, and the model would be fine-tuned or asked in a format it was not
// made for.
TEST(TokenizeCommand, ChatRefusesATokenizerWithAnotherChatTemplate) {
  auto dir = temp_dir("tokenize_cmd_chat_template");
  const auto qwen3 = assets_dir() / "tokenizer" / "qwen3";
  std::filesystem::create_directories(dir / "tok");
  std::filesystem::copy_file(qwen3 / "tokenizer.json", dir / "tok" / "tokenizer.json");
  json config = json::parse(read_file(qwen3 / "tokenizer_config.json"));
  config["chat_template"] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  write_file(dir / "tok" / "tokenizer_config.json", config.dump());
  write_file(
      dir / "chats.json",
      R"([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}])");
  std::string out;
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --chat messages --tokenizer " +
                            (dir / "tok").string() + " --input " + (dir / "chats.json").string() +
                            " --output " + (dir / "out.json").string(),
                        &out),
            0);
  EXPECT_NE(out.find("tokenizer_config.json' carries a chat_template other than Qwen3's"), std::string::npos)
      << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.json"));
  // Without a chat template, Qwen3's is what titan renders.
  config.erase("chat_template");
  write_file(dir / "tok" / "tokenizer_config.json", config.dump());
  const std::string tokenize = titan_binary().string() + " tokenize --chat messages --tokenizer " +
                               (dir / "tok").string() + " --input " + (dir / "chats.json").string() +
                               " --output " + (dir / "out.json").string();
  EXPECT_EQ(run_command(tokenize, &out), 0) << out;
  // transformers (4.47 on) saves the template as chat_template.jinja, which it reads first: another
  // template there is refused naming that file, ...
  write_file(dir / "tok" / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  std::filesystem::remove(dir / "out.json");
  EXPECT_NE(run_command(tokenize, &out), 0);
  EXPECT_NE(out.find("chat_template.jinja' is a chat template other than Qwen3's"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.json"));
  // ... and Qwen3's there is taken, whatever tokenizer_config.json carries.
  const json qwen3_config = json::parse(read_file(qwen3 / "tokenizer_config.json"));
  write_file(dir / "tok" / "chat_template.jinja", qwen3_config["chat_template"].get<std::string>());
  config["chat_template"] = "{% for m in messages %}{{ m.role }}{% endfor %}";
  write_file(dir / "tok" / "tokenizer_config.json", config.dump());
  EXPECT_EQ(run_command(tokenize, &out), 0) << out;
}
