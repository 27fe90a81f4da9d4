#include "titan/train/job_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "titan/core/check.h"
#include "titan/core/glob.h"
#include "titan/core/parse.h"
#include "titan/core/suggest.h"
#include "titan/data/assets.h"
#include "titan/dist/communicator.h"
#include "titan/io/path_guard.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config_reference.h"
#include "titan/train/torchtitan_keys.h"

namespace titan::train {

namespace {

// Shortest text that reads back as the same double (the config in effect must be exact).
std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// One settable key: parses a textual value (from TOML or the command line) into the field.
struct Field {
  std::string key;  // "training.steps"
  enum Kind { Str, Int, Float, Bool, List } kind;  // List: strings (a TOML array, or "a,b")
  void* ptr;
  std::vector<std::string> choices;  // allowed values for Str (empty: any) and for each List entry
  // A value a Str also takes without offering it (not in errors or suggestions), and what the error
  // says of it after the choices: torchtitan's configs write it, and titan cannot always honour it.
  std::string unlisted = "", unlisted_note = "";
  // Who set it in the current pass (the file, then the command line): the spelling used, the value
  // and where. Two spellings of one key (torchtitan's older name and the new one) with different
  // values in one pass are an error, never a silent pick.
  std::string set_as = "", set_value = "", set_where = "";
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A Field whose kind follows the member's type, so the two cannot disagree.
Field field(std::string key, std::string* member, std::vector<std::string> choices = {}) {
  return {std::move(key), Field::Str, member, std::move(choices)};
}
Field field(std::string key, int64_t* member) { return {std::move(key), Field::Int, member, {}}; }
Field field(std::string key, double* member) { return {std::move(key), Field::Float, member, {}}; }
Field field(std::string key, bool* member) { return {std::move(key), Field::Bool, member, {}}; }
Field field(std::string key, std::vector<std::string>* member, std::vector<std::string> choices) {
  return {std::move(key), Field::List, member, std::move(choices)};
}
// `f`, also taking `value` (see Field::unlisted).
Field also_taking(Field f, std::string value, std::string note) {
  f.unlisted = std::move(value);
  f.unlisted_note = std::move(note);
  return f;
}

std::vector<Field> schema(JobConfig& c) {
  // "section.name" and c.section.name from one spelling; for a string, the values it may take.
#define TITAN_KEY(section, name, ...) field(#section "." #name, &c.section.name __VA_OPT__(, {__VA_ARGS__}))
  return {
      TITAN_KEY(job, dump_folder),
      TITAN_KEY(job, description),
      TITAN_KEY(job, device, "cpu", "cuda"),
      TITAN_KEY(model, name, "qwen3", "hf"),
      TITAN_KEY(model, flavor),
      TITAN_KEY(model, hf_assets_path),
      TITAN_KEY(model, init, "huggingface", "torchtitan"),
      TITAN_KEY(model, attn_mask_type, "causal", "block_causal"),
      TITAN_KEY(training, dataset),
      TITAN_KEY(training, dataset_path),
      TITAN_KEY(training, text_field),
      TITAN_KEY(training, chat_field),
      TITAN_KEY(training, pack_conversations),
      TITAN_KEY(training, pack_strategy, "next_fit", "best_fit"),
      TITAN_KEY(training, pack_window),
      TITAN_KEY(training, text_split, "paragraph", "line", "file"),
      TITAN_KEY(training, document_separator),
      TITAN_KEY(training, local_batch_size),
      TITAN_KEY(training, global_batch_size),
      TITAN_KEY(training, seq_len),
      TITAN_KEY(training, steps),
      TITAN_KEY(training, max_norm),
      TITAN_KEY(training, mixed_precision_param, "bfloat16", "float32"),
      TITAN_KEY(training, mixed_precision_reduce, "float32", "bfloat16"),
      TITAN_KEY(training, activation_grad_dtype, "float32", "bfloat16"),
      TITAN_KEY(training, seed),
      TITAN_KEY(training, deterministic),
      TITAN_KEY(training, load_balance, "aux_loss", "expert_bias"),
      TITAN_KEY(training, load_balance_coeff),
      TITAN_KEY(optimizer, name, "AdamW", "Adam"),
      TITAN_KEY(optimizer, lr),
      TITAN_KEY(optimizer, beta1),
      TITAN_KEY(optimizer, beta2),
      TITAN_KEY(optimizer, eps),
      TITAN_KEY(optimizer, weight_decay),
      TITAN_KEY(lr_scheduler, warmup_steps),
      TITAN_KEY(lr_scheduler, decay_ratio),
      TITAN_KEY(lr_scheduler, decay_type, "linear", "cosine", "sqrt"),
      TITAN_KEY(lr_scheduler, min_lr_factor),
      TITAN_KEY(lr_scheduler, total_steps),
      TITAN_KEY(checkpoint, enable),
      TITAN_KEY(checkpoint, folder),
      TITAN_KEY(checkpoint, interval),
      TITAN_KEY(checkpoint, interval_type, "steps", "seconds"),
      TITAN_KEY(checkpoint, enable_first_step_checkpoint),
      TITAN_KEY(checkpoint, keep_latest_k),
      TITAN_KEY(checkpoint, load_step),
      TITAN_KEY(checkpoint, initial_load_path),
      TITAN_KEY(checkpoint, initial_load_model_only),
      TITAN_KEY(checkpoint, initial_load_in_hf),
      TITAN_KEY(checkpoint, last_save_in_hf),
      also_taking(TITAN_KEY(checkpoint, export_dtype, "float32", "bfloat16"), "float16",
                  "float16, one of torchtitan's, is accepted only with last_save_in_hf = false, where there "
                  "is no export to write"),
      TITAN_KEY(checkpoint, restart_data_stream),
      TITAN_KEY(checkpoint, create_seed_checkpoint),
      TITAN_KEY(checkpoint, load_only),
      TITAN_KEY(checkpoint, async_mode, "disabled", "async", "async_with_pinned_mem"),
      TITAN_KEY(checkpoint, exclude_from_loading, "model", "optimizer", "lr_scheduler", "dataloader",
                "train_state"),
      TITAN_KEY(activation_checkpoint, mode, "none", "selective", "full"),
      TITAN_KEY(activation_checkpoint, selective_ac_option),
      TITAN_KEY(metrics, log_freq),
      TITAN_KEY(metrics, enable_tensorboard),
      TITAN_KEY(metrics, save_tb_folder),
      TITAN_KEY(metrics, save_for_all_ranks),
      TITAN_KEY(metrics, peak_tflops),
      TITAN_KEY(validation, enable),
      TITAN_KEY(validation, dataset),
      TITAN_KEY(validation, dataset_path),
      TITAN_KEY(validation, freq),
      TITAN_KEY(validation, steps),
      TITAN_KEY(validation, local_batch_size),
      TITAN_KEY(validation, seq_len),
      TITAN_KEY(parallelism, data_parallel_replicate_degree),
      TITAN_KEY(parallelism, data_parallel_shard_degree),
      TITAN_KEY(parallelism, tensor_parallel_degree),
      TITAN_KEY(parallelism, expert_parallel_degree),
      TITAN_KEY(parallelism, fsdp_reshard_after_forward, "default", "always", "never"),
      TITAN_KEY(comm, timeout_seconds),
      TITAN_KEY(comm, init_timeout_seconds),
      TITAN_KEY(comm, train_timeout_seconds),
      TITAN_KEY(profiling, enable_profiling),
      TITAN_KEY(profiling, save_traces_folder),
      TITAN_KEY(profiling, profile_freq),
      TITAN_KEY(profiling, profiler_active),
  };
#undef TITAN_KEY
}

// `name`: the key as errors name it (the spelling the user wrote, see apply).
void set_field(const Field& f, const std::string& value, const std::string& where, const std::string& name) {
  auto fail = [&](const char* expected) {
    TITAN_FAIL(where, ": ", name, " expects ", expected, ", got '", value, "'");
  };
  switch (f.kind) {
    case Field::Str:
      if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), value) == f.choices.end() &&
          (f.unlisted.empty() || value != f.unlisted)) {
        TITAN_FAIL(where, ": ", name, " must be one of ", join(f.choices),
                   f.unlisted.empty() ? "" : " (" + f.unlisted_note + ")", "; got '", value, "'",
                   suggestion(value, f.choices));
      }
      *static_cast<std::string*>(f.ptr) = value;
      break;
    case Field::Int: {
      const auto v = parse_int(value);
      if (!v) fail("an integer");
      *static_cast<int64_t*>(f.ptr) = *v;
      break;
    }
    case Field::Float: {
      const auto v = parse_number(value);
      if (!v) fail("a number");
      *static_cast<double*>(f.ptr) = *v;
      break;
    }
    case Field::Bool: {
      const auto v = parse_bool(value);
      if (!v) fail("true or false");
      *static_cast<bool*>(f.ptr) = *v;
      break;
    }
    case Field::List: {
      // "[a,b]" (a TOML array, as node_to_string writes it) or torchtitan's command-line "a,b";
      // each entry once, in the order given.
      std::string_view text = value;
      if (text.size() >= 2 && text.front() == '[' && text.back() == ']')
        text = text.substr(1, text.size() - 2);
      auto& list = *static_cast<std::vector<std::string>*>(f.ptr);
      list.clear();
      for (std::string_view rest = text; !rest.empty();) {
        const size_t comma = rest.find(',');
        std::string item(trim(rest.substr(0, comma)));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front())
          item = item.substr(1, item.size() - 2);
        TITAN_CHECK(!item.empty(), where, ": ", name, " = '", value, "' has an empty entry");
        TITAN_CHECK(std::find(f.choices.begin(), f.choices.end(), item) != f.choices.end(), where, ": ", name,
                    " = '", value, "': '", item, "' is not one of ", join(f.choices),
                    suggestion(item, f.choices));
        if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
      }
      break;
    }
  }
}

