// Conversations for supervised fine-tuning (titan/data/chat.h): the rendering against the Jinja
// chat template as transformers' apply_chat_template runs it (tests/data/chat_ref/render_chat.py,
// with Debian's python3-jinja2), which pieces train, the errors, the tokens, and the template's
// tojson against Python's json.dumps.
#include "titan/data/chat.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "titan/core/check.h"
#include "titan/data/tokenizer.h"

namespace {
using namespace titan::testing;
using titan::data::ChatPiece;
using titan::data::ChatTokens;
using titan::data::python_json_dumps;
using titan::data::render_qwen3_chat;
using titan::data::tokenize_chat;
using titan::data::Tokenizer;
using ojson = nlohmann::ordered_json;

const char* kPython = "/usr/bin/python3";

// "" when /usr/bin/python3 can import jinja2 (python3-jinja2); else why not.
std::string jinja_unavailable() {
  std::string out;
  if (run_command(std::string(kPython) + " -c 'import jinja2' 2>&1", &out) != 0)
    return "python3-jinja2 not available (" + std::string(kPython) + " -c 'import jinja2' failed): " + out;
  return "";
}

std::filesystem::path qwen3_tokenizer_config() {
  return assets_dir() / "tokenizer" / "qwen3" / "tokenizer_config.json";
}

std::string concat(const std::vector<ChatPiece>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p.text;
  return s;
}

std::string concat(const std::vector<ChatPiece>& pieces, bool trained) {
  std::string s;
  for (const auto& p : pieces)
    if (p.trained == trained) s += p.text;
  return s;
}

// The rendered text with each trained stretch in [[ ]] (adjacent pieces that train alike joined).
std::string marked(const std::vector<ChatPiece>& pieces) {
  std::string s;
  bool in = false;
  for (const auto& p : pieces) {
    if (p.text.empty()) continue;
    if (p.trained != in) s += in ? "]]" : "[[";
    in = p.trained;
    s += p.text;
  }
  if (in) s += "]]";
  return s;
}

// Where two strings first differ, for a failure message.
size_t first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Conversations the template renders, in every shape the Qwen3 template has a branch for. The
// JSON text goes to Python as it is, so both sides parse the same numbers and key orders.
const char* kCases = R"JSON([
  {"messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"}]},
  {"messages": [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there! How can I help?"}]},
  {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "First question"},
    {"role": "assistant", "content": "First answer"},
    {"role": "user", "content": "Second question"},
    {"role": "assistant", "content": "Second answer"}]},
  {"messages": [
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1"},
    {"role": "system", "content": "A system turn in the middle."},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a2"}]},
  {"messages": [
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "\n\nRayleigh scattering.", "reasoning_content": "\nLet me think.\n\nShort waves scatter more.\n\n"}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>\nhmm, let me see\n</think>\n\nThe answer", "reasoning_content": null}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>hmm</think>answer without newlines"}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>a\n</think>b</think>\n\nc\n"}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "\nreasoning without an opening tag\n</think>rest"}]},
  {"messages": [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nfirst"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "second"}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>kept</think>as is", "reasoning_content": ""}]},
  {"messages": [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>x</think>y", "reasoning_content": "z"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "\nw"}]},
  {"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"name": "get_weather", "arguments": {"zcity": "Paris", "aunit": "celsius", "n": 3, "m": {"b": 1, "a": 2}}}]},
    {"role": "tool", "content": "{\"temp\": 20}"},
    {"role": "assistant", "content": "It is 20 degrees."}]},
  {"messages": [
    {"role": "user", "content": "Search for x"},
    {"role": "assistant", "content": "Let me search.", "tool_calls": [
      {"type": "function", "id": "call_1", "function": {"name": "search", "arguments": "{\"q\": \"x\",   \"k\":5}"}}]},
    {"role": "tool", "content": "result: x is y"},
    {"role": "assistant", "content": "x is y."}]},
  {"messages": [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "do three things"},
    {"role": "assistant", "content": "Doing them.", "reasoning_content": "three calls", "tool_calls": [
      {"name": "one", "arguments": {}},
      {"function": {"name": "two", "arguments": "not json at all"}},
      {"type": "function", "function": {"arguments": [1, 2, 3], "name": "three"}}]},
    {"role": "tool", "content": "r1"},
    {"role": "tool", "content": "r2"},
    {"role": "tool", "content": "r3"},
    {"role": "assistant", "content": "All done."}]},
  {"messages": [
    {"role": "user", "content": "call it"},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"a": 1}}]},
    {"role": "tool", "content": "the last message is a tool response"}]},
  {"tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. \"Paris\""}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"b": {"type": "number"}, "a": {"type": "number"}}}}}],
   "messages": [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Lyon?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"location": "Lyon", "unit": "celsius"}}}]},
    {"role": "tool", "content": "12"},
    {"role": "assistant", "content": "12 degrees."}]},
  {"tools": [{"name": "f", "description": "no system message"}],
   "messages": [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"}]},
  {"tools": [{"name": "f"}, {"name": "g", "parameters": {"x": 1.5, "list": [true, null, "s"]}}],
   "messages": [
    {"role": "user", "content": "hi"},
    {"role": "system", "content": "a system message after the first"},
    {"role": "assistant", "content": "hello"}]},
  {"tools": [],
   "messages": [
    {"role": "system", "content": "an empty tools list is no tools"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"}]},
  {"tools": [{"name": "f"}],
   "messages": [
    {"role": "system", "content": ""},
    {"role": "user", "content": "empty system content with tools"},
    {"role": "assistant", "content": "ok"}]},
  {"messages": [
    {"role": "system", "content": "Réponds en français. 你好，世界 🌍"},
    {"role": "user", "content": "Où est le café ? 中文问题 😀"},
    {"role": "assistant", "content": "Ici ☕", "reasoning_content": "思考 🤔", "tool_calls": [
      {"name": "tr\u00e9s", "arguments": {"ville": "Montréal", "城市": "北京", "emoji": "👍🏽", "k\u00e9y": "v"}}]},
    {"role": "tool", "content": "résultat 结果 ✅"},
    {"role": "assistant", "content": "Voilà 🎉"}]},
  {"messages": [
    {"role": "user", "content": "numbers"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"name": "nums", "arguments": {"half": 0.5, "small": 1e-05, "big": 1e16, "whole": 123.0, "negzero": -0.0, "int": 42, "neg": -7, "zero": 0, "t": true, "f": false, "n": null, "e15": 1e15, "tiny": 2.5e-7, "tenth": 0.1, "huge": 1e300, "e17": 100000000000000000.0, "bigint": 12345678901234567890, "nested": [[1, [2.0, []]], {}, {"z": [], "a": {}}]}}]},
    {"role": "tool", "content": "ok"},
    {"role": "assistant", "content": "done"}]},
  {"messages": [
    {"role": "user", "content": "quotes \"q\" and \\backslash\\ and\ttab and \u0001 ctl\nnew line\r\n"},
    {"role": "assistant", "content": "she said \"hi\"\\n\ttabbed \u0001", "tool_calls": [
      {"name": "esc", "arguments": {"s": "a \"quoted\" \\ back\nline\ttab\u0001\u001f\u007f\b\f\r end", "k\"ey": "v\\"}}]},
    {"role": "tool", "content": "\"tool\" \\ out\n"},
    {"role": "assistant", "content": "fine"}]},
  {"messages": [
    {"role": "user", "content": "real query"},
    {"role": "assistant", "content": "", "reasoning_content": "r1", "tool_calls": [{"name": "f", "arguments": "{}"}]},
    {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
    {"role": "assistant", "content": "final", "reasoning_content": "r2"}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": "{}"}]},
    {"role": "tool", "content": "out"},
    {"role": "assistant", "content": "<think>\nstep two\n</think>\n\nnext", "tool_calls": [{"name": "g", "arguments": "{}"}]},
    {"role": "tool", "content": "out2"},
    {"role": "assistant", "content": "done"}]},
  {"messages": [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "the last message is a user message"}]},
  {"messages": [
    {"role": "system", "content": "no user message at all"},
    {"role": "assistant", "content": "<think>r</think>monologue"}]},
  {"messages": [
    {"role": "user", "content": "say nothing"},
    {"role": "assistant", "content": ""}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "no calls", "tool_calls": []}]},
  {"messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "\n", "reasoning_content": "r", "tool_calls": [{"name": "f", "arguments": {"x": 1}}]}]},
  {"messages": [
    {"role": "user", "content": "\n\nleading and trailing newlines\n"},
    {"role": "assistant", "content": "\nkept newline before the last query\n"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "\n\nlast answer\n\n"}]},
  {"messages": [
    {"role": "tool", "content": "a tool message first"},
    {"role": "user", "content": "<tool_response>only a wrapped response</tool_response>"},
    {"role": "assistant", "content": "answer", "reasoning_content": "why"}]},
  {"messages": [
    {"role": "user", "content": "<tool_response>not closed"},
    {"role": "assistant", "content": "<think></think>empty think"}]},
  {"messages": [
    {"role": "user", "content": "special <|im_start|>assistant\nfake<|im_end|> and <think>x</think> <|endoftext|>"},
    {"role": "assistant", "content": "real <|im_end|> inside", "name": "ignored extra field"}]},
  {"messages": [{"role": "user", "content": "Prompt only"}], "add_generation_prompt": true},
  {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "No thinking"}],
   "add_generation_prompt": true, "enable_thinking": false},
  {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>r</think>A1"},
                {"role": "user", "content": "Q2"}], "add_generation_prompt": true, "enable_thinking": true},
  {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is "}],
   "continue_final_message": true},
  {"messages": [{"role": "user", "content": "Again."}, {"role": "assistant", "content": " The colour is\u3000"}],
   "continue_final_message": true},
  {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "\n{\"answer\": ", "reasoning_content": "think first"}],
   "continue_final_message": true}
])JSON";

}  // namespace

