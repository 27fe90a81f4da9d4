// titan generate: text from a Hugging Face checkpoint (a titan export or a Hub model), greedy or
// sampled, so a user can see what a trained model says. The loop is qwen3::generate (the prompt
// once, then each new token over a KV cache).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/parse.h"
#include "titan/core/suggest.h"
#include "titan/data/chat.h"
#include "titan/data/tokenizer.h"
#include "titan/io/json_error.h"
#include "titan/models/qwen3/generate.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint.h"
#include "titan/train/native_model.h"
#include "titan/train/train_state.h"

namespace titan::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

double number_option(const ArgParser& p, const std::string& name) {
  const std::string text = p.get(name);
  const std::optional<double> v = parse_number(text);
  TITAN_CHECK(v.has_value(), "titan generate: --", name, " ", text, ": expected a number");
  return *v;
}

// "1,2,3" (spaces allowed after commas): every element an integer.
std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t from = 0;
  while (from <= text.size()) {
    const size_t comma = std::min(text.find(',', from), text.size());
    std::string item = text.substr(from, comma - from);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    const std::optional<int64_t> id = parse_int(item);
    TITAN_CHECK(id.has_value(), "titan generate: --prompt-ids element ", ids.size(), " '", item,
                "' is not an integer (expected ids separated by commas, e.g. 785,3974,315)");
    ids.push_back(*id);
    from = comma + 1;
  }
  return ids;
}

// One prompt of a --prompts-file: its text, a conversation (its messages and tools), or its ids when
// the line gave "prompt_ids" (the others' once encoded).
struct PromptLine {
  int64_t line = 0;  // 1-based, in the file
  std::string text;
  nlohmann::ordered_json messages, tools;  // null unless the line is a conversation
  bool continue_final_message = false;     // its final (assistant) message left open, not a new turn
  std::vector<int64_t> ids;
  // Completions to score instead of continuing the prompt: their texts ("completion", or the
  // "choices" of a multiple-choice question) or their ids ("completion_ids", or the texts' once
  // encoded), one each.
  bool scores = false;
  std::vector<std::string> completions;
  std::vector<std::vector<int64_t>> completion_ids;
  bool choices = false;           // a multiple-choice question: its choices' scores rank them
  std::optional<int64_t> answer;  // the index of its right choice ("answer"), when given
};

// The prompts of a JSON Lines file: one object per non-blank line holding "prompt" (text),
// "prompt_ids" (ids) or "messages" (a conversation, with "tools" beside it when it has them);
// anything else is an error naming the file, the line and the rule.
std::vector<PromptLine> read_prompts_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(!fs::is_directory(path) && in, "titan generate: --prompts-file: cannot read '", path, "'");
  std::vector<PromptLine> prompts;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = "titan generate: " + path + " line " + std::to_string(number);
    nlohmann::ordered_json row;  // keys in the file's order: a tool call's arguments render in it
    // A key given twice on the line: JSON parsers keep one of the two silently.
    std::vector<std::string> line_keys;
    std::string repeated;
    const auto note_keys = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                               nlohmann::ordered_json& parsed) {
      if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key) {
        const std::string key = parsed.get<std::string>();
        if (repeated.empty() && std::find(line_keys.begin(), line_keys.end(), key) != line_keys.end())
          repeated = key;
        line_keys.push_back(key);
      }
      return true;
    };
    try {
      row = nlohmann::ordered_json::parse(text, note_keys);
    } catch (const json::parse_error& e) {
      const io::JsonErrorAt at = io::locate_json_error(text, e, uint64_t(number));
      TITAN_FAIL("titan generate: ", path, ": line ", at.line, ", column ", at.column, ": ", at.what);
    } catch (const json::exception& e) {  // valid syntax, a number past double's range (1e400)
      std::string what = e.what();
      if (const size_t at = what.find("] "); what.rfind("[json.exception", 0) == 0 && at != std::string::npos)
        what = what.substr(at + 2);
      TITAN_FAIL(where, ": ", what);
    }
    TITAN_CHECK(repeated.empty(), where, ": \"", repeated, "\" is given twice (which one is meant?)");
    // The line as written, not the value dumped: dump() recurses once per nesting level.
    TITAN_CHECK(row.is_object(), where, ": expected an object such as {\"prompt\": \"...\"}, got ",
                text.substr(0, 60));
    static const std::vector<std::string> kKeys = {
        "prompt",     "prompt_ids",     "messages", "tools", "continue_final_message",
        "completion", "completion_ids", "choices",  "answer"};
    for (const auto& [key, value] : row.items())
      TITAN_CHECK(
          std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end(), where, ": unknown key \"", key,
          "\" (a line holds \"prompt\", \"prompt_ids\" or \"messages\", and \"tools\", a \"completion\" or "
          "\"choices\" beside them)",
          suggestion(key, kKeys));
    TITAN_CHECK(
        int(row.contains("prompt")) + int(row.contains("prompt_ids")) + int(row.contains("messages")) == 1,
        where, ": give one of \"prompt\", \"prompt_ids\" and \"messages\"");
    TITAN_CHECK(!row.contains("tools") || row.contains("messages"), where,
                ": \"tools\" go with a conversation's \"messages\"");
    TITAN_CHECK(!row.contains("continue_final_message") || row.contains("messages"), where,
                ": \"continue_final_message\" goes with a conversation's \"messages\"");
    TITAN_CHECK(!row.contains("continue_final_message") || row["continue_final_message"].is_boolean(), where,
                ": \"continue_final_message\" must be true or false");
    TITAN_CHECK(int(row.contains("completion")) + int(row.contains("completion_ids")) +
                        int(row.contains("choices")) <=
                    1,
                where, ": give one of \"completion\", \"completion_ids\" and \"choices\"");
    TITAN_CHECK(!row.contains("answer") || row.contains("choices"), where,
                ": \"answer\" is the index of the right one of \"choices\"; the line has none");
    PromptLine prompt;
    prompt.line = number;
    if (row.contains("completion")) {
      TITAN_CHECK(row["completion"].is_string() && !row["completion"].get<std::string>().empty(), where,
                  ": \"completion\" must be a non-empty string");
      prompt.scores = true;
      prompt.completions = {row["completion"].get<std::string>()};
    } else if (row.contains("completion_ids")) {
      const nlohmann::ordered_json& ids = row["completion_ids"];
      TITAN_CHECK(ids.is_array() && !ids.empty(), where,
                  ": \"completion_ids\" must be a non-empty array of ids");
      prompt.completion_ids.emplace_back();
      for (size_t i = 0; i < ids.size(); ++i) {
        TITAN_CHECK(ids[i].is_number_integer(), where, ": \"completion_ids\" element ", i,
                    " is not an integer");
        prompt.completion_ids.back().push_back(ids[i].get<int64_t>());
      }
      prompt.scores = true;
    } else if (row.contains("choices")) {
      const nlohmann::ordered_json& choices = row["choices"];
      TITAN_CHECK(choices.is_array() && choices.size() >= 2, where,
                  ": \"choices\" must be an array of at least two strings (the answers to rank)");
      for (size_t i = 0; i < choices.size(); ++i) {
        TITAN_CHECK(choices[i].is_string() && !choices[i].get<std::string>().empty(), where,
                    ": \"choices\" element ", i, " must be a non-empty string");
        prompt.completions.push_back(choices[i].get<std::string>());
      }
      if (row.contains("answer")) {
        TITAN_CHECK(row["answer"].is_number_integer() && row["answer"].get<int64_t>() >= 0 &&
                        row["answer"].get<int64_t>() < int64_t(choices.size()),
                    where, ": \"answer\" must be the index of one of the ", choices.size(), " choices (0 .. ",
                    choices.size() - 1, ")");
        prompt.answer = row["answer"].get<int64_t>();
      }
      prompt.scores = prompt.choices = true;
    }
    TITAN_CHECK(prompts.empty() || prompts.front().scores == prompt.scores, where,
                prompt.scores ? ": a completion to score, where line " +
                                    std::to_string(prompts.front().line) + " is a prompt to continue"
                              : ": no completion to score, where line " +
                                    std::to_string(prompts.front().line) + " has one",
                " (a file either continues its prompts or scores their completions)");
    if (row.contains("messages")) {
      TITAN_CHECK(row["messages"].is_array() && !row["messages"].empty(), where,
                  ": \"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
      // Moved, not copied: a copy recurses once per nesting level (the renderer refuses deep values).
      prompt.messages = std::move(row["messages"]);
      if (const auto tools = row.find("tools"); tools != row.end()) prompt.tools = std::move(*tools);
      prompt.continue_final_message = row.value("continue_final_message", false);
    } else if (row.contains("prompt")) {
      TITAN_CHECK(row["prompt"].is_string(), where, ": \"prompt\" must be a string");
      prompt.text = row["prompt"].get<std::string>();
    } else {
      const nlohmann::ordered_json& ids = row["prompt_ids"];
      TITAN_CHECK(ids.is_array() && !ids.empty(), where, ": \"prompt_ids\" must be a non-empty array of ids");
      for (size_t i = 0; i < ids.size(); ++i) {
        TITAN_CHECK(ids[i].is_number_integer(), where, ": \"prompt_ids\" element ", i, " is not an integer");
        prompt.ids.push_back(ids[i].get<int64_t>());
      }
    }
    prompts.push_back(std::move(prompt));
  }
  TITAN_CHECK(!prompts.empty(), "titan generate: --prompts-file '", path, "' holds no prompt");
  return prompts;
}

// What score_file scored: completions, their tokens, the summed log-probability, the positions run
// and those taken from the KV cache, the multiple-choice questions with an answer and those whose
// best choice was it (lm-eval's acc and acc_norm), and the seconds taken.
struct FileScore {
  size_t completions = 0, tokens = 0;
  double logprob = 0;
  int64_t positions = 0, cached = 0;
  size_t answered = 0, correct = 0, correct_norm = 0;
  double seconds = 0;
};