std::string node_to_string(const toml::node& n, const std::string& key, const std::string& where) {
  if (n.is_string()) return *n.value<std::string>();
  if (n.is_integer()) return std::to_string(*n.value<int64_t>());
  if (n.is_floating_point()) return format_double(*n.value<double>());
  if (n.is_boolean()) return *n.value<bool>() ? "true" : "false";
  if (auto arr = n.as_array()) {
    std::string s = "[";
    for (size_t i = 0; i < arr->size(); ++i) s += (i ? "," : "") + node_to_string(*arr->get(i), key, where);
    return s + "]";
  }
  TITAN_FAIL(where, ": ", key, " has an unsupported TOML value type");
}

const char* toml_type_name(const toml::node& n) {
  if (n.is_string()) return "a string";
  if (n.is_integer()) return "an integer";
  if (n.is_floating_point()) return "a float";
  if (n.is_boolean()) return "a boolean";
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date/time";
}

// "where: key" for a value from the file, with its line (the command line has no lines).
std::string located(const std::string& where, const toml::node* n) {
  return n && n->source().begin.line ? where + ":" + std::to_string(n->source().begin.line) : where;
}

// The TOML type must match the key's type: `steps = "10"` or `deterministic = 1` is a mistake
// worth reporting, not silently converting. Integers are accepted where a float is expected.
void check_toml_type(const Field& f, const toml::node& n, const std::string& where, const std::string& name) {
  bool ok = false;
  const char* expected = "";
  switch (f.kind) {
    case Field::Str: ok = n.is_string(), expected = "a string"; break;
    case Field::Int: ok = n.is_integer(), expected = "an integer"; break;
    case Field::Float: ok = n.is_number(), expected = "a number"; break;
    case Field::Bool: ok = n.is_boolean(), expected = "true or false"; break;
    case Field::List:
      ok = n.is_string() || (n.is_array() && n.as_array()->is_homogeneous(toml::node_type::string)) ||
           (n.is_array() && n.as_array()->empty());
      expected = "an array of strings";
      break;
  }
  TITAN_CHECK(ok, where, ": ", name, " expects ", expected, ", got ", toml_type_name(n));
}

// An ignored torchtitan key still takes only the values torchtitan would: a mistyped value is a
// mistake in the file, whatever the key does. `node` is the TOML value (null: command-line text).
void check_torchtitan_type(const TorchtitanKey& k, const std::string& key, const std::string& value,
                           const std::string& where, const toml::node* node) {
  using T = TorchtitanType;
  bool ok = true;
  std::string expected;
  switch (k.type) {
    case T::Bool:
      ok = node ? node->is_boolean() : parse_bool(value).has_value(), expected = "true or false";
      break;
    case T::Int:
      ok = node ? node->is_integer() : parse_int(value).has_value(), expected = "an integer";
      break;
    case T::Number:
      ok = node ? node->is_number() : parse_number(value).has_value(), expected = "a number";
      break;
    case T::String:
      ok = !node || node->is_string(), expected = "a string";
      break;
    case T::Choice: {
      const auto choices = torchtitan_choices(k);
      ok = (!node || node->is_string()) && std::find(choices.begin(), choices.end(), value) != choices.end();
      expected = "one of " + join(choices);
      break;
    }
    case T::Strings:
      ok = !node || node->is_string() || (node->is_array() && node->as_array()->empty()) ||
           (node->is_array() && node->as_array()->is_homogeneous(toml::node_type::string));
      expected = "an array of strings";
      break;
    case T::Array:
      ok = !node || node->is_array(), expected = "an array";
      break;
  }
  if (ok) return;
  TITAN_FAIL(where, ": ", key, " expects ", expected,
             " (torchtitan's type for it; titan ignores its value), got ",
             node ? std::string(toml_type_name(*node)) +
                        (node->is_string() || k.type == T::Choice ? " '" + value + "'" : "")
                  : "'" + value + "'");
}

void add_note(JobConfig& c, const std::string& key, const std::string& note) {
  // A key set twice (file, then command line) keeps one line: the last value's.
  std::string line = key + " = " + note;
  for (auto& n : c.notes)
    if (n.compare(0, key.size() + 3, key + " = ") == 0) return void(n = line);
  c.notes.push_back(line);
}

// torchtitan's older spelling of a tokenizer: a file (tokenizer.json, tokenizer.model) stands for its folder.
std::string tokenizer_folder(const std::string& path) {
  for (const char* file : {"tokenizer.json", "tokenizer.model"}) {
    const std::string name(file);
    if (path.size() >= name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
        (path.size() == name.size() || path[path.size() - name.size() - 1] == '/')) {
      std::string dir = path.substr(0, path.size() - name.size());
      return dir.empty() ? "." : dir;
    }
  }
  return path;
}

void apply(JobConfig& c, std::vector<Field>& fields, const std::string& key, const std::string& value,
           const std::string& where, const toml::node* node, const std::string& written = "");