TEST(ChatTemplate, RendersWhatTransformersJinjaRenders) {
  if (auto why = jinja_unavailable(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(std::filesystem::exists(qwen3_tokenizer_config()))
      << "assets missing: " << qwen3_tokenizer_config() << " (run scripts/setup.sh)";
  const auto cases = ojson::parse(kCases);
  ASSERT_GE(cases.size(), 25u);
  auto dir = temp_dir("chat_template");
  write_file(dir / "cases.json", kCases);
  std::string out;
  const std::string cmd = std::string(kPython) + " " +
                          (source_dir() / "tests" / "data" / "chat_ref" / "render_chat.py").string() + " " +
                          (dir / "cases.json").string() + " " + qwen3_tokenizer_config().string() + " " +
                          (dir / "rendered.json").string();
  ASSERT_EQ(run_command(cmd, &out), 0) << cmd << "\n" << out;
  const auto rendered = ojson::parse(read_file(dir / "rendered.json"));
  ASSERT_EQ(rendered.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ojson& c = cases[i];
    ASSERT_TRUE(rendered[i].is_string())
        << "case " << i << ": the Jinja template failed: " << rendered[i].dump();
    const std::string want = rendered[i].get<std::string>();
    std::string got;
    const std::string err = error_of([&] {
      got =
          concat(render_qwen3_chat(c["messages"], c.value("tools", ojson()),
                                   {c.value("add_generation_prompt", false), c.value("enable_thinking", true),
                                    c.value("continue_final_message", false)}));
    });
    EXPECT_EQ(err, "") << "case " << i << " throws; Jinja renders " << ojson(want).dump();
    if (!err.empty()) continue;
    EXPECT_EQ(got, want) << "case " << i << " differs from the Jinja rendering at byte "
                         << first_difference(got, want) << "\n  titan: " << ojson(got).dump()
                         << "\n  jinja: " << ojson(want).dump();
  }
}

namespace {
// The tools block the template writes at the top when `tools` is given (with a system message's
// content and "\n\n" after the first line when the conversation starts with one).
const std::string kToolsHead = "<|im_start|>system\n";
const std::string kToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function "
    "signatures within <tools></tools> XML tags:\n<tools>";
const std::string kToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";
}  // namespace

TEST(ChatTemplate, TrainsExactlyTheAssistantTurns) {
  struct Case {
    const char* messages;
    const char* tools;
    std::string want;  // the rendering, trained stretches in [[ ]]
  };
  const std::vector<Case> cases = {
      {R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
           {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
           {"role": "assistant", "content": "A2", "reasoning_content": "R"}])",
       "null",
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n[[A1<|im_end|"
       ">]]\n"
       "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n[[<think>\nR\n</think>\n\nA2<|im_end|>]]\n"},
      {R"([{"role": "user", "content": "Q"},
           {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"x": 1}}]},
           {"role": "tool", "content": "out1"}, {"role": "tool", "content": "out2"},
           {"role": "assistant", "content": "done"}])",
       "null",
       "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n[[<tool_call>\n{\"name\": \"f\", "
       "\"arguments\": {\"x\": "
       "1}}\n</tool_call><|im_end|>]]\n<|im_start|>user\n<tool_response>\nout1\n</"
       "tool_response>\n<tool_response>\n"
       "out2\n</tool_response><|im_end|>\n<|im_start|>assistant\n[[<think>\n\n</"
       "think>\n\ndone<|im_end|>]]\n"},
      {R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
           {"role": "assistant", "content": "A"}, {"role": "user", "content": "more"}])",
       R"([{"name": "f"}])",
       kToolsHead + "S\n\n" + kToolsIntro + "\n{\"name\": \"f\"}" + kToolsTail +
           "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n[[A<|im_end|>]]\n<|im_start|>user\nmore<|"
           "im_end|>\n"},
      {R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\nA"},
           {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nB"}])",
       "null",
       "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n[[\nA<|im_end|>]]\n<|im_start|>user\nQ2<|im_"
       "end|>\n"
       "<|im_start|>assistant\n[[<think>\nr\n</think>\n\nB<|im_end|>]]\n"},
      {R"([{"role": "user", "content": "Q"},
           {"role": "assistant", "content": "ok", "reasoning_content": "plan",
            "tool_calls": [{"function": {"name": "g", "arguments": "{\"a\": 2}"}}]},
           {"role": "tool", "content": "res"}])",
       "null",
       "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n[[<think>\nplan\n</"
       "think>\n\nok\n<tool_call>\n{\"name\": "
       "\"g\", \"arguments\": {\"a\": 2}}\n</tool_call><|im_end|>]]\n<|im_start|>user\n<tool_response>\nres\n"
       "</tool_response><|im_end|>\n"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto pieces = render_qwen3_chat(ojson::parse(cases[i].messages), ojson::parse(cases[i].tools));
    const std::string got = marked(pieces);
    EXPECT_EQ(got, cases[i].want) << "case " << i << "\n  got:  " << ojson(got).dump()
                                  << "\n  want: " << ojson(cases[i].want).dump();
    // Every assistant header is context, every <|im_end|> of an assistant turn is trained.
    const std::string untrained = concat(pieces, false), trained = concat(pieces, true);
    EXPECT_NE(untrained.find("<|im_start|>assistant\n"), std::string::npos) << "case " << i;
    EXPECT_EQ(trained.find("<|im_start|>"), std::string::npos) << "case " << i;
    EXPECT_EQ(trained.substr(trained.size() - 10), "<|im_end|>") << "case " << i;
  }
}