// Unicode code points in UTF-8 text (Python's len of a str): lm-eval's acc_norm divides by it.
size_t code_points(const std::string& text) {
  return size_t(std::count_if(text.begin(), text.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

// The strings of a flag that takes one string or a JSON array of them (a string that starts with '['
// is given as an array of one: '["[INST]"]').
std::vector<std::string> string_list(const ArgParser& p, const std::string& flag) {
  const std::string text = p.get(flag);
  // A text that starts as an array is meant as one: a typo in it ('["a"', '["a",]', "['a']") would
  // otherwise become one literal string that never matches.
  if (text.empty() || text[0] != '[') return {text};
  const std::string one_string =
      "; a string that starts with '[' is given as an array of one, e.g. '[\"[INST]\"]'";
  nlohmann::json list;
  try {
    list = io::parse_json_text(text, "--" + flag + " " + text);
  } catch (const Error& e) {
    TITAN_FAIL("titan generate: ", e.what(), " (a text starting with '[' is read as a JSON array of strings)",
               one_string);
  }
  TITAN_CHECK(
      list.is_array() && !list.empty() &&
          std::all_of(list.begin(), list.end(), [](const nlohmann::json& v) { return v.is_string(); }),
      "titan generate: --", flag, " ", text,
      ": a JSON array gives several strings; this one holds something else", one_string);
  return list.get<std::vector<std::string>>();
}

// Scores the completions of every line of a --prompts-file in one qwen3::GenerationSession (a
// completion whose prompt starts as the one before's does runs only what follows: the choices of a
// multiple-choice question run the question once), printing one JSON line each, in order: its prompt
// and completion ids, each completion token's log-probability, their sum and whether every one was
// the most likely token; for a multiple-choice line, those of every choice, the best choice by summed
// log-probability ("pred", lm-eval's acc) and by log-probability per character ("pred_norm",
// acc_norm), and against its "answer" when it has one.
FileScore score_file(qwen3::Qwen3Model& model, const std::vector<PromptLine>& prompts,
                     const data::Tokenizer* tokenizer) {
  const auto start = std::chrono::steady_clock::now();
  FileScore all;
  qwen3::GenerationSession session(model);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const PromptLine& line = prompts[i];
    nlohmann::ordered_json out = {{"index", i}, {"line", line.line}, {"prompt_ids", line.ids}};
    nlohmann::ordered_json choices = nlohmann::ordered_json::array();
    std::vector<double> sums;
    for (const std::vector<int64_t>& completion : line.completion_ids) {
      const qwen3::ContinuationScore score = session.score(line.ids, completion);
      all.positions += int64_t(line.ids.size() + completion.size()) - 1;
      all.cached += session.reused();
      const double sum = std::accumulate(score.logprobs.begin(), score.logprobs.end(), 0.0);
      nlohmann::ordered_json one = {{"completion_ids", completion}};
      if (tokenizer)
        one["completion"] = tokenizer->decode(std::vector<int32_t>(completion.begin(), completion.end()));
      one["logprobs"] = score.logprobs;
      one["logprob"] = sum;
      one["greedy"] = score.greedy;
      choices.push_back(std::move(one));
      sums.push_back(sum);
      all.tokens += score.logprobs.size();
      all.logprob += sum;
      ++all.completions;
    }
    if (line.choices) {
      out["choices"] = std::move(choices);
      std::vector<double> normalised;
      for (size_t c = 0; c < sums.size(); ++c)
        normalised.push_back(sums[c] / double(std::max<size_t>(1, code_points(line.completions[c]))));
      const auto pred = std::max_element(sums.begin(), sums.end()) - sums.begin();  // the first best
      const auto pred_norm = std::max_element(normalised.begin(), normalised.end()) - normalised.begin();
      out["pred"] = pred;
      out["pred_norm"] = pred_norm;
      if (line.answer) {
        out["answer"] = *line.answer;
        out["acc"] = int(pred == *line.answer);
        out["acc_norm"] = int(pred_norm == *line.answer);
        ++all.answered;
        all.correct += pred == *line.answer;
        all.correct_norm += pred_norm == *line.answer;
      }
    } else {
      out.update(choices[0]);
    }
    out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  }
  all.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return all;
}

// Continues every prompt of a --prompts-file, batch_size at a time as the rows of one batch that a
// waiting prompt joins as another stops (qwen3::generate_batch), and prints each one's JSON line in
// the file's order as soon as it and every one before it are done; prompt i samples with seed + i.
// Returns the new tokens and the seconds they took.
std::pair<size_t, double> generate_file(qwen3::Qwen3Model& model, const std::vector<PromptLine>& prompts,
                                        const data::Tokenizer* tokenizer, qwen3::BatchOptions batch,
                                        int64_t samples, int64_t max_new,
                                        const qwen3::SamplingOptions& sampling,
                                        const std::vector<int64_t>& stop_ids,
                                        const std::vector<bool>& allowed) {
  std::vector<std::vector<int64_t>> ids;
  // Sample j of prompt i is row i * samples + j of the call, seeded seed + i * samples + j.
  const auto n = size_t(samples);
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t j = 0; j < n; ++j) {
      ids.push_back(prompts[i].ids);
      batch.seeds.push_back(sampling.seed + i * n + j);
    }
  std::vector<std::optional<std::string>> lines(ids.size());
  size_t printed = 0, new_tokens = 0;
  double seconds = 0;
  batch.on_done = [&](size_t row, const qwen3::Generation& g) {
    const size_t i = row / n;
    nlohmann::ordered_json out = {{"index", i}, {"line", prompts[i].line}};
    if (n > 1) out["sequence"] = row % n;
    out["prompt_ids"] = prompts[i].ids;
    out["ids"] = g.ids;
    if (tokenizer) out["text"] = tokenizer->decode(std::vector<int32_t>(g.ids.begin(), g.ids.end()));
    out["stop_reason"] = g.stop_reason;
    if (batch.logprobs) out["logprobs"] = g.logprobs;
    out["seconds"] = g.seconds;
    lines[row] = out.dump(-1, ' ', false, json::error_handler_t::replace);
    new_tokens += g.ids.size();
    seconds = std::max(seconds, g.seconds);
    for (; printed < lines.size() && lines[printed]; ++printed) std::printf("%s\n", lines[printed]->c_str());
    std::fflush(stdout);
  };
  qwen3::generate_batch(model, ids, max_new, sampling, stop_ids, allowed, batch);
  return {new_tokens, seconds};
}

// Beam search over every prompt of a --prompts-file, batch_size prompts at a time (their beams the
// rows of one batch, qwen3::beam_search_batch), printing one JSON line per returned sequence, with its
// "sequence" (0: the best) and "score", in the file's order as soon as the prompt and every one
// before it are done. Returns the new tokens and the seconds they took.
std::pair<size_t, double> search_file(qwen3::Qwen3Model& model, const std::vector<PromptLine>& prompts,
                                      const data::Tokenizer* tokenizer, const qwen3::BeamSearchOptions& beams,
                                      int64_t batch_size, int64_t max_new,
                                      const qwen3::SamplingOptions& processors,
                                      const std::vector<int64_t>& stop_ids,
                                      const qwen3::StopCheck& stop_check, const std::vector<bool>& allowed) {
  std::vector<std::vector<int64_t>> ids;
  for (const PromptLine& line : prompts) ids.push_back(line.ids);
  std::vector<std::optional<std::string>> lines(prompts.size());
  size_t printed = 0, new_tokens = 0;
  double seconds = 0;
  auto on_done = [&](size_t i, const std::vector<qwen3::Generation>& found) {
    std::string text;
    for (size_t r = 0; r < found.size(); ++r) {
      const qwen3::Generation& g = found[r];
      nlohmann::ordered_json out = {{"index", i},
                                    {"line", prompts[i].line},
                                    {"sequence", r},
                                    {"prompt_ids", prompts[i].ids},
                                    {"ids", g.ids}};
      if (tokenizer) out["text"] = tokenizer->decode(std::vector<int32_t>(g.ids.begin(), g.ids.end()));
      out["stop_reason"] = g.stop_reason;
      out["score"] = *g.score;
      out["seconds"] = g.seconds;
      text += out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      new_tokens += g.ids.size();
      seconds = std::max(seconds, g.seconds);
    }
    lines[i] = std::move(text);
    for (; printed < lines.size() && lines[printed]; ++printed) std::fputs(lines[printed]->c_str(), stdout);
    std::fflush(stdout);
  };
  qwen3::beam_search_batch(model, ids, max_new, beams, processors, stop_ids, allowed, batch_size, on_done,
                           stop_check);
  return {new_tokens, seconds};
}

// Text out as it is generated: after each token, what the ids so far decode to beyond what is
// already printed, as far as more ids cannot change it (Tokenizer::settled_length: a character cut
// between tokens waits for its next bytes; a tokenizer that cleans up spaces may rewrite the tail
// from the last space). What is printed in all is the decode of all the ids.
class TextStream {
 public:
  explicit TextStream(const data::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  void add(int64_t id) {
    ids_.push_back(int32_t(id));
    std::string text = tokenizer_.decode(ids_);
    text.resize(tokenizer_.settled_length(text));
    if (text.size() > printed_.size() && text.starts_with(printed_)) {
      std::fwrite(text.data() + printed_.size(), 1, text.size() - printed_.size(), stdout);
      std::fflush(stdout);
      printed_ = text;
    }
  }

  // Prints what is held back and the line's end; returns the whole text.
  std::string finish() {
    const std::string text = tokenizer_.decode(ids_);
    TITAN_CHECK(text.starts_with(printed_), "titan generate: the streamed text is not a prefix of the whole");
    std::printf("%s\n", text.substr(printed_.size()).c_str());
    std::fflush(stdout);
    return text;
  }

 private:
  const data::Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string printed_;
};

// What --interactive needs of the command's set-up: how a turn is generated, rendered and reported.
struct ChatSetup {
  // The conversation's ids, the assistant's turn opened (Qwen3's chat template, --no-think).
  std::function<std::vector<int64_t>(const nlohmann::ordered_json& messages)> render;
  int64_t max_new = 0;
  qwen3::SamplingOptions sampling;  // turn t (1-based) samples with seed + t - 1
  std::vector<int64_t> stop_ids;
  std::vector<bool> allowed;
  qwen3::StopCheck stop_check;
  bool json = false, logprobs = false;
  std::string system;   // --system ("": none)
  std::string runs_on;  // "float32 on cpu"
};

// --interactive: a conversation read from stdin, one user message a line (a line ending in a
// backslash goes on to the next), each reply streamed as it is generated (one JSON line per turn
// with --json). Every turn renders the whole conversation again, as transformers' chat renders it
// (earlier replies lose their <think> block), and runs only the positions after those it shares
// with the KV cache (qwen3::GenerationSession). "/reset" forgets the conversation (the system
// message stays), "/exit" or the end of input ends it. A turn that would pass max_seq_len is
// refused with the reason and left out of the conversation; the status is then 1 at the end.
int chat_on_stdin(qwen3::Qwen3Model& model, const data::Tokenizer& tokenizer, const ChatSetup& setup) {
  const bool terminal = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr,
               "generate: interactive chat (%s): one message a line (end a line with \\ to go on to the "
               "next); /reset forgets the conversation, /exit or end of input ends it\n",
               setup.runs_on.c_str());
  const nlohmann::ordered_json start =
      setup.system.empty() ? nlohmann::ordered_json::array()
                           : nlohmann::ordered_json::array({{{"role", "system"}, {"content", setup.system}}});
  nlohmann::ordered_json messages = start;
  qwen3::GenerationSession session(model);
  const int64_t max_seq = model.args().max_seq_len;
  int status = 0;
  int64_t turn = 0;
  for (;;) {
    if (terminal) std::fputs("> ", stderr);
    std::string message, line;
    bool more = true;
    while (more && std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      more = !line.empty() && line.back() == '\\';
      if (more) line.back() = '\n';
      message += line;
    }
    if (more && !message.empty() && message.back() == '\n') message.pop_back();  // input ended after a '\\'
    if (message.empty() && !std::cin) break;
    const size_t first = message.find_first_not_of(" \t\n");
    const std::string command = first == std::string::npos
                                    ? ""
                                    : message.substr(first, message.find_last_not_of(" \t\n") + 1 - first);
    if (command == "/exit") break;
    if (command == "/reset") {
      messages = start;
      std::fprintf(stderr, "generate: the conversation is forgotten\n");
      continue;
    }
    if (message.find_first_not_of(" \t\n") == std::string::npos) continue;
    messages.push_back({{"role", "user"}, {"content", message}});
    const std::vector<int64_t> prompt = setup.render(messages);
    if (int64_t(prompt.size()) > max_seq - setup.max_new) {
      std::fprintf(stderr,
                   "generate: error: the conversation would hold %zu tokens, and with --max-new-tokens %lld "
                   "they pass the model's max_seq_len (%lld); the message is left out (/reset to start "
                   "afresh)\n",
                   prompt.size(), (long long)setup.max_new, (long long)max_seq);
      messages.erase(messages.size() - 1);
      status = 1;
      continue;
    }
    ++turn;
    qwen3::SamplingOptions sampling = setup.sampling;
    sampling.seed += uint64_t(turn - 1);
    // The reply as shown and as the conversation keeps it: without the stop token that ended it (the
    // template closes the turn itself); a stop string stays, as in every other output.
    auto is_stop = [&](int64_t id) {
      return std::find(setup.stop_ids.begin(), setup.stop_ids.end(), id) != setup.stop_ids.end();
    };
    std::optional<TextStream> stream;
    if (!setup.json) stream.emplace(tokenizer);
    const qwen3::Generation g = session.generate(
        prompt, setup.max_new, sampling, setup.stop_ids, setup.allowed,
        [&](int64_t id) {
          if (stream && !is_stop(id)) stream->add(id);
        },
        setup.stop_check, setup.logprobs);
    std::vector<int32_t> reply(g.ids.begin(), g.ids.end());
    if (g.stop_reason == "stop token") reply.pop_back();
    const std::string text = tokenizer.decode(reply);
    if (stream) stream->finish();
    messages.push_back({{"role", "assistant"}, {"content", text}});
    if (setup.json) {
      nlohmann::ordered_json out = {{"turn", turn},
                                    {"prompt_tokens", prompt.size()},
                                    {"cached_tokens", session.reused()},
                                    {"ids", g.ids},
                                    {"text", text},
                                    {"stop_reason", g.stop_reason},
                                    {"seconds", g.seconds}};
      if (setup.logprobs) out["logprobs"] = g.logprobs;
      std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    }
    std::fprintf(stderr,
                 "generate: turn %lld: %zu new tokens in %.2f s (%.1f tokens/s), stopped at %s; the "
                 "conversation's %zu tokens, %lld of them from the KV cache\n",
                 (long long)turn, g.ids.size(), g.seconds, double(g.ids.size()) / std::max(g.seconds, 1e-9),
                 g.stop_reason.c_str(), prompt.size(), (long long)session.reused());
  }
  return status;
}

int generate_main(int argc, char** argv) {
  ArgParser p(
      "generate",
      "Continues a prompt with a Hugging Face checkpoint (a titan export such as\n"
      "<dump>/checkpoint/step-N-hf, or a Hub model folder) or a native titan checkpoint (step-N) and\n"
      "prints the new text. Greedy, or as the model's generation_config.json says (do_sample,\n"
      "temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff), as transformers'\n"
      "generate; --temperature > 0 samples (with --top-k / --top-p / --min-p / --typical-p /\n"
      "--epsilon-cutoff / --eta-cutoff), --temperature 0 is greedy, the same --seed giving the same text. "
      "The\n"
      "prompt runs through the model once, then each new token alone over a KV cache.\n"
      "Generation stops after --max-new-tokens, or at the tokenizer's eos_token or <|endoftext|> or the\n"
      "model's eos_token_id (config.json, generation_config.json).\n"
      "--prompts-file continues many prompts, --batch-size of them at a time as the rows of one batch,\n"
      "and prints one JSON line per prompt in the file's order. --num-beams N runs transformers' beam\n"
      "search instead (beam sampling when sampling; --length-penalty, --early-stopping,\n"
      "--num-return-sequences).\n"
      "--interactive chats on stdin, one message a line, keeping the KV cache from turn to turn.");
  p.option("model-path", "Hugging Face checkpoint folder (config.json + safetensors)")
      .option("checkpoint",
              "native titan checkpoint folder instead, e.g. outputs/debugmodel/checkpoint/step-40 "
              "(its MoE expert biases route as in training)")
      .option("prompt", "the text to continue (tokenized with the checkpoint's tokenizer)")
      .option("prompt-ids", "the prompt as token ids instead, e.g. 785,3974,315")
      .option(
          "prompts-file",
          "a JSON Lines file of prompts instead, one object per line: {\"prompt\": \"text\"}, "
          "{\"prompt_ids\": [785, 3974]} or, with --chat, {\"messages\": [...], \"tools\": [...]}; "
          "prints {\"index\", \"line\", \"prompt_ids\", \"ids\", \"text\", "
          "\"stop_reason\", \"seconds\"} per prompt, in order; prompt i samples with --seed + i; lines with "
          "a \"completion\" (or \"completion_ids\") are scored instead, lines with \"choices\" (and "
          "\"answer\") ranked as multiple-choice questions")
      .option("batch-size",
              "with --prompts-file: prompts generated together, as the rows of one batch (a prompt waiting "
              "takes the row of one that stops; with --num-beams, their beams are the rows)",
              "8")
      .flag(
          "chat",
          "--prompt is a user message: rendered with Qwen3's chat template with the assistant's turn opened, "
          "as transformers' apply_chat_template(..., add_generation_prompt=True) (docs/data.md, "
          "Conversations)")
      .flag("interactive",
            "chat on stdin: one user message a line (a line ending in \\ goes on), each reply streamed; the "
            "whole conversation is rendered again each turn (as --chat renders it) and only what changed "
            "runs (the KV cache is kept); /reset forgets the conversation, /exit or end of input ends it; "
            "turn t samples with --seed + t - 1")
      .option("system", "with --chat or --interactive: a system message before the user's")
      .option("tools",
              "with --chat or --interactive: a JSON file holding a list of tools (function schemas) the chat "
              "template shows the model, as transformers' apply_chat_template(tools=...); a --prompts-file "
              "conversation with its own \"tools\" keeps those")
      .flag("no-think",
            "with --chat: the assistant's turn opens with an empty <think> block (enable_thinking=False)")
      .option("tokenizer",
              "folder holding tokenizer.json (default: --model-path's own, or the run's for --checkpoint)")
      .option("max-new-tokens",
              "tokens to generate at most (default: the model's generation_config.json's max_new_tokens, "
              "else 32)",
              "32")
      .option(
          "temperature",
          "0: greedy (the most likely token); > 0: sample from softmax(logits / T); without it: as the "
          "model's generation_config.json says, else greedy (--top-k, --top-p, --min-p, --typical-p shape "
          "sampling and do not turn it on; default: the generation_config.json's when it samples, else 0)",
          "0")
      .option(
          "top-k",
          "sample among the k most likely tokens only (0: all; default: the model's generation_config.json's "
          "when it samples, else 0)",
          "0")
      .option("top-p",
              "sample among the most likely tokens whose probabilities reach p (default: the model's "
              "generation_config.json's when it samples, else 1)",
              "1")
      .option("min-p",
              "sample among the tokens at least p times as likely as the most likely (0: all; default: the "
              "model's generation_config.json's when it samples, else 0)",
              "0")
      .option("typical-p",
              "locally typical sampling: the tokens whose surprise is closest to the entropy, until their "
              "probabilities reach p (1: all; default: the model's generation_config.json's when it samples, "
              "else 1)",
              "1")
      .option("epsilon-cutoff",
              "sample among the tokens at least this likely, the most likely always (0: all; default: the "
              "model's generation_config.json's when it samples, else 0)",
              "0")
      .option("eta-cutoff",
              "as --epsilon-cutoff with the cut min(eta, sqrt(eta) * exp(-entropy)) (0: all; default: the "
              "model's generation_config.json's when it samples, else 0)",
              "0")
      .option("repetition-penalty",
              "divide the logit of every id already in the sequence by it (multiply when negative), greedy "
              "or sampled, as transformers (1: none; default: the model's generation_config.json's, else 1)",
              "1")
      .option(
          "no-repeat-ngram-size",
          "never choose a token that repeats an n-gram of the sequence, greedy or sampled, as transformers "
          "(0: none; default: the model's generation_config.json's, else 0)",
          "0")
      .option("num-beams",
              "beam search with this many beams, as transformers' (beam sampling when sampling; default: "
              "the model's generation_config.json's num_beams, else 1: no beam search)",
              "1")
      .option(
          "length-penalty",
          "beam search: finished sequences rank by score / new tokens^x (> 0 favours longer ones; default: "
          "the model's generation_config.json's length_penalty, else 1)",
          "1")
      .option(
          "early-stopping",
          "beam search: false (stop once no running beam would beat the finished ones at its length now), "
          "true (once --num-beams have finished), never (once none could at any length); default: the "
          "model's generation_config.json's early_stopping, else false",
          "false")
      .option("num-return-sequences",
              "beam search: print the best this many sequences (at most --num-beams); sampling: this many "
              "samples of each prompt, sample j of prompt i seeded --seed + i * N + j (default: the model's "
              "generation_config.json's, else 1)",
              "1")
      .option(
          "prompt-lookup",
          "prompt lookup decoding: draft up to this many tokens a step from an earlier occurrence of "
          "the text's last max_matching_ngram_size (2) tokens, kept where the search agrees (the same "
          "text for the same seed barring near-ties, in fewer passes; default: the model's "
          "generation_config.json's prompt_lookup_num_tokens, else 0; --prompts-file then runs one prompt "
          "at a time)",
          "0")
      .option(
          "min-new-tokens",
          "hold the stop ids back until this many new tokens, greedy, sampled or in beam search, as "
          "transformers (--stop strings still stop; 0: none; default: the model's generation_config.json's, "
          "else 0)",
          "0")
      .option("stop",
              "stop once the new text holds this string (it stays in the output), greedy, sampled or in beam "
              "search; a JSON array of strings for several, e.g. '[\"\\n\\n\", \"User:\"]' (default: the "
              "model's generation_config.json's stop_strings)")
      .option(
          "bad-words",
          "never generate this text (its tokens, as the tokenizer splits it without special tokens: mind a "
          "leading space), greedy, sampled or in beam search, as transformers' bad_words_ids; a JSON array "
          "of strings for several (added to the model's generation_config.json bad_words_ids)")
      .option("seed", "the sampler's seed", "0")
      .option("dtype", "compute dtype: float32 | bfloat16", "float32")
      .option("device", "cpu | cuda: where the model runs (the logits come back to the host for sampling)",
              "cpu")
      .flag("ignore-eos", "do not stop at the end-of-text tokens")
      .flag(
          "logprobs",
          "with --json or --prompts-file: each new token's log-probability under the model (the log-softmax "
          "of its logits, before any processor or sampling setting), as \"logprobs\"")
      .flag("json",
            "print one JSON object (prompt_ids, ids, text, stop_reason, seconds) instead of the text");
  p.may_be_empty("system").may_be_empty("prompt");  // empty turns render, unlike none (--chat)
  p.default_in_help({"max-new-tokens", "temperature", "top-k", "top-p", "min-p", "typical-p",
                     "epsilon-cutoff", "eta-cutoff", "repetition-penalty", "no-repeat-ngram-size",
                     "num-beams", "length-penalty", "early-stopping", "num-return-sequences", "prompt-lookup",
                     "min-new-tokens"});
  if (!p.parse(argc, argv)) return 0;

  const std::string device_text = p.get("device");
  TITAN_CHECK(device_text == "cpu" || device_text == "cuda", "titan generate: --device ", device_text,
              ": expected cpu or cuda", device_suggestion(device_text));
  const Device device = device_text == "cuda" ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA) {  // before any file is read: a machine without a GPU says so at once
    try {
      device_services(Device::CUDA);
    } catch (const Error& e) {
      TITAN_FAIL("titan generate: --device cuda: ", e.what());
    }
  }

  const bool native = p.has("checkpoint");
  TITAN_CHECK(native != p.has("model-path"),
              "titan generate: give either --model-path (a Hugging Face folder) or "
              "--checkpoint (a native step-N folder)",
              native ? ", not both" : "");
  const fs::path model_path = p.get(native ? "checkpoint" : "model-path");
  TITAN_CHECK(fs::is_directory(model_path), "titan generate: --", native ? "checkpoint" : "model-path", " '",
              model_path.string(), "' is not a folder");
  if (const std::string root = train::checkpoint_folder_given(model_path);
      native && !root.empty() && !fs::exists(model_path / "manifest.json"))
    TITAN_FAIL("titan generate: --checkpoint ", root);
  TITAN_CHECK(!native || fs::exists(model_path / "manifest.json") || !fs::exists(model_path / "config.json"),
              "titan generate: --checkpoint '", model_path.string(),
              "' is a Hugging Face folder (config.json, no manifest.json): give it as --model-path");
  TITAN_CHECK(native || !fs::exists(model_path / "manifest.json") || fs::exists(model_path / "config.json"),
              "titan generate: --model-path '", model_path.string(),
              "' is a native titan checkpoint (manifest.json, no config.json): give it as --checkpoint");
  const bool has_prompt = p.has("prompt"), has_ids = p.has("prompt-ids"), has_file = p.has("prompts-file");
  const bool interactive = p.has("interactive");
  TITAN_CHECK(int(has_prompt) + int(has_ids) + int(has_file) + int(interactive) == 1,
              "titan generate: give one of --prompt, --prompt-ids, --prompts-file and --interactive",
              has_prompt || has_ids || has_file ? ", not more" : "");
  TITAN_CHECK(has_file || !p.has("batch-size"),
              "titan generate: --batch-size sets how many prompts of "
              "--prompts-file run together; add --prompts-file");
  const int64_t batch_size = p.get_int("batch-size", 1);
  TITAN_CHECK(!p.has("logprobs") || p.has("json") || has_file,
              "titan generate: --logprobs are printed in JSON: add --json (or give --prompts-file)");
  TITAN_CHECK(!has_file || !p.has("json"),
              "titan generate: --prompts-file prints JSON lines already; --json is for one prompt");
  const bool chat = p.has("chat") || interactive;  // an interactive session is a chat
  TITAN_CHECK(chat || (!p.has("system") && !p.has("no-think")), "titan generate: --",
              p.has("system") ? "system" : "no-think", " shapes a --chat prompt; add --chat");
  TITAN_CHECK(!chat || !has_ids, "titan generate: --chat renders --prompt as a user message; give --prompt");
  // --tools: read before the model, so that a bad file fails at once.
  nlohmann::ordered_json tools = nullptr;
  if (p.has("tools")) {
    const std::string file = p.get("tools");
    TITAN_CHECK(chat, "titan generate: --tools are shown to the model by the chat template; add --chat");
    std::ifstream in(file);
    TITAN_CHECK(in, "titan generate: --tools ", file, ": cannot be read");
    tools = nlohmann::ordered_json::parse(in, nullptr, false);
    TITAN_CHECK(!tools.is_discarded(), "titan generate: --tools ", file, ": not JSON");
    TITAN_CHECK(tools.is_array() && !tools.empty(), "titan generate: --tools ", file,
                ": must hold a JSON list of tools (function schemas), got ",
                tools.is_array() ? std::string("an empty list") : std::string(tools.type_name()));
  }
  // The prompts file is read before the model, so that a bad line fails at once.
  std::vector<PromptLine> file_prompts;
  if (has_file) file_prompts = read_prompts_file(p.get("prompts-file"));
  // A file of completions to score generates nothing: a flag that shapes generation would do nothing.
  const bool scoring = !file_prompts.empty() && file_prompts.front().scores;
  if (scoring)
    for (const char* flag : {"max-new-tokens",
                             "min-new-tokens",
                             "prompt-lookup",
                             "temperature",
                             "top-k",
                             "top-p",
                             "min-p",
                             "typical-p",
                             "epsilon-cutoff",
                             "eta-cutoff",
                             "repetition-penalty",
                             "no-repeat-ngram-size",
                             "num-beams",
                             "length-penalty",
                             "early-stopping",
                             "num-return-sequences",
                             "stop",
                             "bad-words",
                             "seed",
                             "ignore-eos",
                             "logprobs",
                             "batch-size"})
      TITAN_CHECK(!p.has(flag), "titan generate: --", flag, " shapes generation, and the lines of ",
                  p.get("prompts-file"), " hold completions to score, not prompts to continue");
  for (const PromptLine& line : file_prompts) {
    const std::string where =
        "titan generate: " + p.get("prompts-file") + " line " + std::to_string(line.line);
    TITAN_CHECK(!chat || line.ids.empty(), where,
                ": --chat renders a \"prompt\" as a user message; \"prompt_ids\" are already ids");
    TITAN_CHECK(chat || line.messages.is_null(), where,
                ": \"messages\" is a conversation, rendered with the chat template: add --chat");
    TITAN_CHECK(line.messages.is_null() || !p.has("system"), where,
                ": --system goes before each \"prompt\"; a conversation's \"messages\" hold their own");
  }
  const DType dtype = dtype_from_name(p.get("dtype"));
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "titan generate: --dtype must be float32 or bfloat16, got ",
              p.get("dtype"));
  int64_t max_new = p.get_int("max-new-tokens", 1);
  qwen3::SamplingOptions sampling;
  sampling.temperature = number_option(p, "temperature");
  sampling.top_k = p.get_int("top-k", 0);
  sampling.top_p = number_option(p, "top-p");
  sampling.min_p = number_option(p, "min-p");
  sampling.typical_p = number_option(p, "typical-p");
  sampling.epsilon_cutoff = number_option(p, "epsilon-cutoff");
  sampling.eta_cutoff = number_option(p, "eta-cutoff");
  sampling.repetition_penalty = number_option(p, "repetition-penalty");
  sampling.no_repeat_ngram_size = p.get_int("no-repeat-ngram-size", 0);
  sampling.min_new_tokens = p.get_int("min-new-tokens", 0);
  sampling.prompt_lookup_num_tokens = p.get_int("prompt-lookup", 0);
  sampling.seed = uint64_t(p.get_int("seed", 0));
  sampling.validate();
  // The flags that shape sampling; each replaces its own field of the model's generation config.
  static const char* const kSamplingFlags[] = {"temperature", "top-k",          "top-p",     "min-p",
                                               "typical-p",   "epsilon-cutoff", "eta-cutoff"};

  // What the checkpoint says about itself, read before its weights so that a missing or changed
  // tokenizer fails at once: where its tokenizer is (the run's, for a native checkpoint, with the
  // checksum it was trained with) and its config (the model's own eos_token_id). The weights'
  // load below verifies train_state.json against the manifest.
  fs::path own_tokenizer = model_path;
  std::string trained_tokenizer;
  json model_config;
  if (native) {
    const json state = io::read_json_file(model_path / "train_state.json", "titan generate");
    TITAN_CHECK(state.is_object(), "titan generate: '", (model_path / "train_state.json").string(),
                "' is not a titan train state");
    own_tokenizer = state.value("tokenizer_path", std::string());
    trained_tokenizer = state.value("tokenizer_checksum", std::string());
    model_config = state.value("model_config", json::object());
  } else {
    model_config = io::read_json_file(model_path / "config.json", "titan generate");
  }
  // The tokenizer: the named one, else the checkpoint's own; none is needed for --prompt-ids (the
  // output is then ids).
  std::optional<data::Tokenizer> tokenizer;
  const fs::path own_file = data::tokenizer_json(own_tokenizer);
  if (auto named = p.get_optional("tokenizer")) {
    tokenizer = data::Tokenizer::load(*named);
    if (!trained_tokenizer.empty() && train::tokenizer_checksum(*named) != trained_tokenizer)
      std::fprintf(stderr,
                   "note: --tokenizer '%s' is not the tokenizer the checkpoint was trained with ('%s')\n",
                   named->c_str(), own_tokenizer.string().c_str());
  } else if (!own_tokenizer.empty() && fs::is_regular_file(own_file)) {
    // A native checkpoint names its tokenizer by path: one replaced there since would turn the
    // prompt into other ids and the output into other words, silently.
    TITAN_CHECK(trained_tokenizer.empty() || train::tokenizer_checksum(own_tokenizer) == trained_tokenizer,
                "titan generate: '", own_file.string(), "' is not the tokenizer.json the checkpoint '",
                model_path.string(),
                "' was trained with (its checksum differs); name the run's tokenizer with "
                "--tokenizer");
    tokenizer = data::Tokenizer::load(own_tokenizer);
  } else {
    const PromptLine* text_line = nullptr;
    for (const PromptLine& line : file_prompts)
      if (!text_line && line.ids.empty()) text_line = &line;
    TITAN_CHECK(!has_prompt && !text_line && !interactive, "titan generate: no tokenizer.json to encode ",
                text_line
                    ? std::string(text_line->messages.is_null() ? "the \"prompt\"" : "the \"messages\"") +
                          " of " + p.get("prompts-file") + " line " + std::to_string(text_line->line)
                    : std::string(interactive ? "--interactive's messages" : "--prompt"),
                " (looked for '", own_file.string(), "'); name one with --tokenizer, or give ",
                text_line ? "\"prompt_ids\"" : "--prompt-ids");
  }

  std::unique_ptr<qwen3::Qwen3Model> model;
  // The generation defaults of the model: generation_config.json beside an export, or the one a
  // native checkpoint recorded from the model its run started from (null: none).
  nlohmann::json generation_config;
  if (native) {
    train::NativeModel loaded = train::load_native_model(model_path, dtype, device);
    model = std::move(loaded.model);
    generation_config = loaded.generation_config;
    if (!loaded.unresumable.empty()) std::fprintf(stderr, "generate: note: %s\n", loaded.unresumable.c_str());
    if (!loaded.expert_bias.empty()) {  // route as the trained model did
      model->enable_expert_bias();
      model->set_expert_bias_values(loaded.expert_bias);
    }
  } else {
    model = qwen3::load_hf_model(model_path, dtype, device, qwen3::Purpose::Inference);
    generation_config = train::read_generation_config(model_path);  // null without one
  }
  const std::string where = native ? (model_path / "train_state.json").string() + " (generation_config)"
                                   : (model_path / "generation_config.json").string();
  const qwen3::GenerationDefaults defaults = qwen3::generation_defaults(generation_config, where);
  // Its max_new_tokens stands for --max-new-tokens when that is not given (transformers' generate
  // reads it); before the prompts are checked against max_seq_len with it.
  if (!p.has("max-new-tokens") && defaults.max_new_tokens > 0 && !scoring) {
    max_new = defaults.max_new_tokens;
    std::fprintf(stderr, "generate: max_new_tokens %lld, as %s says\n", (long long)max_new, where.c_str());
  }
  const int64_t vocab = model->args().vocab_size;
  TITAN_CHECK(!tokenizer || tokenizer->vocab_size() <= vocab, "titan generate: the tokenizer has ",
              tokenizer ? tokenizer->vocab_size() : 0, " ids but ", model_path.string(), " only ", vocab,
              ": they do not belong together");
  // A prompt's text as ids: a user message in Qwen3's chat template with --chat, else the text.
  // `what` names it in errors.
  if (chat) data::check_qwen3_chat_template(*tokenizer);
  // A conversation's ids with the assistant's turn opened (--no-think: its empty <think> block).
  // continue_final: the final (assistant) message left open instead (transformers'
  // continue_final_message).
  auto render = [&](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                    bool continue_final = false) {
    std::vector<int64_t> ids;
    const auto pieces =
        data::render_qwen3_chat(messages, tools, {!continue_final, !p.has("no-think"), continue_final});
    for (int32_t id : data::tokenize_chat(*tokenizer, pieces).ids) ids.push_back(id);
    return ids;
  };
  auto encode = [&](const std::string& text, const std::string& what) {
    std::vector<int64_t> ids;
    if (chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (p.has("system")) messages.push_back({{"role", "system"}, {"content", p.get("system")}});
      messages.push_back({{"role", "user"}, {"content", text}});
      ids = render(messages, tools);
    } else {
      for (int32_t id : tokenizer->encode(text)) ids.push_back(id);
      TITAN_CHECK(!ids.empty(), "titan generate: ", what, " is empty: there is nothing to continue");
    }
    return ids;
  };
  auto check_in_vocabulary = [&](const std::vector<int64_t>& ids, const std::string& what) {
    for (size_t i = 0; i < ids.size(); ++i)
      TITAN_CHECK(ids[i] >= 0 && ids[i] < vocab, "titan generate: ", what, "prompt token ", i, " is id ",
                  ids[i], ", outside the vocabulary of ", model_path.string(), " [0, ", vocab, ")");
  };
  // A prompt and its new tokens fit in the model's positions: otherwise the error names what to lower
  // and by how much.
  const std::string new_tokens_from = p.has("max-new-tokens") || defaults.max_new_tokens == 0
                                          ? "--max-new-tokens"
                                          : where + "'s max_new_tokens";
  const std::string positions_from =
      native ? (model_path / "train_state.json").string() + "'s model_config.max_position_embeddings"
             : (model_path / "config.json").string() + "'s max_position_embeddings";
  auto check_fits = [&](size_t prompt_tokens, const std::string& what) {
    const int64_t max_seq = model->args().max_seq_len;
    TITAN_CHECK(int64_t(prompt_tokens) <= max_seq - max_new, "titan generate: ", what, prompt_tokens,
                " prompt tokens + ", new_tokens_from, " ", max_new, " pass the model's max_seq_len ", max_seq,
                " (", positions_from, "): ",
                int64_t(prompt_tokens) >= max_seq
                    ? std::string("not one new token fits; shorten the prompt")
                    : "at most " + std::to_string(max_seq - int64_t(prompt_tokens)) +
                          " new tokens fit; lower --max-new-tokens or shorten the prompt");
  };
  std::vector<int64_t> prompt;
  if (has_prompt) {
    prompt = encode(p.get("prompt"), "--prompt");
  } else if (has_ids) {
    prompt = parse_ids(p.get("prompt-ids"));
  }
  check_in_vocabulary(prompt, "");
  if (!prompt.empty()) check_fits(prompt.size(), "");
  for (PromptLine& line : file_prompts) {
    const std::string where = p.get("prompts-file") + " line " + std::to_string(line.line);
    if (!line.messages.is_null()) {  // the conversation, the assistant's turn opened
      try {
        line.ids =
            render(line.messages, line.tools.is_null() ? tools : line.tools, line.continue_final_message);
      } catch (const Error& e) {
        TITAN_FAIL("titan generate: ", where, ": ", e.what());
      }
    } else if (line.ids.empty() && line.scores && !chat && line.completion_ids.empty()) {
      // A text prompt and text completions, encoded as lm-eval-harness encodes a pair: the prompt's
      // trailing whitespace moves to the completion, the two are encoded together, and the
      // completion is what follows the prompt's own ids (each alone when those do not lead).
      std::string context = line.text;
      const size_t end = context.find_last_not_of(" \t\n\r");
      const std::string trailing = context.substr(end == std::string::npos ? 0 : end + 1);
      context.erase(end == std::string::npos ? 0 : end + 1);
      line.ids = encode(context, where + "'s \"prompt\"");
      for (const std::string& completion : line.completions) {
        const std::string rest = trailing + completion;
        std::vector<int64_t> whole, ids;
        for (int32_t id : tokenizer->encode(context + rest)) whole.push_back(id);
        if (whole.size() > line.ids.size() && std::equal(line.ids.begin(), line.ids.end(), whole.begin()))
          ids.assign(whole.begin() + ptrdiff_t(line.ids.size()), whole.end());
        else
          for (int32_t id : tokenizer->encode(rest)) ids.push_back(id);
        line.completion_ids.push_back(std::move(ids));
      }
    } else if (line.ids.empty()) {
      line.ids = encode(line.text, where + "'s \"prompt\"");
    }
    check_in_vocabulary(line.ids, where + ": ");
    if (line.scores) {
      const char* what = line.choices ? "choice" : "completion";
      if (line.completion_ids.empty()) {  // texts after a rendered or given prompt
        TITAN_CHECK(tokenizer, "titan generate: no tokenizer.json to encode the \"", what, "\" of ", where,
                    "; name one with --tokenizer", line.choices ? "" : ", or give \"completion_ids\"");
        for (const std::string& completion : line.completions) {
          line.completion_ids.emplace_back();
          for (int32_t id : tokenizer->encode(completion)) line.completion_ids.back().push_back(id);
        }
      }
      for (size_t c = 0; c < line.completion_ids.size(); ++c) {
        const std::vector<int64_t>& ids = line.completion_ids[c];
        const std::string which = line.choices ? " of choice " + std::to_string(c) : "";
        for (size_t i = 0; i < ids.size(); ++i)
          TITAN_CHECK(ids[i] >= 0 && ids[i] < vocab, "titan generate: ", where, ": completion token ", i,
                      which, " is id ", ids[i], ", outside the vocabulary of ", model_path.string(), " [0, ",
                      vocab, ")");
        TITAN_CHECK(int64_t(line.ids.size() + ids.size()) <= model->args().max_seq_len,
                    "titan generate: ", where, ": ", line.ids.size(), " prompt tokens + ", ids.size(), " ",
                    what, " tokens", which, " pass the model's max_seq_len (", model->args().max_seq_len,
                    ")");
      }
      continue;
    }
    // Every line fits before any is generated (the output of the earlier ones is not cut short).
    check_fits(line.ids.size(), where + ": ");
  }
  if (scoring) {
    const FileScore s = score_file(*model, file_prompts, tokenizer ? &*tokenizer : nullptr);
    std::fprintf(
        stderr,
        "generate: scored %zu completions, %zu tokens in %.2f s: mean log-probability %.6g per token, "
        "perplexity %.6g (%s on %s; %lld of %lld positions from the KV cache)\n",
        s.completions, s.tokens, s.seconds, s.logprob / double(s.tokens),
        std::exp(-s.logprob / double(s.tokens)), std::string(dtype_name(dtype)).c_str(), device_text.c_str(),
        (long long)s.cached, (long long)s.positions);
    if (s.answered > 0)
      std::fprintf(
          stderr,
          "generate: %zu multiple-choice questions with an answer: acc %.4f (%zu right), acc_norm %.4f "
          "(%zu right; log-probability per character)\n",
          s.answered, double(s.correct) / double(s.answered), s.correct,
          double(s.correct_norm) / double(s.answered), s.correct_norm);
    return 0;
  }

  // With a tokenizer: only ids it can decode are chosen (the embedding's padding rows past the
  // tokenizer's vocabulary are never words). Generation stops at the end-of-text tokens: the
  // tokenizer's eos_token and <|endoftext|>, and the model's eos_token_id (config.json, and
  // generation_config.json beside it, as transformers' generate stops).
  std::vector<bool> allowed;
  std::vector<int64_t> stop_ids;
  if (tokenizer) {
    allowed.resize(size_t(vocab));
    for (int64_t id = 0; id < vocab; ++id) allowed[size_t(id)] = tokenizer->has_id(int32_t(id));
  }
  // The model's eos_token_id (config.json, generation_config.json) is what transformers' generate
  // stops at: one that is not an id would never stop it, silently (a mistyped file; named even under
  // --ignore-eos). Past the vocabulary: an error in generation_config.json, which says where to stop;
  // a note for config.json, which a run may have taken from another model with a larger vocabulary
  // (titan trains and exports such a model, and transformers loads it).
  const std::string model_file = native ? (model_path / "train_state.json").string() + " (model_config)"
                                        : (model_path / "config.json").string();
  std::vector<int64_t> config_eos;
  for (const auto& [c, file, stops] :
       {std::tuple<const json*, const std::string*, bool>{&model_config, &model_file, false},
        std::tuple<const json*, const std::string*, bool>{&generation_config, &where, true}}) {
    const json eos = c->is_object() ? c->value("eos_token_id", json()) : json();
    if (eos.is_null()) continue;
    for (const json& id : eos.is_array() ? eos : json::array({eos})) {
      TITAN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && (!stops || id.get<int64_t>() < vocab),
                  "titan generate: ", *file,
                  ": 'eos_token_id' must be a token id or a list of them, each an integer within the model's "
                  "vocabulary [0, ",
                  vocab, "), got ", eos.dump());
      if (id.get<int64_t>() >= vocab) {
        std::fprintf(stderr,
                     "note: %s: eos_token_id %lld is outside the model's vocabulary [0, %lld): not a stop "
                     "token\n",
                     file->c_str(), (long long)id.get<int64_t>(), (long long)vocab);
        continue;
      }
      config_eos.push_back(id.get<int64_t>());
    }
  }
  if (!p.has("ignore-eos")) {
    if (tokenizer)
      for (int32_t id : {tokenizer->eos_id(), tokenizer->document_separator_id()}) stop_ids.push_back(id);
    stop_ids.insert(stop_ids.end(), config_eos.begin(), config_eos.end());
    std::erase_if(stop_ids, [&](int64_t id) { return id < 0 || id >= vocab; });
  }

  // The model's own generation defaults, applied as transformers' generate applies them: each of its
  // sampling fields unless that field's flag is given (generate(temperature=0.7) keeps the config's
  // top_k and top_p), its repetition penalty unless the flag is.
  if (defaults.samples) {
    auto from_file = [&](const char* flag, auto& field, auto value) {
      if (!p.has(flag)) field = value;
    };
    from_file("temperature", sampling.temperature, defaults.sampling.temperature);
    from_file("top-k", sampling.top_k, defaults.sampling.top_k);
    from_file("top-p", sampling.top_p, defaults.sampling.top_p);
    from_file("min-p", sampling.min_p, defaults.sampling.min_p);
    from_file("typical-p", sampling.typical_p, defaults.sampling.typical_p);
    from_file("epsilon-cutoff", sampling.epsilon_cutoff, defaults.sampling.epsilon_cutoff);
    from_file("eta-cutoff", sampling.eta_cutoff, defaults.sampling.eta_cutoff);
  }
  if (sampling.temperature == 0) {
    // Greedy: a truncation flag given would do nothing (the file's own are moot, and dropped).
    // (--seed too: nothing is drawn.)
    const std::string greedy_because = p.has("temperature") ? std::string("--temperature 0")
                                       : generation_config.is_null()
                                           ? "the model has no generation_config.json: greedy by default"
                                           : where + " does not sample (do_sample false)";
    for (const char* flag : kSamplingFlags)
      TITAN_CHECK(std::string(flag) == "temperature" || !p.has(flag), "titan generate: --", flag,
                  " shapes sampling, and this run decodes greedily (", greedy_because,
                  "): it would do nothing; add --temperature T > 0 to sample");
    TITAN_CHECK(!p.has("seed"), "titan generate: --seed seeds sampling, and this run decodes greedily (",
                greedy_because, "): it would do nothing; add --temperature T > 0 to sample");
    sampling.top_k = 0, sampling.top_p = 1, sampling.min_p = 0, sampling.typical_p = 1;
    sampling.epsilon_cutoff = 0, sampling.eta_cutoff = 0;
  }
  // Beam search: --num-beams, else the model's num_beams, as transformers'; with sampling (the
  // config's do_sample, or a flag's temperature > 0) it is beam sampling.
  qwen3::BeamSearchOptions beams = defaults.beams;
  if (p.has("num-beams")) beams.num_beams = p.get_int("num-beams", 1);
  if (interactive && beams.num_beams > 1) {  // a beam's tokens are final only when the search ends
    TITAN_CHECK(!p.has("num-beams"), "titan generate: --num-beams ", beams.num_beams,
                ": --interactive streams each reply as it is generated, and a beam search's tokens are final "
                "only at its end");
    std::fprintf(stderr,
                 "generate: note: %s sets num_beams %lld, not applied: --interactive streams its replies\n",
                 where.c_str(), (long long)beams.num_beams);
    beams.num_beams = 1;
  }
  if (p.has("length-penalty")) beams.length_penalty = number_option(p, "length-penalty");
  if (p.has("num-return-sequences") && beams.num_beams > 1)
    beams.num_return_sequences = p.get_int("num-return-sequences", 1);
  if (p.has("early-stopping")) {
    const std::string early = p.get("early-stopping");
    TITAN_CHECK(early == "false" || early == "true" || early == "never", "titan generate: --early-stopping ",
                early, ": expected false, true or never", suggestion(early, {"false", "true", "never"}));
    beams.early_stopping = early == "never"  ? qwen3::EarlyStopping::Never
                           : early == "true" ? qwen3::EarlyStopping::Always
                                             : qwen3::EarlyStopping::Heuristic;
  }
  if (beams.num_beams > 1) {
    TITAN_CHECK(!p.has("logprobs"),
                "titan generate: --logprobs: beam search gives each sequence's score instead");
    try {
      beams.validate();
    } catch (const Error& e) {
      TITAN_FAIL("titan generate: ", e.what(),
                 p.has("num-beams") && p.has("num-return-sequences") ? "" : " (with " + where + "'s values)");
    }
    static const char* const kEarly[] = {"false", "true", "never"};
    const bool beam_sampling = sampling.temperature > 0;
    std::fprintf(stderr,
                 "generate: beam %s%s: %lld beams, length_penalty %g, early_stopping %s, "
                 "%lld sequence%s\n",
                 beam_sampling ? "sampling" : "search",
                 p.has("num-beams") ? "" : (" as " + where + " says").c_str(), (long long)beams.num_beams,
                 beams.length_penalty, kEarly[int(beams.early_stopping)],
                 (long long)beams.num_return_sequences, beams.num_return_sequences == 1 ? "" : "s each");
  } else {
    for (const char* flag : {"length-penalty", "early-stopping"})
      TITAN_CHECK(!p.has(flag), "titan generate: --", flag, " shapes beam search; ",
                  interactive ? "--interactive streams its replies and searches no beams"
                              : "add --num-beams N (N >= 2)");
  }
  if (defaults.samples && sampling.temperature > 0) {
    std::string given;  // the fields the flags replaced
    for (const char* flag : kSamplingFlags)
      if (p.has(flag)) given += std::string(given.empty() ? ", except --" : ", --") + flag;
    char more[160] = "";
    if (sampling.min_p > 0 || sampling.typical_p < 1 || sampling.epsilon_cutoff > 0 ||
        sampling.eta_cutoff > 0)
      std::snprintf(more, sizeof more, ", min_p %g, typical_p %g, epsilon_cutoff %g, eta_cutoff %g",
                    sampling.min_p, sampling.typical_p, sampling.epsilon_cutoff, sampling.eta_cutoff);
    std::fprintf(stderr,
                 "generate: sampling as %s says%s: temperature %g, top_k %lld, top_p %g%s (seed %llu; "
                 "--temperature 0 for greedy)\n",
                 where.c_str(), given.c_str(), sampling.temperature, (long long)sampling.top_k,
                 sampling.top_p, more, (unsigned long long)sampling.seed);
  }
  // Several samples of a prompt (num_return_sequences without beams): only when sampling.
  int64_t samples = 1;
  if (beams.num_beams == 1) {
    const int64_t asked = p.has("num-return-sequences") ? p.get_int("num-return-sequences", 1)
                                                        : defaults.beams.num_return_sequences;
    if (asked > 1 && interactive) {
      TITAN_CHECK(!p.has("num-return-sequences"), "titan generate: --num-return-sequences ", asked,
                  ": --interactive gives one reply a turn");
      std::fprintf(stderr,
                   "generate: note: %s sets num_return_sequences %lld, not applied: --interactive gives one "
                   "reply a turn\n",
                   where.c_str(), (long long)asked);
    } else if (asked > 1 && sampling.temperature > 0) {
      samples = asked;
    } else if (asked > 1) {
      TITAN_CHECK(!p.has("num-return-sequences"), "titan generate: --num-return-sequences ", asked,
                  ": greedy search gives one sequence; sample (--temperature T > 0) or search beams "
                  "(--num-beams N >= ",
                  asked, ")");
      std::fprintf(
          stderr, "generate: note: %s sets num_return_sequences %lld, not applied: greedy search gives one\n",
          where.c_str(), (long long)asked);
    }
  }
  if (!p.has("repetition-penalty") && defaults.sampling.repetition_penalty != 1) {
    sampling.repetition_penalty = defaults.sampling.repetition_penalty;
    std::fprintf(stderr, "generate: repetition_penalty %g, as %s says\n", sampling.repetition_penalty,
                 where.c_str());
  }
  if (!p.has("min-new-tokens") && defaults.sampling.min_new_tokens != 0) {
    sampling.min_new_tokens = defaults.sampling.min_new_tokens;
    std::fprintf(stderr, "generate: min_new_tokens %lld, as %s says\n", (long long)sampling.min_new_tokens,
                 where.c_str());
  }
  // Prompt lookup decoding: greedy or sampled, not beside beams (as transformers: asked by the flag,
  // an error; by the file, a note).
  sampling.max_matching_ngram_size = defaults.sampling.max_matching_ngram_size;
  const bool lookup_flag = p.has("prompt-lookup");
  if (!lookup_flag) sampling.prompt_lookup_num_tokens = defaults.sampling.prompt_lookup_num_tokens;
  if (sampling.prompt_lookup_num_tokens > 0) {
    const char* why = beams.num_beams > 1 ? "beam search runs its beams as one batch" : nullptr;
    TITAN_CHECK(!(why && lookup_flag), "titan generate: --prompt-lookup ", sampling.prompt_lookup_num_tokens,
                ": ", why ? why : "");
    if (why) {
      std::fprintf(stderr, "generate: note: %s sets prompt_lookup_num_tokens %lld, not applied: %s\n",
                   where.c_str(), (long long)sampling.prompt_lookup_num_tokens, why);
      sampling.prompt_lookup_num_tokens = 0;
    } else {
      std::fprintf(stderr,
                   "generate: prompt lookup decoding: up to %lld draft tokens a step (n-grams of %lld)%s\n",
                   (long long)sampling.prompt_lookup_num_tokens, (long long)sampling.max_matching_ngram_size,
                   lookup_flag ? "" : (", as " + where + " says").c_str());
    }
  }
  // The processors only the model's generation config sets, greedy, sampled or in beam search; and
  // --bad-words, texts added to its bad_words_ids.
  {
    const qwen3::SamplingOptions& d = defaults.sampling;
    sampling.min_length = d.min_length;
    sampling.bad_words_ids = d.bad_words_ids;
    sampling.sequence_bias = d.sequence_bias;
    sampling.suppress_tokens = d.suppress_tokens;
    sampling.begin_suppress_tokens = d.begin_suppress_tokens;
    sampling.forced_bos_token_id = d.forced_bos_token_id;
    sampling.forced_eos_token_ids = d.forced_eos_token_ids;
    sampling.length_decay_start = d.length_decay_start;
    sampling.length_decay_factor = d.length_decay_factor;
    sampling.renormalize_logits = d.renormalize_logits;
    const std::vector<std::pair<const char*, bool>> set = {
        {"min_length", d.min_length > 0},
        {"bad_words_ids", !d.bad_words_ids.empty()},
        {"sequence_bias", !d.sequence_bias.empty()},
        {"suppress_tokens", !d.suppress_tokens.empty()},
        {"begin_suppress_tokens", !d.begin_suppress_tokens.empty()},
        {"forced_bos_token_id", d.forced_bos_token_id >= 0},
        {"forced_eos_token_id", !d.forced_eos_token_ids.empty()},
        {"exponential_decay_length_penalty", d.length_decay_factor != 1},
        {"renormalize_logits", d.renormalize_logits}};
    for (const auto& [key, applies] : set)
      if (applies) std::fprintf(stderr, "generate: %s applied, as %s says\n", key, where.c_str());
  }
  if (p.has("bad-words")) {
    TITAN_CHECK(tokenizer,
                "titan generate: --bad-words are texts, which need a tokenizer; name one with --tokenizer");
    for (const std::string& text : string_list(p, "bad-words")) {
      std::vector<int64_t> ids;
      for (int32_t id : tokenizer->encode(text)) ids.push_back(id);
      TITAN_CHECK(!ids.empty(), "titan generate: --bad-words: an empty string names no token");
      sampling.bad_words_ids.push_back(std::move(ids));
    }
  }
  // Stop strings: --stop (a string, or a JSON array of strings), else the model's stop_strings. A
  // sequence stops once its new text holds one; only the last tokens are decoded, as many as the
  // longest string has bytes and one more (each token is at least one byte of the text).
  std::vector<std::string> stop_strings = defaults.stop_strings;
  if (p.has("stop")) {
    stop_strings = string_list(p, "stop");
    for (const std::string& stop : stop_strings)
      TITAN_CHECK(!stop.empty(), "titan generate: --stop: an empty string would stop at once");
  } else if (!stop_strings.empty()) {
    std::fprintf(stderr, "generate: stop_strings %s, as %s says\n", json(stop_strings).dump().c_str(),
                 where.c_str());
  }
  TITAN_CHECK(
      stop_strings.empty() || tokenizer || !p.has("stop"),
      "titan generate: --stop reads the new text, which needs a tokenizer; name one with --tokenizer");
  if (!stop_strings.empty() && !tokenizer) {  // the model's own, with ids in and out: nothing to read
    std::fprintf(stderr,
                 "generate: note: %s's stop_strings not applied: there is no tokenizer to read the text\n",
                 where.c_str());
    stop_strings.clear();
  }
  qwen3::StopCheck stop_check;
  if (!stop_strings.empty()) {
    size_t window = 0;
    for (const std::string& stop : stop_strings) window = std::max(window, stop.size() + 1);
    stop_check = [&tokenizer, &stop_strings, window](const std::vector<int64_t>& ids) {
      const size_t from = ids.size() > window ? ids.size() - window : 0;
      const std::string text =
          tokenizer->decode(std::vector<int32_t>(ids.begin() + ptrdiff_t(from), ids.end()));
      return std::any_of(stop_strings.begin(), stop_strings.end(),
                         [&](const std::string& stop) { return text.find(stop) != std::string::npos; });
    };
  }
  if (!p.has("no-repeat-ngram-size") && defaults.sampling.no_repeat_ngram_size != 0) {
    sampling.no_repeat_ngram_size = defaults.sampling.no_repeat_ngram_size;
    std::fprintf(stderr, "generate: no_repeat_ngram_size %lld, as %s says\n",
                 (long long)sampling.no_repeat_ngram_size, where.c_str());
  }
  for (const std::string& key : defaults.not_applied)
    std::fprintf(stderr, "generate: note: %s sets %s, which titan's sampler does not apply\n", where.c_str(),
                 key.c_str());
  if (interactive) {
    ChatSetup setup;
    setup.render = [&](const nlohmann::ordered_json& messages) { return render(messages, tools); };
    setup.max_new = max_new;
    setup.sampling = sampling;
    setup.stop_ids = stop_ids;
    setup.allowed = allowed;
    setup.stop_check = stop_check;
    setup.json = p.has("json");
    setup.logprobs = p.has("logprobs");
    setup.system = p.has("system") ? p.get("system") : "";
    setup.runs_on = std::string(dtype_name(dtype)) + " on " + device_text;
    // A first message of one token must fit with its reply, or every turn would be refused.
    nlohmann::ordered_json first = nlohmann::ordered_json::array();
    if (!setup.system.empty()) first.push_back({{"role", "system"}, {"content", setup.system}});
    first.push_back({{"role", "user"}, {"content", "x"}});
    const size_t least = setup.render(first).size();
    TITAN_CHECK(int64_t(least) <= model->args().max_seq_len - max_new,
                "titan generate: --interactive: ", least,
                " tokens of the shortest first turn + --max-new-tokens ", max_new,
                " pass the model's max_seq_len (", model->args().max_seq_len, "): no turn could be answered");
    return chat_on_stdin(*model, *tokenizer, setup);
  }
  qwen3::BatchOptions how;  // for generate_batch
  how.stop_check = stop_check;
  how.logprobs = p.has("logprobs");
  if (has_file && beams.num_beams > 1) {
    const auto [new_tokens, seconds] =
        search_file(*model, file_prompts, tokenizer ? &*tokenizer : nullptr, beams, batch_size, max_new,
                    sampling, stop_ids, stop_check, allowed);
    std::fprintf(stderr,
                 "generate: %zu prompts, %zu new tokens in %.2f s (%.1f tokens/s returned, beam %s, %lld "
                 "prompts x %lld beams a batch, %s on %s)\n",
                 file_prompts.size(), new_tokens, seconds, double(new_tokens) / std::max(seconds, 1e-9),
                 sampling.temperature > 0 ? "sampling" : "search", (long long)batch_size,
                 (long long)beams.num_beams, std::string(dtype_name(dtype)).c_str(), device_text.c_str());
    return 0;
  }
  if (has_file) {
    qwen3::BatchOptions file_batch = how;
    file_batch.batch_size = batch_size;
    const auto [new_tokens, seconds] =
        generate_file(*model, file_prompts, tokenizer ? &*tokenizer : nullptr, file_batch, samples, max_new,
                      sampling, stop_ids, allowed);
    std::fprintf(stderr, "generate: %zu prompts, %zu new tokens in %.2f s (%.1f tokens/s, %s, %s on %s)\n",
                 file_prompts.size(), new_tokens, seconds, double(new_tokens) / std::max(seconds, 1e-9),
                 sampling.prompt_lookup_num_tokens > 0 ? "one at a time (prompt lookup)"
                                                       : ("batches of " + std::to_string(batch_size)).c_str(),
                 std::string(dtype_name(dtype)).c_str(), device_text.c_str());
    return 0;
  }
  // One prompt's several sequences (beams or samples), none streamed: with --json one object each,
  // else each text (its ids without a tokenizer) under the line `header` gives it (none when empty).
  // Returns their new tokens.
  auto print_sequences = [&](const std::vector<qwen3::Generation>& found,
                             const std::function<std::string(size_t, const qwen3::Generation&)>& header) {
    size_t new_tokens = 0;
    for (size_t r = 0; r < found.size(); ++r) {
      const qwen3::Generation& g = found[r];
      new_tokens += g.ids.size();
      std::string text;
      if (tokenizer) text = tokenizer->decode(std::vector<int32_t>(g.ids.begin(), g.ids.end()));
      if (p.has("json")) {
        json out = {{"sequence", r},
                    {"prompt_ids", prompt},
                    {"ids", g.ids},
                    {"stop_reason", g.stop_reason},
                    {"seconds", g.seconds}};
        if (g.score) out["score"] = *g.score;
        if (tokenizer) out["text"] = text;
        if (how.logprobs) out["logprobs"] = g.logprobs;
        std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
        continue;
      }
      if (const std::string line = header(r, g); !line.empty()) std::printf("%s\n", line.c_str());
      if (!tokenizer)
        for (int64_t id : g.ids) text += (text.empty() ? "" : ",") + std::to_string(id);
      std::printf("%s\n", text.c_str());
    }
    return new_tokens;
  };
  if (beams.num_beams > 1) {  // a beam's tokens are final only when the search ends
    const std::vector<qwen3::Generation> found = qwen3::beam_search_batch(
        *model, {prompt}, max_new, beams, sampling, stop_ids, allowed, 1, {}, stop_check)[0];
    const size_t new_tokens = print_sequences(found, [&](size_t r, const qwen3::Generation& g) {
      char line[160] = "";
      if (found.size() > 1)
        std::snprintf(line, sizeof line, "--- sequence %zu of %zu: score %.6g, %s ---", r + 1, found.size(),
                      *g.score, g.stop_reason.c_str());
      return std::string(line);
    });
    std::fprintf(stderr,
                 "generate: beam %s over %lld beams: %zu sequence%s (%zu new tokens) after %zu prompt tokens "
                 "in %.2f s (%s on %s)\n",
                 sampling.temperature > 0 ? "sampling" : "search", (long long)beams.num_beams, found.size(),
                 found.size() == 1 ? "" : "s", new_tokens, prompt.size(),
                 found.empty() ? 0.0 : found[0].seconds, std::string(dtype_name(dtype)).c_str(),
                 device_text.c_str());
    return 0;
  }
  if (samples > 1) {  // several samples of the prompt, the rows of one batch
    qwen3::BatchOptions batch = how;
    for (int64_t j = 0; j < samples; ++j) batch.seeds.push_back(sampling.seed + uint64_t(j));
    const std::vector<qwen3::Generation> found =
        qwen3::generate_batch(*model, std::vector<std::vector<int64_t>>(size_t(samples), prompt), max_new,
                              sampling, stop_ids, allowed, batch);
    double seconds = 0;
    for (const qwen3::Generation& g : found) seconds = std::max(seconds, g.seconds);
    const size_t new_tokens = print_sequences(found, [&](size_t r, const qwen3::Generation& g) {
      char line[160];
      std::snprintf(line, sizeof line, "--- sample %zu of %zu (seed %llu), %s ---", r + 1, found.size(),
                    (unsigned long long)(sampling.seed + r), g.stop_reason.c_str());
      return std::string(line);
    });
    std::fprintf(stderr,
                 "generate: %lld samples (%zu new tokens) after %zu prompt tokens in %.2f s (%s on %s)\n",
                 (long long)samples, new_tokens, prompt.size(), seconds,
                 std::string(dtype_name(dtype)).c_str(), device_text.c_str());
    return 0;
  }
  std::optional<TextStream> stream;  // text out as it is generated
  if (tokenizer && !p.has("json")) {
    stream.emplace(*tokenizer);
    how.on_token = [&](size_t, int64_t id) { stream->add(id); };
  }
  const qwen3::Generation g =
      qwen3::generate_batch(*model, {prompt}, max_new, sampling, stop_ids, allowed, how)[0];
  if (p.has("json")) {
    json out = {{"prompt_ids", prompt}, {"ids", g.ids}, {"stop_reason", g.stop_reason}, {"seconds", g.seconds}};
    if (tokenizer) out["text"] = tokenizer->decode(std::vector<int32_t>(g.ids.begin(), g.ids.end()));
    if (how.logprobs) out["logprobs"] = g.logprobs;
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else if (stream) {
    stream->finish();  // the rest (a held-back ending), then the line's end
  } else {
    std::string line;
    for (int64_t id : g.ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
  std::fprintf(
      stderr,
      "generate: %zu new tokens after %zu prompt tokens in %.2f s (%.1f tokens/s, %s on %s), stopped at %s\n",
      g.ids.size(), prompt.size(), g.seconds, double(g.ids.size()) / std::max(g.seconds, 1e-9),
      std::string(dtype_name(dtype)).c_str(), device_text.c_str(), g.stop_reason.c_str());
  if (sampling.prompt_lookup_num_tokens > 0)
    std::fprintf(stderr,
                 "generate: prompt lookup: %lld of %lld drafted tokens kept, %lld passes for %zu tokens\n",
                 (long long)g.accepted, (long long)g.drafted, (long long)g.passes, g.ids.size());
  return 0;
}

TITAN_COMMAND("generate", "continue a prompt with a Hugging Face or native checkpoint (greedy or sampled)",
              generate_main);

}  // namespace
}  // namespace titan::cli