// A key of torchtitan's job config that is not one of titan's: an older spelling is applied as the
// key it stands for; a key that cannot change the result is noted; anything else is an error.
// `written` is the key as the user wrote it (an older spelling of a torchtitan-only key).
bool apply_torchtitan_key(JobConfig& c, std::vector<Field>& fields, const std::string& key,
                          const std::string& value, const std::string& where, const toml::node* node,
                          const std::string& written = "") {
  const TorchtitanKey* k = find_torchtitan_key(key);
  if (!k || k->use == TorchtitanUse::Native) return false;
  const std::string note_key = written.empty() ? key : written;
  // A string from the file is shown quoted: `compile.backend = "5"` is not `= 5`.
  const std::string shown = (value.empty() || (node && node->is_string()) ? "\"" + value + "\"" : value) +
                            (written.empty() ? "" : " (as " + key + ")");
  switch (k->use) {
    case TorchtitanUse::Alias: {
      const std::string target(k->target);
      std::string v = key == "model.tokenizer_path" ? tokenizer_folder(value) : value;
      const bool inverted = key == "metrics.rank_0_only";  // the opposite of save_for_all_ranks
      if (inverted) {
        TITAN_CHECK((node ? node->is_boolean() : true) && (value == "true" || value == "false"), where, ": ",
                    note_key, " expects true or false, got ",
                    node && node->is_string() ? "a string" : "'" + value + "'");
        v = value == "true" ? "false" : "true";
        node = nullptr;  // (the TOML value is the inverse of the one applied)
      }
      if (!apply_torchtitan_key(c, fields, target, v, where, node, note_key)) {
        apply(c, fields, target, v, where, node, note_key);
        add_note(c, note_key,
                 shown + " applied as " + target +
                     (inverted ? " = " + v + " (torchtitan's older, inverted name for it)"
                               : " (torchtitan's older name for it)"));
      }
      break;
    }
    case TorchtitanUse::Ignored:
      check_torchtitan_type(*k, note_key, value, where, node);
      add_note(c, note_key, shown + " ignored: " + std::string(k->why));
      break;
    case TorchtitanUse::OffOnly: {
      auto off = torchtitan_off_values(*k);
      // A switch (accepted only as true or only as false) takes a boolean, as titan's own keys do.
      if (off.size() == 1 && (off[0] == "true" || off[0] == "false"))
        TITAN_CHECK((node ? node->is_boolean() : true) && (value == "true" || value == "false"), where, ": ",
                    note_key, " expects true or false, got ",
                    node && node->is_string() ? "a string" : "'" + value + "'");
      // A degree (accepted only as 1) takes an integer: "1" and 1.0 are not torchtitan's type.
      if (off.size() == 1 && parse_int(off[0]))
        TITAN_CHECK(node ? node->is_integer() : parse_int(value).has_value(), where, ": ", note_key,
                    " expects an integer, got ", node ? toml_type_name(*node) : "'" + value + "'");
      // torchtitan lower-cases the norm's name (build_norm): "RMSNorm" is its rmsnorm.
      std::string compared = value;
      if (key == "model.norm_type")
        std::transform(compared.begin(), compared.end(), compared.begin(),
                       [](unsigned char ch) { return char(std::tolower(ch)); });
      if (std::find(off.begin(), off.end(), compared) == off.end()) {
        std::string list;
        for (auto& v : off) list += (list.empty() ? "" : ", ") + (v.empty() ? "\"\"" : v);
        TITAN_FAIL(where, ": ", note_key, " = ", shown, " cannot be honoured: ", k->why, " (accepted: ", list, ")");
      }
      add_note(c, note_key, shown + " accepted, no effect: " + std::string(k->why));
      break;
    }
    case TorchtitanUse::Native: break;
  }
  return true;
}

// Titan's keys and torchtitan's: what a key is checked against, and its near misses suggested from.
std::vector<std::string> known_keys() {
  std::vector<std::string> known = job_config_keys();
  for (const TorchtitanKey& k : torchtitan_keys()) known.emplace_back(k.key);
  return known;
}

[[noreturn]] void fail_unknown_key(const std::string& key, const std::string& where) {
  // The nearest of titan's keys and torchtitan's (a torchtitan key mistyped is meant as torchtitan's).
  TITAN_FAIL(where, ": unknown config key '", key, "'", suggestion(key, known_keys()));
}

// Sets `key` from a textual value; `node` is the TOML value when it comes from the file; `written`
// is the key as the user wrote it when that was an older spelling of `key`.
void apply(JobConfig& c, std::vector<Field>& fields, const std::string& key, const std::string& value,
           const std::string& where, const toml::node* node, const std::string& written) {
  for (auto& f : fields)
    if (f.key == key) {
      const std::string as = written.empty() ? key : written;
      // An older spelling is named as written, with the key it stands for.
      const std::string name = written.empty() ? key : written + " (torchtitan's older name for " + key + ")";
      if (node) check_toml_type(f, *node, where, name);
      TITAN_CHECK(f.set_as.empty() || f.set_as == as || f.set_value == value, where, ": ", as, " = ", value,
                  " and ", f.set_as, " = ", f.set_value, " (", f.set_where, ") both set ", key,
                  " (one is torchtitan's older name for the other): keep one");
      f.set_as = as, f.set_value = value, f.set_where = where;
      return set_field(f, value, where, name);
    }
  auto dot = key.find('.');
  std::string section = key.substr(0, dot), name = dot == std::string::npos ? "" : key.substr(dot + 1);
  if (section == "model") {
    auto keys = qwen3::override_keys();
    if (std::find(keys.begin(), keys.end(), name) != keys.end()) {
      // Model fields are numbers, booleans or lists; parse now so a bad value is reported with
      // the config, not after the data and tokenizer have been loaded.
      TITAN_CHECK(!node || !node->is_string(), where, ": ", key, " expects a number, boolean or list, got a string");
      // A TOML float stays a float (2.0, not "2"): an integer field refuses it, as training.steps does.
      std::string text = value;
      if (node && node->is_floating_point() && text.find_first_of(".eEn") == std::string::npos) text += ".0";
      qwen3::ModelArgs scratch;
      try {
        qwen3::apply_override(scratch, name, text);
      } catch (const std::exception& e) {
        TITAN_FAIL(where, ": invalid value for ", key, ": ", e.what());
      }
      c.model.overrides[name] = text;
      c.set_at[key] = where;
      return;
    }
  }
  if (apply_torchtitan_key(c, fields, key, value, where, node)) return;
  fail_unknown_key(key, where);
}

void parse_kernels(JobConfig& c, const toml::table& t, const std::string& where) {
  for (auto& [op_key, node] : t) {
    std::string op(op_key.str());
    auto add = [&](const toml::table& e) {
      kernels::Substitution s;
      s.op = op;
      s.modules = "*";  // no modules key: every module that runs the op
      for (auto& [k, v] : e) {
        std::string kk(k.str());
        if (kk == "impl") {
          TITAN_CHECK(v.is_string(), where, ": kernels.", op,
                      ".impl must be a string, the variant's name (as `titan kernels list` prints it)");
          s.variant = v.value_or(std::string());
          TITAN_CHECK(!s.variant.empty(), where, ": kernels.", op, ".impl is empty; give the variant's name");
        } else if (kk == "modules") {
          TITAN_CHECK(v.is_string() && !v.value_or(std::string()).empty(), where, ": kernels.", op,
                      ".modules must be a non-empty glob string (\"*\" for every module, or leave it out)");
          s.modules = v.value_or(std::string());
          const std::string bad = glob_problem(s.modules);
          TITAN_CHECK(bad.empty(), where, ": kernels.", op, ".modules = \"", s.modules, "\": ", bad);
        } else {
          TITAN_FAIL(where, ": kernels.", op, ": unknown key '", kk, "' (expected impl, modules)",
                     suggestion(kk, {"impl", "modules"}));
        }
      }
      TITAN_CHECK(!s.variant.empty(), where, ": kernels.", op, ": 'impl' (the variant name) is required");
      c.kernels.push_back(s);
    };
    if (auto tab = node.as_table()) add(*tab);
    else if (auto arr = node.as_array()) {
      TITAN_CHECK(!arr->empty(), where, ": kernels.", op,
                  " = []: an empty list substitutes nothing (remove the key)");
      for (auto& item : *arr) {
        TITAN_CHECK(item.is_table(), where, ": kernels.", op, ": array entries must be tables {impl, modules}");
        add(*item.as_table());
      }
    } else {
      TITAN_FAIL(where, ": kernels.", op, " must be a table like { impl = \"fused\", modules = \"layers.*\" }");
    }
  }
}

// Applies every key of `table` (named `prefix`); sub-tables such as torchtitan's
// [training.dataloader] or [quantize.linear.float8] give dotted keys.
void apply_table(JobConfig& c, std::vector<Field>& fields, const std::string& prefix, const toml::table& table,
                 const std::string& source) {
  for (auto& [k, v] : table) {
    std::string key = prefix + "." + std::string(k.str());
    std::string where = located(source, &v);
    if (auto sub = v.as_table()) apply_table(c, fields, key, *sub, source);
    else apply(c, fields, key, node_to_string(v, key, where), where, &v);
  }
}

}  // namespace