namespace {
// Whether `message` names message `index` ("message 3", not "message 31").
bool names_message(const std::string& message, size_t index) {
  const std::string key = "message " + std::to_string(index);
  for (size_t at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
    const size_t end = at + key.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) return true;
  }
  return false;
}
}  // namespace

TEST(ChatTemplate, BadConversationsNameTheMessageAndField) {
  struct Case {
    const char* messages;
    const char* tools;
    int index;                       // the message the error must name; -1: none
    std::vector<std::string> words;  // what else the error must say
  };
  const std::vector<Case> cases = {
      {"[]", "null", -1, {"messages", "empty"}},
      // transformers' apply_chat_template refuses a tool that is neither a JSON schema nor a function
      {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])",
       R"([{"name": "f"}, "a string"])",
       -1,
       {"tools[1]", "object"}},
      {R"({"role": "user", "content": "an object, not an array"})", "null", -1, {"messages", "array"}},
      {R"("a string")", "null", -1, {"messages", "array"}},
      {R"([{"role": "user", "content": "hi"}])", "null", -1, {"assistant"}},
      {R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "tool", "content": "t"}])",
       "null",
       -1,
       {"assistant"}},
      {R"([{"role": "user", "content": "hi"}, "not an object", {"role": "assistant", "content": "a"}])",
       "null",
       1,
       {}},
      {R"([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}, {"role": "assistant", "content": "a"}])",
       "null",
       1,
       {"role", "bot"}},
      {R"([{"role": "user", "content": "hi"}, {"content": "no role"}, {"role": "assistant", "content": "a"}])",
       "null",
       1,
       {"role"}},
      {R"([{"role": "user", "content": "hi"}, {"role": 3, "content": "x"}, {"role": "assistant", "content": "a"}])",
       "null",
       1,
       {"role"}},
      {R"([{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}])", "null", 0, {"content"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": null}])",
       "null",
       1,
       {"content"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
           {"role": "tool", "content": [{"type": "text", "text": "parts"}]}])",
       "null",
       2,
       {"content"}},
      {R"([{"role": "system"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}])",
       "null",
       0,
       {"content"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
           "tool_calls": [{"arguments": {"x": 1}}]}])",
       "null",
       1,
       {"tool_calls", "name"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
           "tool_calls": [{"name": "f", "arguments": {}}, {"function": {"arguments": "{}"}}]}])",
       "null",
       1,
       {"tool_calls", "name"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
           "tool_calls": [{"name": 5, "arguments": {}}]}])",
       "null",
       1,
       {"tool_calls", "name"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
           "tool_calls": [{"name": "f"}]}])",
       "null",
       1,
       {"tool_calls", "arguments"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
           "tool_calls": [{"type": "function", "function": {"name": "f"}}]}])",
       "null",
       1,
       {"tool_calls", "arguments"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": "call f"}])",
       "null",
       1,
       {"tool_calls"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": ["f"]}])",
       "null",
       1,
       {"tool_calls"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "reasoning_content": 7}])",
       "null",
       1,
       {"reasoning_content"}},
      {R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}])",
       R"({"name": "f"})",
       -1,
       {"tools"}},
      {R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
           {"role": "user", "content": {"text": "an object"}}, {"role": "assistant", "content": "b"}])",
       "null",
       3,
       {"content"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const ojson messages = ojson::parse(c.messages), tools = ojson::parse(c.tools);
    const std::string err = error_of([&] { render_qwen3_chat(messages, tools); });
    ASSERT_NE(err, "") << "case " << i << " renders without an error: " << c.messages;
    if (c.index >= 0) {
      EXPECT_TRUE(names_message(err, size_t(c.index))) << "case " << i << ": " << err;
    }
    for (const auto& w : c.words)
      EXPECT_NE(err.find(w), std::string::npos) << "case " << i << " (" << w << "): " << err;
  }
  // continue_final_message: the final message must be the assistant's text, found in the rendering
  // (transformers raises a ValueError for a content the template rewrote, as here its <think> part).
  const titan::data::ChatPrompt open{false, true, true};
  for (
      const auto& [messages, words] : std::vector<std::pair<const char*, std::vector<std::string>>>{
          {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}])",
           {"message 2", "the final one is the user's"}},
          {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": " \n"}])",
           {"message 1", "the content is empty"}},
          {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>hidden</think>\n\nshown"}])",
           {"message 1", "not in the rendered conversation"}},
          {R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "tool_calls": [{"name": "f", "arguments": {}}]}])",
           {"message 1", "tool calls"}}}) {
    const std::string err = error_of([&] { render_qwen3_chat(ojson::parse(messages), nullptr, open); });
    for (const auto& w : words)
      EXPECT_NE(err.find(w), std::string::npos) << messages << " (" << w << "): " << err;
  }
  EXPECT_NE(
      error_of([&] {
        render_qwen3_chat(
            ojson::parse(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])"),
            nullptr, {true, true, true});
      }).find("add_generation_prompt would open another"),
      std::string::npos);
}

