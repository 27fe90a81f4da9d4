#pragma once
// Conversations for supervised fine-tuning (`training.chat_field`).
//
// A record's messages (and its `tools`, when it has them) are rendered exactly as transformers'
// apply_chat_template renders them with the chat template of Qwen3's tokenizer_config.json (no
// generation prompt), then tokenized as one text. The loss trains on what the model is asked to
// produce: each assistant message after its "<|im_start|>assistant\n" header, its reasoning block,
// content and tool calls, through its <|im_end|>. Everything else (system, user and tool turns,
// the headers, the newline after each <|im_end|>) is context only.
//
// Where the Jinja template would render something odd without complaint (a role it does not know,
// which it drops; a content that is not a string; a tool call without a name), the renderer stops
// with an error naming the message and the field instead.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/data/tokenizer.h"

namespace titan::data {

// One stretch of the rendered conversation; the concatenation of a conversation's pieces is the
// template's output.
struct ChatPiece {
  std::string text;
  bool trained = false;  // the loss trains on the tokens that start in it
};

// The template's switches for a prompt to generate from (transformers' apply_chat_template arguments).
struct ChatPrompt {
  bool add_generation_prompt = false;  // end with "<|im_start|>assistant\n": the turn the model writes
  bool enable_thinking = true;         // false: that turn opens with an empty <think> block (no reasoning)
  // The final message (the assistant's, without tool calls) left open for the model to go on with:
  // the rendered text cut after the last occurrence of its content, as transformers'
  // continue_final_message cuts it (trailing whitespace kept when the message starts with none and
  // the rendering keeps it, else the content stripped as Python strips it). Not with
  // add_generation_prompt.
  bool continue_final_message = false;
};

// `messages`: an array of objects {"role": system | user | assistant | tool, "content": string},
// an assistant message optionally with "reasoning_content" (string or null) and "tool_calls"
// (an array of {"name", "arguments"} or {"function": {"name", "arguments"}}, arguments a string or
// any JSON value); `tools`: null, or an array of JSON values (the function signatures). Object keys
// keep their order (tojson does not sort them). Without a generation prompt a conversation without
// an assistant message has nothing to train on and is an error. Errors name the message (0-based)
// and the field.
std::vector<ChatPiece> render_qwen3_chat(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools = nullptr,
                                         const ChatPrompt& prompt = {});

// ShareGPT's messages ({"from": "human" | "gpt" | "system", "value": ...}, listed under "conversations")
// are not read (a format of its own, whose "from" takes other values in some datasets). Errors that
// meet one say how to write it as the messages above:
// looks_like_sharegpt is true for an object with "from" and no "role", or "value" and no "content";
// sharegpt_mapping is "write \"from\" as \"role\" (human -> user, ...) and \"value\" as \"content\"".
bool looks_like_sharegpt(const nlohmann::ordered_json& message);
std::string sharegpt_mapping();

// A conversation record as training reads it (training.chat_field): an object whose field `chat_field`
// holds the messages and whose optional "tools" the signatures, rendered. An error says what the record
// is instead: not an object; without the field (its fields listed, with the field holding a ShareGPT
// list, or messages under another name, pointed out); or the renderer's error after
// "field '<chat_field>': ". The callers add where the record is.
std::vector<ChatPiece> render_chat_record(const nlohmann::ordered_json& record,
                                          const std::string& chat_field);

// Python's json.dumps(value, ensure_ascii=False): the template's `tojson` filter.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// The rendered text: the pieces' concatenation.
std::string chat_text(const std::vector<ChatPiece>& pieces);

// Refuses a tokenizer whose chat template is other than Qwen3's (the one render_qwen3_chat
// reproduces): a model would be fine-tuned, or asked, in a format it does not know. The template is
// chat_template.jinja beside tokenizer.json where there is one (as transformers reads it), else
// tokenizer_config.json's chat_template; a tokenizer without one is accepted (Qwen3's is what titan
// renders).
void check_qwen3_chat_template(const Tokenizer& tokenizer);

// The conversation's tokens (the ids tokenizer.encode gives the whole rendered text) and, per
// token, whether the loss trains on it: a token is trained when its first byte lies in a trained
// piece. (A token that straddles a piece boundary, such as "\n\n" when an assistant message starts
// with a newline, belongs to the piece it starts in.)
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // 0 or 1, one per id
};
ChatTokens tokenize_chat(const Tokenizer& tokenizer, const std::vector<ChatPiece>& pieces);

}  // namespace titan::data