JobConfig parse_job_config(const std::string& text, const std::string& source,
                           const std::vector<std::pair<std::string, std::string>>& overrides) {
  JobConfig c;
  auto fields = schema(c);
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    TITAN_FAIL(source, ":", e.source().begin.line, ":", e.source().begin.column, ": invalid TOML: ", e.description());
  }
  std::vector<std::string> sections = {"job", "model", "training", "optimizer", "lr_scheduler", "checkpoint",
                                       "activation_checkpoint", "metrics", "validation", "parallelism", "comm", "profiling",
                                       "kernels"};
  for (auto& k : torchtitan_keys()) {  // torchtitan's other sections: [compile], [float8], [validation], ...
    std::string sec(k.key.substr(0, k.key.find('.')));
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) sections.push_back(sec);
  }
  for (auto& [sec_key, sec_node] : doc) {
    std::string sec(sec_key.str());
    const bool known_section = std::find(sections.begin(), sections.end(), sec) != sections.end();
    if (!known_section && !sec_node.is_table()) {
      // A key written above every section header, e.g. `steps = 10` before [training].
      // The first section holding such a key (`steps`: training's, not validation's).
      std::string home;
      for (auto& f : fields)
        if (home.empty() && f.key.size() > sec.size() &&
            f.key.compare(f.key.size() - sec.size() - 1, std::string::npos, "." + sec) == 0)
          home = f.key;
      TITAN_FAIL(located(source, &sec_node), ": key '", sec, "' is outside any section",
                 home.empty() ? "" : "; did you mean '" + home + "' (under [" + home.substr(0, home.find('.')) + "])?");
    }
    TITAN_CHECK(known_section, located(source, &sec_node), ": unknown section [", sec, "]", suggestion(sec, sections));
    auto* table = sec_node.as_table();
    TITAN_CHECK(table, source, ": '", sec, "' must be a section ([", sec, "])");
    if (sec == "kernels") {
      parse_kernels(c, *table, source);
      continue;
    }
    apply_table(c, fields, sec, *table, source);
  }
  for (Field& f : fields) f.set_as.clear();  // the command line overrides the file
  for (auto& [k, v] : overrides) {
    TITAN_CHECK(k.rfind("kernels.", 0) != 0, "command line: kernel substitutions are set in the config's [kernels] table");
    apply(c, fields, k, v, "command line", nullptr);
  }
  for (const Field& f : fields)
    if (!f.set_where.empty()) c.set_at[f.key] = f.set_where;
  // Where a key got its value ("file:line:col" or "command line"): the rules between keys below
  // name the place to change.
  auto set_where = [&](const std::string& key) {
    auto it = c.set_at.find(key);
    return it == c.set_at.end() ? source : it->second;
  };
  // Where a value the rule quotes came from: its place, or the default where nothing set it.
  auto value_from = [&](const std::string& key) {
    auto it = c.set_at.find(key);
    return it == c.set_at.end() ? std::string("the default") : it->second;
  };
  // torchtitan's selective_ac_option: a layer frequency, or "op" (its per-op policy).
  selective_ac_every(c.activation_checkpoint.selective_ac_option,
                     set_where("activation_checkpoint.selective_ac_option"));
  if (c.activation_checkpoint.mode == "selective" && c.activation_checkpoint.selective_ac_option == "op")
    add_note(
        c, "activation_checkpoint.selective_ac_option",
        "op applied as \"2\": titan recomputes whole layers, every second one (torchtitan's per-op policy "
        "recomputes the cheap ops of every layer); the step's result is the same");
  if (c.training.pack_conversations) {
    TITAN_CHECK(
        !c.training.chat_field.empty(), set_where("training.pack_conversations"),
        ": training.pack_conversations = true packs conversations, but training.chat_field is not set "
        "(text documents are always packed): set training.chat_field, or remove the key");
    TITAN_CHECK(c.model.attn_mask_type == "block_causal", set_where("training.pack_conversations"),
                ": training.pack_conversations = true puts several conversations in a row, and with "
                "model.attn_mask_type = \"",
                c.model.attn_mask_type, "\" (", value_from("model.attn_mask_type"),
                ") each would attend to the ones before it: set model.attn_mask_type = \"block_causal\"");
  }
  if (c.training.pack_strategy == "best_fit") {
    TITAN_CHECK(
        c.training.pack_conversations, set_where("training.pack_strategy"),
        ": training.pack_strategy = \"best_fit\" packs conversations, but training.pack_conversations "
        "is false: set it to true, or remove the key");
    TITAN_CHECK(c.training.pack_window >= 2, set_where("training.pack_window"),
                ": training.pack_window = ", c.training.pack_window,
                ": best-fit packing needs a window of at least 2 conversations (it packs each window's "
                "conversations together)");
  }
  // torchtitan's exclude_from_loading leaves parts of a resumed checkpoint fresh; two of its parts
  // would make the resume another run under this one's name.
  const std::string excluded_at = set_where("checkpoint.exclude_from_loading");
  TITAN_CHECK(!c.checkpoint.excludes("model"), excluded_at,
              ": checkpoint.exclude_from_loading names \"model\": a resume that leaves the weights fresh "
              "trains a new model under the checkpoint's step count, moments and data position; start a new "
              "run instead (another job.dump_folder or checkpoint.folder)");
  TITAN_CHECK(
      !c.checkpoint.excludes("train_state"), excluded_at,
      ": checkpoint.exclude_from_loading names \"train_state\": the step count numbers the run's "
      "checkpoints, and starting it over would save step folders below the resumed one, which the next "
      "start would resume again. To train on from a checkpoint's weights from step 0, start a new run "
      "(another job.dump_folder) with checkpoint.initial_load_path = '<checkpoint folder>/step-N'");
  TITAN_CHECK(
      !c.checkpoint.create_seed_checkpoint || c.checkpoint.enable,
      set_where("checkpoint.create_seed_checkpoint"),
      ": checkpoint.create_seed_checkpoint = true writes a checkpoint, and checkpoint.enable = false (",
      set_where("checkpoint.enable"), "): set checkpoint.enable = true");
  if (!c.checkpoint.initial_load_model_only) {
    TITAN_CHECK(!c.checkpoint.initial_load_in_hf, set_where("checkpoint.initial_load_model_only"),
                ": checkpoint.initial_load_model_only = false loads a whole training state, and "
                "checkpoint.initial_load_in_hf = true (",
                set_where("checkpoint.initial_load_in_hf"),
                ") names a Hugging Face folder, which holds weights only: remove one of the two");
    TITAN_CHECK(!c.checkpoint.create_seed_checkpoint, set_where("checkpoint.create_seed_checkpoint"),
                ": checkpoint.create_seed_checkpoint = true writes starting weights as step 0, and "
                "checkpoint.initial_load_model_only = false (",
                set_where("checkpoint.initial_load_model_only"),
                ") continues a whole training state at its step: remove one of the two");
  }
  TITAN_CHECK(
      !c.checkpoint.create_seed_checkpoint || !c.checkpoint.load_only, set_where("checkpoint.load_only"),
      ": checkpoint.load_only = true saves no checkpoint, and checkpoint.create_seed_checkpoint = true (",
      set_where("checkpoint.create_seed_checkpoint"), ") asks for one: keep one of the two");
  // What a run restores a training state from: its own checkpoints (checkpoint.enable), or the run it
  // forks (initial_load_path with initial_load_model_only = false), which it goes on from with
  // checkpointing off too.
  const bool restores_a_state = c.checkpoint.enable || (!c.checkpoint.initial_load_path.empty() &&
                                                        !c.checkpoint.initial_load_model_only);
  if (c.checkpoint.excludes("dataloader") && restores_a_state) {
    c.checkpoint.restart_data_stream = true;
    add_note(c, "checkpoint.exclude_from_loading",
             "\"dataloader\" applied as checkpoint.restart_data_stream = true (a resume starts the data from "
             "its beginning)");
  }
  if (c.model.attn_mask_type == "block_causal") {
    TITAN_CHECK(c.training.chat_field.empty() || c.training.pack_conversations,
                set_where("model.attn_mask_type"),
                ": model.attn_mask_type = \"block_causal\" cuts rows at their documents, but "
                "training.chat_field = \"",
                c.training.chat_field,
                "\" puts one conversation in each row (no other document to mask): set "
                "training.pack_conversations = true to pack several per row, or remove one of the two");
    // Each document is its own attention kernel call (ops/attention/attention.h). cuDNN builds
    // and finalizes an execution plan per sequence length (tens of milliseconds each, kept for the
    // process): one per document length would be built all through the run.
    if (c.job.device == "cuda")
      for (const kernels::Substitution& rule : c.kernels)
        TITAN_CHECK(
            rule.op != "attention" || rule.variant != "cudnn", set_where("kernels.attention"),
            ": kernels.attention = { impl = \"cudnn\" } with model.attn_mask_type = \"block_causal\" (",
            value_from("model.attn_mask_type"),
            ") on job.device = \"cuda\": block-causal attention calls the kernel once per document, "
            "and cuDNN would build an execution plan for every document length; use the default "
            "attention kernels (remove the rule) or mma_sync");
  }
  // A roll-back written into the file repeats at every start of the job (a restart after a crash
  // would throw away what was trained since): say so.
  if (c.checkpoint.load_step != -1 && set_where("checkpoint.load_step") != "command line")
    add_note(
        c, "checkpoint.load_step",
        std::to_string(c.checkpoint.load_step) + " in " + set_where("checkpoint.load_step") +
            ": every start of this job rolls back to it again (give it on the command line of the one run "
            "that rolls back)");
  // Keys this job's other settings leave without effect (a seed beside loaded weights, an interval
  // beside a disabled checkpoint): a start-up note says so, never silence. Not an error: a base config
  // file shared by jobs, a torchtitan job file and scripts that pass a fixed set of overrides
  // (titan check's own runs among them) carry such keys.
  auto moot = [&](const std::string& key, const std::string& why) {
    if (!c.set_at.count(key)) return;
    std::string value;
    for (const Field& f : fields)
      if (f.key == key) value = f.set_value;
    if (auto m = c.model.overrides.find(key.substr(6));
        key.rfind("model.", 0) == 0 && m != c.model.overrides.end())
      value = m->second;
    add_note(c, key, value + ": no effect, " + why);
  };
  if (c.checkpoint.initial_load_path.empty() && !c.checkpoint.initial_load_model_only)
    moot("checkpoint.initial_load_model_only", "checkpoint.initial_load_path is not set");
  const std::string loaded =
      std::string("the job starts from loaded weights (checkpoint.") +
      (c.checkpoint.initial_load_path.empty() ? "initial_load_in_hf" : "initial_load_path") + ")";
  if (!c.checkpoint.initial_load_path.empty() || c.checkpoint.initial_load_in_hf) {
    moot("training.seed", loaded + " and the seed only draws a random initialisation");
    moot("model.init", loaded + " and model.init only picks the random initialisation");
  }
  // A dataset_path is read whatever dataset names (torchtitan's `dataset` picks a loader titan has one of).
  if (!c.training.dataset_path.empty()) moot("training.dataset", "training.dataset_path is read");
  if (!c.validation.dataset_path.empty() && c.validation.enable)
    moot("validation.dataset", "validation.dataset_path is read");
  if (c.model.name == "hf")
    moot("model.flavor",
         "model.name = \"hf\" takes the architecture from model.hf_assets_path's config.json");
  if (c.training.load_balance != "expert_bias")
    moot("training.load_balance_coeff", "it is the expert-bias update step, and training.load_balance = \"" +
                                            c.training.load_balance +
                                            "\" balances experts with the aux loss");
  else
    moot("model.router_aux_loss_coef",
         "it weighs the aux loss, which training.load_balance = \"expert_bias\" does not add");
  if (!c.training.chat_field.empty()) {
    const std::string chats = "training.chat_field = \"" + c.training.chat_field +
                              "\": the records are conversations, not text documents";
    moot("training.text_field", chats);
    moot("training.text_split", chats);
    moot("training.document_separator", chats);
  }
  if (c.training.pack_strategy != "best_fit")
    moot("training.pack_window",
         "it is the best-fit window, and training.pack_strategy = \"" + c.training.pack_strategy + "\"");
  if (!c.training.pack_conversations)
    moot("training.pack_strategy", "training.pack_conversations = false (nothing is packed)");
  if (c.checkpoint.load_only) {
    moot("checkpoint.interval", "checkpoint.load_only = true (no saves)");
    moot("checkpoint.interval_type", "checkpoint.load_only = true (no saves)");
    moot("checkpoint.enable_first_step_checkpoint", "checkpoint.load_only = true (no saves)");
    moot("checkpoint.keep_latest_k", "checkpoint.load_only = true (no saves, so none pruned)");
    moot("checkpoint.async_mode", "checkpoint.load_only = true (no saves)");
  }
  if (c.checkpoint.async_mode == "async_with_pinned_mem" && c.checkpoint.enable && !c.checkpoint.load_only)
    add_note(c, "checkpoint.async_mode",
             "async_with_pinned_mem applied as \"async\": the state is copied aside, then written by a "
             "background thread; a GPU job's copy crosses through titan's pinned staging buffers either way");
  if (!c.checkpoint.enable) {
    moot("checkpoint.interval", "checkpoint.enable = false (no periodic saves)");
    moot("checkpoint.interval_type", "checkpoint.enable = false (no periodic saves)");
    if (c.checkpoint.enable_first_step_checkpoint)
      moot("checkpoint.enable_first_step_checkpoint", "checkpoint.enable = false");
    if (c.checkpoint.restart_data_stream && !restores_a_state)
      moot("checkpoint.restart_data_stream", "checkpoint.enable = false (nothing is resumed)");
    if (c.checkpoint.async())
      moot("checkpoint.async_mode",
           "checkpoint.enable = false (the one save, at a stop by signal, is complete before the run ends)");
    if (!c.checkpoint.exclude_from_loading.empty() && !restores_a_state)
      moot("checkpoint.exclude_from_loading", "checkpoint.enable = false (nothing is resumed)");
    // torchtitan loads nothing with checkpointing off (its load() returns first); titan starts from
    // the weights the job names.
    if (!c.checkpoint.initial_load_path.empty())
      add_note(c, "checkpoint.initial_load_path",
               "\"" + c.checkpoint.initial_load_path +
                   "\" is loaded although checkpoint.enable = false (torchtitan would load nothing "
                   "and start from random weights)");
    else if (c.checkpoint.initial_load_in_hf)
      add_note(c, "checkpoint.initial_load_in_hf",
               "true: model.hf_assets_path's weights are loaded although checkpoint.enable = false "
               "(torchtitan would load nothing and start from random weights)");
    // torchtitan saves nothing with checkpointing off; titan still writes the export asked for.
    if (c.checkpoint.last_save_in_hf)
      add_note(c, "checkpoint.last_save_in_hf",
               "true: the Hugging Face export is written at the end although checkpoint.enable = false "
               "(torchtitan would save nothing; set it to false for no export)");
  }
  // A section switched off reads none of its other keys.
  if (!c.validation.enable)
    for (const char* key : {"validation.dataset", "validation.dataset_path", "validation.freq",
                            "validation.steps", "validation.local_batch_size", "validation.seq_len"})
      moot(key, "validation.enable = false");
  if (!c.metrics.enable_tensorboard) moot("metrics.save_tb_folder", "metrics.enable_tensorboard = false");
  if (!c.profiling.enable_profiling)
    for (const char* key :
         {"profiling.save_traces_folder", "profiling.profile_freq", "profiling.profiler_active"})
      moot(key, "profiling.enable_profiling = false");
  else if (c.profiling.profile_freq > c.training.steps && c.training.steps > 0)
    add_note(c, "profiling.profile_freq",
             std::to_string(c.profiling.profile_freq) +
                 ": no step is profiled, the first profiled step comes after "
                 "training.steps = " +
                 std::to_string(c.training.steps));
  if (c.activation_checkpoint.mode != "selective")
    moot("activation_checkpoint.selective_ac_option", "activation_checkpoint.mode = \"" +
                                                          c.activation_checkpoint.mode +
                                                          "\" (it picks the layers of \"selective\")");
  // torchtitan's configs say export_dtype = "float16"; titan exports float32 or bfloat16. The key
  // shapes the Hugging Face export only (torchtitan's model-only last save, which it also shapes,
  // titan does not write: checkpoint.last_save_model_only has its note).
  if (c.checkpoint.export_dtype != "float32") {
    TITAN_CHECK(c.checkpoint.export_dtype != "float16" || !c.checkpoint.last_save_in_hf,
                set_where("checkpoint.export_dtype"),
                ": checkpoint.export_dtype = float16 cannot be honoured: "
                "titan's Hugging Face export (checkpoint.last_save_in_hf) writes float32 or bfloat16");
    if (!c.checkpoint.last_save_in_hf)
      moot("checkpoint.export_dtype",
           "there is no export at the end (checkpoint.last_save_in_hf = false); "
           "the checkpoints keep float32 weights");
  }
  // titan's default warmup (2 steps) over a schedule of 1 step, the smoke test `--training.steps=1`:
  // the warmup is shortened to the schedule, said. A warmup the job sets is its own, and validate()
  // asks for a fit rather than shorten it.
  const int64_t schedule_steps =
      c.lr_scheduler.total_steps == -1 ? c.training.steps : c.lr_scheduler.total_steps;
  const int64_t default_warmup = c.lr_scheduler.warmup_steps;
  const bool warmup_shortened = !c.set_at.count("lr_scheduler.warmup_steps") && c.training.steps > 0 &&
                                schedule_steps == 1 && c.lr_scheduler.warmup_steps > 1;
  if (warmup_shortened) {
    c.lr_scheduler.warmup_steps = schedule_steps;
    add_note(c, "lr_scheduler.warmup_steps",
             std::to_string(schedule_steps) + ": titan's default of " + std::to_string(default_warmup) +
                 " steps is shortened to the " + std::to_string(schedule_steps) + " the schedule spans (" +
                 (c.lr_scheduler.total_steps == -1 ? "training.steps" : "lr_scheduler.total_steps") +
                 "); set lr_scheduler.warmup_steps to choose");
  }
  // A key the file leaves out takes titan's default; where torchtitan's differs and shapes the run,
  // left_out_note() names it at start-up.
  auto left_out = [&](const char* key, std::string ours, const char* theirs, bool applies,
                      bool initial_weights_only = false) {
    if (applies && !c.set_at.count(key))
      c.left_out_defaults.push_back({key, std::move(ours), theirs, initial_weights_only});
  };
  left_out("training.steps", std::to_string(c.training.steps), "10000", true);
  left_out("training.local_batch_size", std::to_string(c.training.local_batch_size), "8", true);
  left_out("training.seq_len", std::to_string(c.training.seq_len), "2048", true);
  left_out("lr_scheduler.warmup_steps",
           std::to_string(default_warmup) + (warmup_shortened ? ", shortened to 1 (above)" : ""), "200",
           true);
  left_out("training.seed", std::to_string(c.training.seed), "none: a random seed",
           c.checkpoint.initial_load_path.empty() && !c.checkpoint.initial_load_in_hf, true);
  left_out("checkpoint.keep_latest_k", std::to_string(c.checkpoint.keep_latest_k), "10",
           c.checkpoint.enable && !c.checkpoint.load_only);
  return c;
}