// ShareGPT's {"from", "value"} messages are refused (no silent second format), with the mapping that
// turns them into the messages the template takes.
TEST(ChatTemplate, ShareGptMessagesAreRefusedWithTheMappingToRoleAndContent) {
  const std::string mapping =
      R"(it is a ShareGPT message {"from", "value"}, which titan does not read: write "from" as "role" (human -> )"
      R"(user, gpt -> assistant, system -> system) and "value" as "content")";
  const std::string sharegpt = error_of([] {
    render_qwen3_chat(ojson::parse(R"([{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                       {"from": "gpt", "value": "a"}])"));
  });
  EXPECT_NE(sharegpt.find("message 0: has no field 'role': " + mapping), std::string::npos) << sharegpt;
  // Half converted: "value" where "content" belongs.
  const std::string half = error_of([] {
    render_qwen3_chat(
        ojson::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "value": "a"}])"));
  });
  EXPECT_NE(half.find("message 1: has no field 'content': " + mapping), std::string::npos) << half;
  // A message with role and content is read whatever else it holds.
  EXPECT_EQ(
      error_of([] {
        render_qwen3_chat(ojson::parse(
            R"([{"role": "user", "content": "q", "from": "human"}, {"role": "assistant", "content": "a"}])"));
      }),
      "");
}

namespace {
// The bytes of the trained tokens, in order.
std::string trained_bytes(const Tokenizer& tok, const ChatTokens& t) {
  std::string s;
  for (size_t k = 0; k < t.ids.size(); ++k)
    if (t.trained[k]) s += tok.token_bytes(t.ids[k]);
  return s;
}

// tokenize_chat's ids are encode(whole text)'s, one flag (0 or 1) per id, and the trained tokens
// spell `want_trained`. Returns the tokens.
ChatTokens expect_tokens(const char* messages, const std::string& want_trained, const std::string& name) {
  SCOPED_TRACE(name);
  const Tokenizer& tok = qwen3_tokenizer();
  const auto pieces = render_qwen3_chat(ojson::parse(messages));
  const std::string text = concat(pieces);
  ChatTokens t = tokenize_chat(tok, pieces);
  EXPECT_EQ(t.ids, tok.encode(text));
  EXPECT_EQ(t.trained.size(), t.ids.size());
  for (size_t k = 0; k < t.trained.size() && k < t.ids.size(); ++k)
    EXPECT_LE(t.trained[k], 1) << "token " << k;
  if (t.trained.size() != t.ids.size()) return t;
  std::string all;
  for (int32_t id : t.ids) all += tok.token_bytes(id);
  EXPECT_EQ(all, tok.normalize(text));
  const std::string got = trained_bytes(tok, t);
  EXPECT_EQ(got, want_trained) << "\n  got:  " << ojson(got).dump()
                               << "\n  want: " << ojson(want_trained).dump();
  return t;
}
}  // namespace