int64_t selective_ac_every(const std::string& option, const std::string& where) {
  if (option == "op") return 2;
  TITAN_CHECK(
      !option.empty() && option.size() <= 9 && option.find_first_not_of("0123456789") == std::string::npos,
      where, where.empty() ? "" : ": ", "activation_checkpoint.selective_ac_option = \"", option,
      "\": expected a layer frequency, a whole number as a string (\"2\" recomputes one layer in 2, \"1\" "
      "or \"0\" every layer), or \"op\"");
  return std::max<int64_t>(std::atol(option.c_str()), 1);  // "0": every layer, as torchtitan
}

JobConfig load_job_config(const std::string& path, const std::vector<std::pair<std::string, std::string>>& overrides) {
  // A directory would read as an empty config (a run of the defaults), a FIFO would wait forever.
  return parse_job_config(io::read_regular_file(path, "job config"), path, overrides);
}

int64_t ParallelismSection::shard_degree(int world_size) const {
  return data_parallel_shard_degree == -1 ? world_size / data_parallel_replicate_degree : data_parallel_shard_degree;
}

std::string JobConfig::where_set(const std::string& key) const {
  auto it = set_at.find(key);
  if (it == set_at.end()) return "";
  if (it->second == "command line") return "set on the command line";
  return (it->second.rfind("--", 0) == 0 ? "set by " : "set at ") + it->second;
}