TEST(ChatTokens, IdsAreTheWholeTextsIds) {
  const Tokenizer& tok = qwen3_tokenizer();
  expect_tokens(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                    {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
                    {"role": "assistant", "content": "A2", "reasoning_content": "R"}])",
                "A1<|im_end|><think>\nR\n</think>\n\nA2<|im_end|>", "multi-turn");

  // An assistant message that starts with a newline: "\n\n" (the header's newline and the content's)
  // is one token, which starts in the header, so it is context; the rest of the turn trains.
  {
    const ChatTokens t = expect_tokens(
        R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\nA"},
            {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "B"}])",
        "A<|im_end|><think>\n\n</think>\n\nB<|im_end|>", "leading newline");
    size_t k = 0;
    while (k < t.ids.size() && tok.token_bytes(t.ids[k]) != "assistant") ++k;
    ASSERT_LT(k + 2, t.ids.size());
    EXPECT_EQ(tok.token_bytes(t.ids[k + 1]), "\n\n");
    EXPECT_EQ(t.trained[k + 1], 0);
    EXPECT_EQ(tok.token_bytes(t.ids[k + 2]), "A");
    EXPECT_EQ(t.trained[k + 2], 1);
  }

  // Decomposed text (NFD): the tokens are those of the NFC text, as encode gives them; the trained
  // bytes are the NFC form.
  expect_tokens(R"([{"role": "user", "content": "Cafe\u0301 ?"},
                    {"role": "assistant", "content": "Cafe\u0301 cre\u0300me, \u00e9 e\u0301"}])",
                "<think>\n\n</think>\n\nCaf\u00e9 cr\u00e8me, \u00e9 \u00e9<|im_end|>", "NFD");

  // A combining mark right after an added token: encode matches the token on the raw text first, so the
  // mark stays apart (no ">" + U+0338 = U+226F across the token's end); tokenize_chat agrees.
  expect_tokens(
      R"([{"role": "user", "content": "a<|im_end|>\u0338b"}, {"role": "assistant", "content": "c<|im_end|>\u0338d"}])",
      "<think>\n\n</think>\n\nc<|im_end|>\u0338d<|im_end|>", "combining mark after an added token");

  // Special-token strings in a user's content are special tokens (as transformers tokenizes them),
  // and context all the same.
  {
    const ChatTokens t = expect_tokens(
        R"([{"role": "user", "content": "x <|im_start|>assistant\nfake<|im_end|> <think>y</think> <|endoftext|>"},
            {"role": "assistant", "content": "real"}])",
        "<think>\n\n</think>\n\nreal<|im_end|>", "special tokens in user content");
    const auto im_start = tok.token_to_id("<|im_start|>"), im_end = tok.token_to_id("<|im_end|>");
    ASSERT_TRUE(im_start && im_end);
    size_t starts = 0, ends = 0, trained_ends = 0;
    for (size_t k = 0; k < t.ids.size(); ++k) {
      starts += t.ids[k] == *im_start;
      ends += t.ids[k] == *im_end;
      trained_ends += t.ids[k] == *im_end && t.trained[k];
    }
    EXPECT_EQ(starts, 3u);
    EXPECT_EQ(ends, 3u);
    EXPECT_EQ(trained_ends, 1u);
  }

  // Tool calls, unicode and a tool turn between two assistant turns.
  expect_tokens(
      R"([{"role": "user", "content": "Météo à 北京 ?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"name": "météo", "arguments": {"ville": "北京", "x": 0.5}}]},
                    {"role": "tool", "content": "晴 ☀️"},
                    {"role": "assistant", "content": "Il fait beau 😀"}])",
      "<tool_call>\n{\"name\": \"météo\", \"arguments\": {\"ville\": \"北京\", \"x\": 0.5}}\n</tool_call>"
      "<|im_end|><think>\n\n</think>\n\nIl fait beau 😀<|im_end|>",
      "tool call");
}

TEST(PythonJsonDumps, MatchesPython) {
  std::string out;
  if (run_command(std::string(kPython) + " -c 'import json' 2>&1", &out) != 0)
    GTEST_SKIP() << "python3 not available (" << kPython << " -c 'import json' failed): " << out;
  const char* values = R"JSON([
    0.5, 1e-05, 1e16, 123.0, -0.0, 0.0, 1e300, 2.5e-7, 0.1, 100000000000000000.0, 1e15, 1e-4, 0.00001234,
    123456789.125, 5e-324, 1.7976931348623157e308, -1.5, -2.5e-7, -1e16, 0.30000000000000004, 1e21, 1e-7,
    3.14159, 2e-5, 9.999999999999999e15, 1234567890123456.7, 12345678901234567.0,
    12345678901234567890, 18446744073709551615, -9223372036854775808, 9223372036854775807, 10000000000000000,
    -42, 0, -0, 7, true, false, null,
    "", "plain", "é 中文 😀 e\u0301", "quote\" back\\ nl\n cr\r tab\t bs\b ff\f \u0001 \u001f \u007f \u2028 / </script>",
    [], {}, [1, [2, [3, []]], {}], {"z": 1, "a": [1.0, {"y": null, "b": "x"}], "": "empty key", "k\"\n": 2, "é": "中"},
    [0.5, -0.0, 1e16, {"n": 12345678901234567890, "m": -7}]
  ])JSON";
  auto dir = temp_dir("python_json_dumps");
  write_file(dir / "values.json", values);
  write_file(dir / "dumps.py",
             "import json, sys\n"
             "values = json.load(open(sys.argv[1], encoding='utf-8'))\n"
             "json.dump([json.dumps(v, ensure_ascii=False) for v in values], sys.stdout)\n");
  out.clear();
  ASSERT_EQ(run_command(std::string(kPython) + " " + (dir / "dumps.py").string() + " " +
                            (dir / "values.json").string(),
                        &out),
            0)
      << out;
  const auto want = ojson::parse(out);
  const auto parsed = ojson::parse(values);
  ASSERT_EQ(want.size(), parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    const std::string got = python_json_dumps(parsed[i]);
    EXPECT_EQ(got, want[i].get<std::string>()) << "value " << i << " (" << parsed[i].dump() << ")";
  }
}

// tojson writes arrays and objects up to 512 levels deep (Python's json.dumps, its reference, writes
// 512 nested lists as 512 brackets each way) and refuses one level more, naming the rule.
TEST(PythonJsonDumps, WritesUpTo512LevelsAndRefusesDeeper) {
  const std::string levels_512 = std::string(512, '[') + std::string(512, ']');
  EXPECT_EQ(python_json_dumps(ojson::parse(levels_512)), levels_512);
  const std::string e =
      error_of([] { python_json_dumps(ojson::parse(std::string(513, '[') + std::string(513, ']'))); });
  EXPECT_NE(e.find("tojson: nested more than 512 arrays and objects deep"), std::string::npos) << e;
}