void JobConfig::validate(int world_size) const {
  try {
    validate_values(world_size);
  } catch (const Error& e) {
    // Each key the message names that was given a value: where, so the user knows which line to edit.
    const std::string message = e.what();
    std::vector<std::tuple<size_t, std::string, std::string>> named;  // (position in the message, key, where)
    // A key nobody set is named too (where ""): its value is the default, which the user may not know of.
    std::map<std::string, std::string> keys = set_at;
    for (const std::string& key : job_config_keys()) keys.emplace(key, "");
    for (const auto& [key, where] : keys) {
      for (size_t at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
        const size_t end = at + key.size();
        const bool whole =
            (at == 0 || !(std::isalnum(uint8_t(message[at - 1])) || message[at - 1] == '_')) &&
            (end == message.size() || !(std::isalnum(uint8_t(message[end])) || message[end] == '_'));
        if (whole) {
          named.emplace_back(at, key, where);
          break;
        }
      }
    }
    // In the message's order: "model.init set at job.toml:4; training.steps, optimizer.lr set on the
    // command line".
    std::sort(named.begin(), named.end());
    std::string places, on_command_line, defaults;
    for (const auto& [at, key, where] : named) {
      if (where.empty())
        defaults += (defaults.empty() ? "" : ", ") + key;
      else if (where == "command line")
        on_command_line += (on_command_line.empty() ? "" : ", ") + key;
      else
        places += (places.empty() ? "" : "; ") + key + " " + where_set(key);
    }
    if (!on_command_line.empty())
      places += (places.empty() ? "" : "; ") + on_command_line + " set on the command line";
    // Only beside a key that was set: an error about defaults alone names no place to edit.
    if (places.empty()) throw;
    if (!defaults.empty()) places += "; " + defaults + " left at the default";
    throw Error(message + " (" + places + ")");
  }
}

void JobConfig::validate_values(int world_size) const {
  auto positive = [](int64_t v, const char* key) { TITAN_CHECK(v > 0, key, " must be positive, got ", v); };
  // A dataset by name is one of the bundled ones (with no dataset_path): said here, with the line.
  if (training.dataset_path.empty())
    if (const std::string e = data::builtin_dataset_error(training.dataset); !e.empty())
      TITAN_FAIL("training.dataset: ", e);
  if (validation.enable && validation.dataset_path.empty())
    if (const std::string e = data::builtin_dataset_error(validation.dataset, "validation"); !e.empty())
      TITAN_FAIL("validation.dataset: ", e);
  positive(training.local_batch_size, "training.local_batch_size");
  positive(training.seq_len, "training.seq_len");
  TITAN_CHECK(training.steps >= 0, "training.steps must be >= 0, got ", training.steps);
  TITAN_CHECK(std::isfinite(training.max_norm) && training.max_norm > 0,
              "training.max_norm must be finite and positive (a large value such as 1e9 clips nothing), got ",
              training.max_norm);
  TITAN_CHECK(std::isfinite(optimizer.lr) && optimizer.lr > 0,
              "optimizer.lr must be finite and positive, got ", optimizer.lr);
  TITAN_CHECK(optimizer.beta1 >= 0 && optimizer.beta1 < 1, "optimizer.beta1 must be in [0, 1), got ", optimizer.beta1);
  TITAN_CHECK(optimizer.beta2 >= 0 && optimizer.beta2 < 1, "optimizer.beta2 must be in [0, 1), got ", optimizer.beta2);
  TITAN_CHECK(std::isfinite(optimizer.eps) && optimizer.eps > 0,
              "optimizer.eps must be finite and positive, got ", optimizer.eps);
  TITAN_CHECK(std::isfinite(optimizer.weight_decay) && optimizer.weight_decay >= 0,
              "optimizer.weight_decay must be finite and >= 0, got ", optimizer.weight_decay);
  TITAN_CHECK(lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps must be >= 0, got ", lr_scheduler.warmup_steps);
  TITAN_CHECK(lr_scheduler.decay_ratio == -1 || (lr_scheduler.decay_ratio >= 0 && lr_scheduler.decay_ratio <= 1),
              "lr_scheduler.decay_ratio must be in [0, 1] (or -1), got ", lr_scheduler.decay_ratio);
  TITAN_CHECK(lr_scheduler.min_lr_factor >= 0 && lr_scheduler.min_lr_factor <= 1,
              "lr_scheduler.min_lr_factor must be in [0, 1], got ", lr_scheduler.min_lr_factor);
  TITAN_CHECK(lr_scheduler.total_steps == -1 || lr_scheduler.total_steps >= training.steps,
              "lr_scheduler.total_steps (", lr_scheduler.total_steps, ") must be -1 or at least training.steps (",
              training.steps, "): the schedule is not extrapolated past its end");
  // A run that trains (steps > 0) warms up within its schedule; the message names the values given.
  const int64_t schedule_steps = lr_scheduler.total_steps == -1 ? training.steps : lr_scheduler.total_steps;
  TITAN_CHECK(
      training.steps == 0 || lr_scheduler.warmup_steps <= schedule_steps, "lr_scheduler.warmup_steps (",
      lr_scheduler.warmup_steps, ") must not exceed ",
      lr_scheduler.total_steps == -1 ? "training.steps (" : "lr_scheduler.total_steps (", schedule_steps,
      "): torchtitan shortens the warmup with a warning; titan asks: lower "
      "lr_scheduler.warmup_steps, or set lr_scheduler.total_steps (the schedule's length, of which the run "
      "trains the first training.steps) to at least ",
      lr_scheduler.warmup_steps);
  TITAN_CHECK(std::isfinite(training.load_balance_coeff) && training.load_balance_coeff >= 0,
              "training.load_balance_coeff must be >= 0 (the expert-bias update step), got ",
              training.load_balance_coeff);
  TITAN_CHECK(std::isfinite(metrics.peak_tflops) && metrics.peak_tflops >= 0,
              "metrics.peak_tflops must be >= 0 (0: the machine's figure), got ", metrics.peak_tflops);
  positive(metrics.log_freq, "metrics.log_freq");
  dist::check_timeout(dist::CommTimeout(comm.timeout_seconds));
  for (auto [v, key] : {std::pair{comm.init_timeout_seconds, "comm.init_timeout_seconds"},
                        std::pair{comm.train_timeout_seconds, "comm.train_timeout_seconds"}})
    TITAN_CHECK(v > 0 || v == -1, key, " must be positive (or -1: comm.timeout_seconds), got ", v);
  dist::check_timeout(comm.init_timeout());
  dist::check_timeout(comm.train_timeout());
  positive(validation.freq, "validation.freq");
  for (auto [v, key] : {std::pair{validation.steps, "validation.steps"},
                        std::pair{validation.local_batch_size, "validation.local_batch_size"},
                        std::pair{validation.seq_len, "validation.seq_len"}})
    TITAN_CHECK(v == -1 || v > 0, key, " must be positive (or -1), got ", v);
  positive(checkpoint.interval, "checkpoint.interval");
  if (profiling.enable_profiling) {  // as torchtitan: the settings are read only when profiling
    positive(profiling.profile_freq, "profiling.profile_freq");
    TITAN_CHECK(profiling.profiler_active >= 1 && profiling.profiler_active <= profiling.profile_freq,
                "profiling.profiler_active must be in [1, profiling.profile_freq = ", profiling.profile_freq,
                "], got ", profiling.profiler_active,
                ": the profiled steps are the last profiler_active of every profile_freq");
    TITAN_CHECK(!profiling.save_traces_folder.empty(), "profiling.save_traces_folder must not be empty");
  }
  if (metrics.enable_tensorboard) {  // (without TensorBoard the key has no effect: a note says so)
    TITAN_CHECK(!metrics.save_tb_folder.empty(), "metrics.save_tb_folder must not be empty");
    const std::filesystem::path dump = std::filesystem::path(job.dump_folder).lexically_normal();
    const std::filesystem::path tb = (dump / metrics.save_tb_folder).lexically_normal();
    TITAN_CHECK(tb.lexically_relative(dump) != "." && tb != dump && tb.string() + "/" != dump.string(),
                "metrics.save_tb_folder = ", metrics.save_tb_folder,
                ": the events need a folder of their own, not job.dump_folder itself (metrics.jsonl and the "
                "checkpoints are there)");
  }
  TITAN_CHECK(checkpoint.load_step >= -1,
              "checkpoint.load_step must be -1 (the newest checkpoint) or a step >= 0 (0: the seed "
              "checkpoint), got ",
              checkpoint.load_step);
  TITAN_CHECK(checkpoint.load_step == -1 || checkpoint.enable,
              "checkpoint.load_step = ", checkpoint.load_step,
              " resumes from a checkpoint: it needs checkpoint.enable = true");
  TITAN_CHECK(checkpoint.keep_latest_k == 0 || checkpoint.keep_latest_k >= 2,
              "checkpoint.keep_latest_k must be 0 (keep all) or >= 2, got ", checkpoint.keep_latest_k);
  TITAN_CHECK(model.name != "hf" || !model.hf_assets_path.empty(),
              "model.hf_assets_path is required when model.name = \"hf\"");
  TITAN_CHECK(!checkpoint.initial_load_in_hf || !checkpoint.initial_load_path.empty() || !model.hf_assets_path.empty(),
              "checkpoint.initial_load_in_hf needs checkpoint.initial_load_path (or model.hf_assets_path)");
  // Parallel degrees multiply to the world size. Data and expert parallelism run: a tensor parallel
  // degree would otherwise be silently ignored.
  const auto& p = parallelism;
  positive(p.data_parallel_replicate_degree, "parallelism.data_parallel_replicate_degree");
  positive(p.tensor_parallel_degree, "parallelism.tensor_parallel_degree");
  positive(p.expert_parallel_degree, "parallelism.expert_parallel_degree");
  TITAN_CHECK(p.data_parallel_shard_degree == -1 || p.data_parallel_shard_degree >= 1,
              "parallelism.data_parallel_shard_degree must be positive, or -1 (the ranks left), got ",
              p.data_parallel_shard_degree);
  TITAN_CHECK(p.tensor_parallel_degree == 1,
              "parallelism.tensor_parallel_degree = ", p.tensor_parallel_degree,
              ": tensor parallelism is not implemented (only data and expert parallelism run); set it to 1");
  const int64_t replicate = p.data_parallel_replicate_degree;
  TITAN_CHECK(p.data_parallel_shard_degree != -1 || world_size % replicate == 0,
              "parallelism.data_parallel_replicate_degree = ", replicate, " does not divide the world size ",
              world_size);
  const int64_t shard = p.shard_degree(world_size);
  TITAN_CHECK(shard >= 1 && shard * replicate == world_size, "parallelism.data_parallel_replicate_degree (",
              replicate, ") x parallelism.data_parallel_shard_degree (", shard, ") = ", shard * replicate,
              " != world size ", world_size);
  // torchtitan's mesh: the expert-parallel ranks are a part of the shard dimension.
  TITAN_CHECK(shard % p.expert_parallel_degree == 0,
              "parallelism.expert_parallel_degree = ", p.expert_parallel_degree,
              " must divide parallelism.data_parallel_shard_degree (", shard,
              " here): expert parallelism splits the experts over ranks of the shard dimension");
  int64_t dp = shard * p.data_parallel_replicate_degree;
  if (training.global_batch_size != -1) {
    int64_t per_step = training.local_batch_size * dp;
    const int64_t global = training.global_batch_size;
    if (global <= 0 || global % per_step != 0) {
      const int64_t local = global > 0 ? local_batch_for_global(global, training.local_batch_size, dp) : 0;
      const std::string how = global <= 0 ? ""
                              : local > 0
                                  ? ": training.local_batch_size = " + std::to_string(local) + " takes it (" +
                                        std::to_string(global) + " = " + std::to_string(local) + " x " +
                                        std::to_string(dp) + " ranks x " +
                                        std::to_string(global / (local * dp)) + " accumulation steps)"
                                  : ": " + std::to_string(global) + " is no multiple of the " +
                                        std::to_string(dp) + " data-parallel ranks; this mesh takes " +
                                        std::to_string(per_step) + ", " + std::to_string(2 * per_step) +
                                        ", ... with this local batch, or a mesh whose "
                                        "data-parallel ranks divide " +
                                        std::to_string(global) + " takes it";
      TITAN_FAIL("training.global_batch_size (", global,
                 ") must be a positive multiple of "
                 "local_batch_size x data-parallel ranks (",
                 training.local_batch_size, " x ", dp, " = ", per_step, ")", how);
    }
    TITAN_CHECK(training.global_batch_size <= kMaxBatchOrSeq,
                "training.global_batch_size = ", training.global_batch_size, " exceeds the limit ",
                kMaxBatchOrSeq, " (sequences per step)");
  }
}

int64_t local_batch_for_global(int64_t global, int64_t local, int64_t dp) {
  if (dp <= 0 || global % dp != 0) return 0;
  for (int64_t b = std::min(local, global / dp); b >= 1; --b)
    if ((global / dp) % b == 0) return b;
  return 0;
}

bool CheckpointSection::excludes(std::string_view part) const {
  return std::find(exclude_from_loading.begin(), exclude_from_loading.end(), part) !=
         exclude_from_loading.end();
}

std::string JobConfig::left_out_note(bool resumes) const {
  std::string line;
  for (const LeftOutDefault& d : left_out_defaults)
    if (!resumes || !d.initial_weights_only)
      line += (line.empty() ? "" : ", ") + d.key + " = " + d.ours + " (torchtitan's: " + d.theirs + ")";
  return line.empty() ? line : "left out, so titan's default where torchtitan's differs: " + line;
}

namespace {
// A field's value as TOML writes it.
std::string toml_value(const Field& f) {
  switch (f.kind) {
    // A JSON string is a TOML basic string (the same escapes): quotes, backslashes and newlines
    // in a value keep the listing one key per line and valid TOML.
    case Field::Str:
      return nlohmann::json(*static_cast<std::string*>(f.ptr))
          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    case Field::Int:
      return std::to_string(*static_cast<int64_t*>(f.ptr));
    case Field::Float:
      return format_double(*static_cast<double*>(f.ptr));
    case Field::Bool:
      return *static_cast<bool*>(f.ptr) ? "true" : "false";
    case Field::List:
      return nlohmann::json(*static_cast<std::vector<std::string>*>(f.ptr)).dump();
  }
  return "";
}

}  // namespace

std::string JobConfig::describe() const {
  JobConfig copy = *this;
  std::ostringstream os;
  for (auto& f : schema(copy)) os << "  " << f.key << " = " << toml_value(f) << "\n";
  for (auto& [k, v] : model.overrides) os << "  model." << k << " = " << v << "\n";
  for (auto& s : kernels)
    os << "  kernels." << s.op << " = { impl = \"" << s.variant << "\", modules = \"" << s.modules
       << "\" }\n";
  return os.str();
}

std::string job_config_reference() {
  JobConfig defaults;
  std::ostringstream os;
  // Each key commented out: set explicitly, some defaults are refused (training.load_balance on a dense
  // model) or noted as having no effect, so the listing is a template to uncomment from. What a key's
  // line adds: values the parser takes only to refuse them with a reason (not listed as choices), and
  // the models a key is for.
  struct Remark {
    std::vector<std::string> refused;
    std::string note;
  };
  const std::map<std::string, Remark> remarks = {
      {"checkpoint.exclude_from_loading", {{"model", "train_state"}, ""}},
      {"training.load_balance", {{}, "MoE models only (set on a dense model: an error)"}},
      {"training.load_balance_coeff", {{}, "MoE models only (set on a dense model: an error)"}}};
  os << "# titan's job config: every key at its default, commented out; uncomment and set the ones a job\n"
        "# changes (docs/training.md says what each does; on the command line: --section.key=value).\n";
  std::string section;
  auto close_section = [&] {
    if (section == "model")
      os << "# and any model field, defaulting to the flavor's (or config.json's with name = \"hf\"): "
         << join(qwen3::override_keys(), ", ") << "\n";
  };
  for (const Field& f : schema(defaults)) {
    const size_t dot = f.key.find('.');
    const std::string s = f.key.substr(0, dot);
    if (s != section) {
      close_section();
      os << (section.empty() ? "" : "\n") << "[" << s << "]\n";
      section = s;
    }
    os << "# " << f.key.substr(dot + 1) << " = " << toml_value(f);
    const auto remark = remarks.find(f.key);
    std::vector<std::string> choices;
    for (const std::string& c : f.choices)
      if (remark == remarks.end() ||
          !std::count(remark->second.refused.begin(), remark->second.refused.end(), c))
        choices.push_back(c);
    std::vector<std::string> said;
    if (!choices.empty())
      said.push_back((f.kind == Field::List ? "each of " : "") + join(choices, " | ") +
                     (f.unlisted.empty() ? "" : "; " + f.unlisted_note));
    if (remark != remarks.end() && !remark->second.note.empty()) said.push_back(remark->second.note);
    if (!said.empty()) os << "  # " << join(said, "; ");
    os << "\n";
  }
  close_section();
  os << "\n[kernels]\n# <op> = { impl = \"<variant>\", modules = \"<glob>\" }: `titan kernels list` names "
        "the ops and their variants\n";
  os << "\n# torchtitan's keys that are not titan's own, read from a torchtitan job file:\n";
  for (const TorchtitanKey& k : torchtitan_keys()) {
    const std::string why = k.why.empty() ? "" : ": " + std::string(k.why);
    switch (k.use) {
      case TorchtitanUse::Native:
        continue;
      case TorchtitanUse::Alias:
        os << "#   " << k.key << ": an older name of " << k.target << why << "\n";
        break;
      case TorchtitanUse::Ignored:
        os << "#   " << k.key << ": ignored, with a note" << why << "\n";
        break;
      case TorchtitanUse::OffOnly: {
        // As TOML writes them: true, 1, [] bare, a string quoted ("" included).
        std::vector<std::string> off;
        for (const std::string& v : torchtitan_off_values(k))
          off.push_back(v == "true" || v == "false" || v == "[]" || parse_int(v) ? v
                                                                                 : nlohmann::json(v).dump());
        os << "#   " << k.key << ": accepted as " << join(off, " or ") << " only" << why << "\n";
        break;
      }
    }
  }
  return os.str();
}

dist::CommTimeout CommSection::init_timeout() const {
  if (init_timeout_seconds == -1) return dist::CommTimeout(timeout_seconds, "comm.timeout_seconds");
  return dist::CommTimeout(init_timeout_seconds, "comm.init_timeout_seconds");
}

dist::CommTimeout CommSection::train_timeout() const {
  if (train_timeout_seconds == -1) return dist::CommTimeout(timeout_seconds, "comm.timeout_seconds");
  return dist::CommTimeout(train_timeout_seconds, "comm.train_timeout_seconds");
}

std::vector<std::string> job_config_keys() {
  JobConfig c;
  std::vector<std::string> keys;
  for (const Field& f : schema(c)) keys.push_back(f.key);
  for (const std::string& k : qwen3::override_keys()) keys.push_back("model." + k);
  return keys;
}

void check_known_key(const std::string& key) {
  if (key.rfind("kernels.", 0) == 0) return;  // [kernels] takes any op's name (checked when applied)
  const std::vector<std::string> known = known_keys();
  if (std::find(known.begin(), known.end(), key) == known.end()) fail_unknown_key(key, "command line");
}

bool is_boolean_key(const std::string& key) {
  if (key.rfind("model.", 0) == 0 && qwen3::is_bool_field(key.substr(6))) return true;
  JobConfig c;
  for (const Field& f : schema(c))
    if (f.key == key) return f.kind == Field::Bool;
  const TorchtitanKey* k = find_torchtitan_key(key);
  if (!k) return false;
  if (k->use == TorchtitanUse::Alias) return is_boolean_key(std::string(k->target));
  return k->use == TorchtitanUse::OffOnly ? k->target == "false" : k->type == TorchtitanType::Bool;
}

}  // namespace titan::train
