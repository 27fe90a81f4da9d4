#include "titan/models/qwen3/generate.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <type_traits>

#include "titan/core/check.h"
#include "titan/ops/log_sum_exp.h"

namespace titan::qwen3 {

// In a compute dtype other than the f32 of the weights, every forward casts every weight it reads:
// for generation, a cast of the whole model per token (the bf16 debug model ran at half its f32
// speed). While it lives, each whole block keeps its compute-dtype copy (nn::ParamBlock::compute,
// which Qwen3Model reads instead of casting), cast once; the copies go when it ends, since the
// weights may train on afterwards. The values are the casts' values, so nothing else changes.
// (Only whole blocks without a copy of their own: a sharded block's copy is its data-parallel
// gathers'.)
class ComputeCopies {
 public:
  explicit ComputeCopies(Qwen3Model& model) {
    for (nn::ParamBlock& b : model.blocks()) {
      if (b.data().dtype() == model.compute_dtype() || b.sharded() || b.has_compute_copy()) continue;
      b.add_compute_copy(model.compute_dtype());
      b.materialize_compute();
      b.compute().copy_from(b.data());
      added_.push_back(&b);
    }
  }
  ~ComputeCopies() {
    for (nn::ParamBlock* b : added_) b->remove_compute_copy();
  }
  ComputeCopies(const ComputeCopies&) = delete;
  ComputeCopies& operator=(const ComputeCopies&) = delete;

 private:
  std::vector<nn::ParamBlock*> added_;
};

namespace {

// The shortest text that reads back as the same double (1.0000001 is not "1", 0.8 is "0.8").
std::string precise(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

// log sum exp(logits) over the logits that are not NaN, from the largest (no overflow); the largest
// itself when it is infinite. The log-softmax of a logit l is l - this. In double for f64 logits (the
// f64 checks), on vectors for f32 ones (ops::log_sum_exp_f32).
template <typename T>
double log_sum_exp(std::span<const T> logits) {
  if constexpr (std::is_same_v<T, float>) {
    return ops::log_sum_exp_f32(logits);
  } else {
    double top = -std::numeric_limits<double>::infinity(), sum = 0;
    for (T l : logits)
      if (!std::isnan(l)) top = std::max(top, double(l));
    if (std::isinf(top)) return top;
    for (T l : logits)
      if (!std::isnan(l)) sum += std::exp(double(l) - top);
    return top + std::log(sum);
  }
}

// log softmax(logits)[id], in double: the model's own log-probability of `id` (no processor). An
// infinite largest logit (+inf: certain; every logit -inf: nothing to tell them apart) shares the
// mass among the ids that hold it, as the sampler does.
template <typename T>
double log_probability(std::span<const T> logits, int64_t id) {
  if (std::isnan(logits[size_t(id)])) return -std::numeric_limits<double>::infinity();  // never a candidate
  const double z = log_sum_exp(logits);
  if (std::isinf(z)) {
    const auto sharing = std::count_if(logits.begin(), logits.end(), [&](T l) { return double(l) == z; });
    return double(logits[size_t(id)]) == z ? -std::log(double(sharing))
                                           : -std::numeric_limits<double>::infinity();
  }
  return double(logits[size_t(id)]) - z;
}

// The prompts are ids of the model's vocabulary, at least one each, and the longest + max_new_tokens
// fits max_seq_len.
void check_prompts(const ModelArgs& a, const std::vector<std::vector<int64_t>>& prompts,
                   int64_t max_new_tokens) {
  TITAN_CHECK(!prompts.empty(), "generate: no prompt to continue");
  TITAN_CHECK(max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", max_new_tokens);
  int64_t longest = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const std::string which = prompts.size() > 1 ? "prompt " + std::to_string(r) + ": " : "";
    TITAN_CHECK(!prompts[r].empty(), "generate: ", which, "the prompt holds no token");
    for (size_t i = 0; i < prompts[r].size(); ++i)
      TITAN_CHECK(prompts[r][i] >= 0 && prompts[r][i] < a.vocab_size, "generate: ", which, "prompt token ", i,
                  " is id ", prompts[r][i], ", outside the model's vocabulary [0, ", a.vocab_size, ")");
    longest = std::max(longest, int64_t(prompts[r].size()));
  }
  TITAN_CHECK(max_new_tokens <= a.max_seq_len - longest, "generate: ", longest, " prompt tokens",
              prompts.size() > 1 ? " (the longest prompt)" : "", " + ", max_new_tokens,
              " new ones pass the model's max_seq_len (", a.max_seq_len, ")");
}

}  // namespace

void SamplingOptions::validate(int64_t vocab) const {
  TITAN_CHECK(std::isfinite(temperature) && temperature >= 0,
              "sampling: the temperature must be a finite number >= 0 (0: greedy), got ",
              precise(temperature));
  TITAN_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0: no limit), got ", top_k);
  TITAN_CHECK(std::isfinite(top_p) && top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1], got ",
              precise(top_p));
  TITAN_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
              "sampling: repetition_penalty must be a finite number > 0 (1: none), got ",
              precise(repetition_penalty));
  TITAN_CHECK(std::isfinite(min_p) && min_p >= 0 && min_p <= 1,
              "sampling: min_p must be in [0, 1] (0: none), got ", precise(min_p));
  TITAN_CHECK(std::isfinite(typical_p) && typical_p > 0 && typical_p <= 1,
              "sampling: typical_p must be in (0, 1] (1: none), got ", precise(typical_p));
  TITAN_CHECK(no_repeat_ngram_size >= 0, "sampling: no_repeat_ngram_size must be >= 0 (0: none), got ",
              no_repeat_ngram_size);
  TITAN_CHECK(min_new_tokens >= 0, "sampling: min_new_tokens must be >= 0 (0: none), got ", min_new_tokens);
  TITAN_CHECK(min_length >= 0, "sampling: min_length must be >= 0 (0: none), got ", min_length);
  // Every id of an id list inside the vocabulary (when it is known).
  auto ids_in_vocab = [&](const std::vector<int64_t>& ids, const std::string& what) {
    for (size_t i = 0; i < ids.size(); ++i)
      TITAN_CHECK(ids[i] >= 0 && (vocab <= 0 || ids[i] < vocab), "sampling: ", what, "[", i, "] is id ",
                  ids[i],
                  vocab > 0 ? ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")"
                            : std::string(", a negative id"));
  };
  for (size_t w = 0; w < bad_words_ids.size(); ++w) {
    const std::string what = "bad_words_ids[" + std::to_string(w) + "]";
    TITAN_CHECK(!bad_words_ids[w].empty(), "sampling: ", what, " holds no id");
    ids_in_vocab(bad_words_ids[w], what);
  }
  for (size_t s = 0; s < sequence_bias.size(); ++s) {
    const std::string what = "sequence_bias[" + std::to_string(s) + "]";
    TITAN_CHECK(!sequence_bias[s].first.empty(), "sampling: ", what, " holds no id");
    TITAN_CHECK(std::isfinite(sequence_bias[s].second), "sampling: ", what, "'s bias must be finite, got ",
                precise(sequence_bias[s].second));
    ids_in_vocab(sequence_bias[s].first, what);
  }
  ids_in_vocab(suppress_tokens, "suppress_tokens");
  ids_in_vocab(begin_suppress_tokens, "begin_suppress_tokens");
  ids_in_vocab(forced_eos_token_ids, "forced_eos_token_id");
  if (forced_bos_token_id != -1) ids_in_vocab({forced_bos_token_id}, "forced_bos_token_id");
  TITAN_CHECK(length_decay_start >= 0,
              "sampling: exponential_decay_length_penalty's start must be >= 0 new tokens, got ",
              length_decay_start);
  TITAN_CHECK(prompt_lookup_num_tokens >= 0,
              "sampling: prompt_lookup_num_tokens must be >= 0 (0: none), got ", prompt_lookup_num_tokens);
  TITAN_CHECK(max_matching_ngram_size >= 1, "sampling: max_matching_ngram_size must be >= 1, got ",
              max_matching_ngram_size);
  TITAN_CHECK(
      std::isfinite(length_decay_factor) && length_decay_factor > 0,
      "sampling: exponential_decay_length_penalty's factor must be a finite number > 0 (1: none), got ",
      precise(length_decay_factor));
  TITAN_CHECK(std::isfinite(epsilon_cutoff) && epsilon_cutoff >= 0 && epsilon_cutoff < 1,
              "sampling: epsilon_cutoff must be in [0, 1) (0: none), got ", precise(epsilon_cutoff));
  TITAN_CHECK(std::isfinite(eta_cutoff) && eta_cutoff >= 0 && eta_cutoff < 1,
              "sampling: eta_cutoff must be in [0, 1) (0: none), got ", precise(eta_cutoff));
}

GenerationDefaults generation_defaults(const nlohmann::json& c, const std::string& where) {
  GenerationDefaults out;
  if (!c.is_object()) return out;
  // A number or null (null: `if_null`); anything else names the key.
  auto number = [&](const char* key, double absent, double if_null) {
    const nlohmann::json v = c.value(key, nlohmann::json(absent));
    TITAN_CHECK(v.is_number() || v.is_null(), where, ": '", key, "' must be a number or null, got ",
                v.dump());
    return v.is_null() ? if_null : v.get<double>();
  };
  // Keys that change the choice of tokens beyond what titan's sampler does, with the value that
  // leaves it unchanged.
  const std::vector<std::pair<const char*, nlohmann::json>> unchanged = {
      {"encoder_repetition_penalty", 1.0}, {"top_h", nullptr},         {"num_beam_groups", 1},
      {"diversity_penalty", 0.0},          {"penalty_alpha", nullptr}, {"guidance_scale", nullptr},
      {"force_words_ids", nullptr},        {"constraints", nullptr},   {"max_length", nullptr}};
  for (const auto& [key, neutral] : unchanged) {
    if (!c.contains(key) || c[key] == neutral || (c[key].is_array() && c[key].empty())) continue;
    // (transformers reads max_length only without max_new_tokens)
    if (std::string_view(key) == "max_length" && c.contains("max_new_tokens") &&
        !c["max_new_tokens"].is_null())
      continue;
    out.not_applied.push_back(std::string(key) + " " + c[key].dump());
  }
  SamplingOptions& o = out.sampling;
  o.repetition_penalty = number("repetition_penalty", 1.0, 1.0);
  TITAN_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0, where,
              ": 'repetition_penalty' must be a finite number > 0, got ", precise(o.repetition_penalty));
  // A whole number >= `least` (absent or null: `otherwise`).
  auto whole = [&](const char* key, double least, double otherwise) {
    const double v = number(key, otherwise, otherwise);
    TITAN_CHECK(v >= least && v == std::floor(v) && v <= double(int64_t(1) << 31), where, ": '", key,
                "' must be a whole number >= ", precise(least), ", got ", precise(v));
    return int64_t(v);
  };
  o.no_repeat_ngram_size = whole("no_repeat_ngram_size", 0, 0);
  o.min_new_tokens = whole("min_new_tokens", 0, 0);
  o.min_length = whole("min_length", 0, 0);
  // Prompt lookup decoding (transformers' assisted generation without an assistant model).
  o.prompt_lookup_num_tokens = whole("prompt_lookup_num_tokens", 0, 0);
  o.max_matching_ngram_size = whole("max_matching_ngram_size", 1, 2);
  // Ids: a list of whole numbers >= 0 (their range is checked against the model's vocabulary when
  // they are used).
  auto ids_of = [&](const nlohmann::json& v, const std::string& what) {
    TITAN_CHECK(v.is_array(), where, ": '", what, "' must be a list of token ids, got ", v.dump());
    std::vector<int64_t> ids;
    for (const nlohmann::json& id : v) {
      TITAN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, where, ": '", what,
                  "' must hold token ids (whole numbers >= 0), got ", id.dump());
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  };
  // Absent or null: none.
  auto listed = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  if (listed("suppress_tokens")) o.suppress_tokens = ids_of(c["suppress_tokens"], "suppress_tokens");
  if (listed("begin_suppress_tokens"))
    o.begin_suppress_tokens = ids_of(c["begin_suppress_tokens"], "begin_suppress_tokens");
  if (listed("bad_words_ids")) {
    TITAN_CHECK(c["bad_words_ids"].is_array(), where,
                ": 'bad_words_ids' must be a list of lists of token ids, got ", c["bad_words_ids"].dump());
    for (const nlohmann::json& word : c["bad_words_ids"]) {
      o.bad_words_ids.push_back(ids_of(word, "bad_words_ids"));
      TITAN_CHECK(!o.bad_words_ids.back().empty(), where, ": 'bad_words_ids' holds an empty list");
    }
  }
  if (listed("sequence_bias")) {
    // transformers takes sequence_bias as a {(ids): bias} dict or as a list of [[ids], bias] pairs, the
    // form JSON can hold (it has no tuple keys).
    const nlohmann::json& biases = c["sequence_bias"];
    const std::string form = "'sequence_bias' must be a list of [[token ids], bias] pairs";
    TITAN_CHECK(biases.is_array(), where, ": ", form, ", got ", biases.dump());
    for (const nlohmann::json& pair : biases) {
      TITAN_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number(), where, ": ", form, ", got ",
                  pair.dump());
      std::vector<int64_t> ids = ids_of(pair[0], "sequence_bias");
      TITAN_CHECK(!ids.empty() && std::isfinite(pair[1].get<double>()), where, ": ", form,
                  " (ids not empty, a finite bias), got ", pair.dump());
      o.sequence_bias.emplace_back(std::move(ids), pair[1].get<double>());
    }
  }
  // transformers' forced_bos_token_id: an id; forced_eos_token_id: an id or a list of them (null: none).
  if (listed("forced_bos_token_id")) {
    const nlohmann::json& id = c["forced_bos_token_id"];
    TITAN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, where,
                ": 'forced_bos_token_id' must be a token id (a whole number >= 0) or null, got ", id.dump());
    o.forced_bos_token_id = id.get<int64_t>();
  }
  if (listed("forced_eos_token_id")) {  // (an empty list: none)
    const nlohmann::json& ids = c["forced_eos_token_id"];
    o.forced_eos_token_ids =
        ids_of(ids.is_array() ? ids : nlohmann::json::array({ids}), "forced_eos_token_id");
  }
  // exponential_decay_length_penalty: [start index, decay factor] (a tuple in Python; null: none).
  if (listed("exponential_decay_length_penalty")) {
    const nlohmann::json& decay = c["exponential_decay_length_penalty"];
    TITAN_CHECK(decay.is_array() && decay.size() == 2 && decay[0].is_number_integer() &&
                    decay[0].get<int64_t>() >= 0 && decay[1].is_number() &&
                    std::isfinite(decay[1].get<double>()) && decay[1].get<double>() > 0,
                where,
                ": 'exponential_decay_length_penalty' must be [start, factor]: a whole number of new tokens "
                ">= 0 and a finite factor > 0, got ",
                decay.dump());
    o.length_decay_start = decay[0].get<int64_t>();
    o.length_decay_factor = decay[1].get<double>();
  }
  const nlohmann::json renormalize = c.value("renormalize_logits", nlohmann::json(false));
  TITAN_CHECK(renormalize.is_boolean() || renormalize.is_null(), where,
              ": 'renormalize_logits' must be true, false or null, got ", renormalize.dump());
  o.renormalize_logits = renormalize == true;
  out.max_new_tokens =
      c.contains("max_new_tokens") && !c["max_new_tokens"].is_null() ? whole("max_new_tokens", 1, 1) : 0;
  const nlohmann::json stops = c.value("stop_strings", nlohmann::json());
  if (!stops.is_null())
    for (const nlohmann::json& text : stops.is_array() ? stops : nlohmann::json::array({stops})) {
      TITAN_CHECK(text.is_string() && !text.get<std::string>().empty(), where,
                  ": 'stop_strings' must be a non-empty string or a list of them, got ", stops.dump());
      out.stop_strings.push_back(text.get<std::string>());
    }
  const nlohmann::json do_sample = c.value("do_sample", nlohmann::json(false));
  TITAN_CHECK(do_sample.is_boolean(), where, ": 'do_sample' must be true or false, got ", do_sample.dump());
  out.samples = do_sample.get<bool>();
  // Beam search, read either way: a caller that turns sampling off (transformers' generate with
  // do_sample=False) searches with them.
  BeamSearchOptions& b = out.beams;
  b.num_beams = whole("num_beams", 1, 1);
  b.length_penalty = number("length_penalty", 1.0, 1.0);
  TITAN_CHECK(std::isfinite(b.length_penalty), where, ": 'length_penalty' must be a finite number, got ",
              precise(b.length_penalty));
  const nlohmann::json early = c.value("early_stopping", nlohmann::json(false));
  TITAN_CHECK(early.is_boolean() || early == "never", where,
              ": 'early_stopping' must be true, false or \"never\", got ", early.dump());
  b.early_stopping = early == "never" ? EarlyStopping::Never
                     : early == true  ? EarlyStopping::Always
                                      : EarlyStopping::Heuristic;
  b.num_return_sequences = whole("num_return_sequences", 1, 1);
  // (With do_sample and one beam, num_return_sequences is the samples of a prompt; with several,
  // beam sampling's sequences, as without.)
  if (!out.samples || b.num_beams > 1) {
    TITAN_CHECK(b.num_return_sequences <= b.num_beams, where, ": 'num_return_sequences' ",
                b.num_return_sequences, " asks for more sequences than its num_beams ", b.num_beams,
                b.num_beams == 1 ? " (greedy search returns one)" : "", " can give");
  }
  if (!out.samples) return out;
  o.temperature = number("temperature", 1.0, 1.0);
  const double top_k = number("top_k", 50, 0);
  TITAN_CHECK(top_k >= 0 && top_k == std::floor(top_k), where, ": 'top_k' must be a whole number >= 0, got ",
              precise(top_k));
  o.top_k = int64_t(top_k);
  o.top_p = number("top_p", 1.0, 1.0);
  o.min_p = number("min_p", 0.0, 0.0);
  o.typical_p = number("typical_p", 1.0, 1.0);
  TITAN_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, where,
              ": 'temperature' must be a finite number >= 0, got ", precise(o.temperature));
  TITAN_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, where,
              ": 'top_p' must be in (0, 1], got ", precise(o.top_p));
  TITAN_CHECK(std::isfinite(o.min_p) && o.min_p >= 0 && o.min_p <= 1, where,
              ": 'min_p' must be in [0, 1], got ", precise(o.min_p));
  TITAN_CHECK(std::isfinite(o.typical_p) && o.typical_p > 0 && o.typical_p <= 1, where,
              ": 'typical_p' must be in (0, 1], got ", precise(o.typical_p));
  o.epsilon_cutoff = number("epsilon_cutoff", 0.0, 0.0);
  o.eta_cutoff = number("eta_cutoff", 0.0, 0.0);
  for (const auto& [key, value] :
       {std::pair{"epsilon_cutoff", o.epsilon_cutoff}, std::pair{"eta_cutoff", o.eta_cutoff}})
    TITAN_CHECK(std::isfinite(value) && value >= 0 && value < 1, where, ": '", key,
                "' must be in [0, 1) (0: none), got ", precise(value));
  // (temperature 0: greedy, as titan's sampler takes it.)
  return out;
}

double token_log_probability(std::span<const float> logits, int64_t id) {
  TITAN_CHECK(id >= 0 && size_t(id) < logits.size(), "token_log_probability: id ", id, " outside [0, ",
              logits.size(), ")");
  return log_probability<float>(logits, id);
}

std::vector<bool> repeated_ngram_ids(std::span<const int64_t> sequence, int64_t n, int64_t vocab) {
  // transformers' NoRepeatNGramLogitsProcessor: the ids that followed the sequence's last n-1 ids
  // wherever those n-1 ids occurred before (with n = 1, every id of the sequence).
  std::vector<bool> banned;
  const auto n_gram = size_t(n);
  if (n_gram == 0 || sequence.size() + 1 < n_gram) return banned;
  banned.assign(size_t(vocab), false);
  const std::span<const int64_t> tail = sequence.last(n_gram - 1);
  for (size_t start = 0; start + n_gram <= sequence.size(); ++start)
    if (std::equal(tail.begin(), tail.end(), sequence.begin() + ptrdiff_t(start)))
      banned[size_t(sequence[start + n_gram - 1])] = true;
  return banned;
}

// Whether `sequence` ends with `prefix` (an entry's ids before its last).
static bool ends_with(std::span<const int64_t> sequence, std::span<const int64_t> prefix) {
  return prefix.size() <= sequence.size() &&
         std::equal(prefix.begin(), prefix.end(), sequence.end() - ptrdiff_t(prefix.size()));
}

std::vector<bool> banned_ids(std::span<const int64_t> sequence, const SamplingOptions& o, int64_t vocab) {
  std::vector<bool> banned = repeated_ngram_ids(sequence, o.no_repeat_ngram_size, vocab);
  auto ban = [&](int64_t id) {
    TITAN_CHECK(id >= 0 && id < vocab, "sampling: a bad word or suppressed id ", id,
                " is outside the vocabulary [0, ", vocab, ")");
    if (banned.empty()) banned.assign(size_t(vocab), false);
    banned[size_t(id)] = true;
  };
  // transformers' NoBadWordsLogitsProcessor (a sequence bias of -inf): a one-id entry always, a
  // longer one's last id after its other ids; an entry longer than the sequence so far is skipped,
  // as there.
  for (const std::vector<int64_t>& word : o.bad_words_ids)
    if (word.size() == 1 || (word.size() <= sequence.size() &&
                             ends_with(sequence, std::span<const int64_t>(word).first(word.size() - 1))))
      ban(word.back());
  for (int64_t id : o.suppress_tokens) ban(id);  // SuppressTokensLogitsProcessor
  return banned;
}

SamplingOptions without_stop_words(const SamplingOptions& o, const std::vector<int64_t>& stop_ids) {
  SamplingOptions out = o;
  std::erase_if(out.bad_words_ids, [&](const std::vector<int64_t>& word) {
    return word.size() == 1 && std::find(stop_ids.begin(), stop_ids.end(), word[0]) != stop_ids.end();
  });
  return out;
}

std::vector<std::pair<int64_t, float>> sequence_biases(std::span<const int64_t> sequence,
                                                       const SamplingOptions& o) {
  // transformers' SequenceBiasLogitsProcessor: the one-id entries' biases, then each longer entry's
  // where its other ids end the sequence (skipped when longer than the sequence), summed in f32.
  // Its entries are a dict: an entry whose ids come again counts once, at its first place, with the
  // last one's bias.
  const auto& entries = o.sequence_bias;
  auto bias_of = [&](size_t e) {  // the last bias given for entry e's ids; NaN at a repeat (skipped)
    for (size_t before = 0; before < e; ++before)
      if (entries[before].first == entries[e].first) return std::numeric_limits<double>::quiet_NaN();
    double bias = entries[e].second;
    for (size_t after = e + 1; after < entries.size(); ++after)
      if (entries[after].first == entries[e].first) bias = entries[after].second;
    return bias;
  };
  std::vector<std::pair<int64_t, float>> out;
  auto add = [&](int64_t id, double bias) {
    for (auto& [have, sum] : out)
      if (have == id) {
        sum += float(bias);
        return;
      }
    out.emplace_back(id, float(bias));
  };
  for (size_t e = 0; e < entries.size(); ++e)
    if (const std::vector<int64_t>& ids = entries[e].first; ids.size() == 1)
      if (const double bias = bias_of(e); !std::isnan(bias)) add(ids[0], bias);
  for (size_t e = 0; e < entries.size(); ++e)
    if (const std::vector<int64_t>& ids = entries[e].first;
        ids.size() >= 2 && ids.size() <= sequence.size() &&
        ends_with(sequence, std::span<const int64_t>(ids).first(ids.size() - 1)))
      if (const double bias = bias_of(e); !std::isnan(bias)) add(ids.back(), bias);
  std::sort(out.begin(), out.end());
  return out;
}

StepMasks::StepMasks(const std::vector<bool>& allowed, const std::vector<int64_t>& stop_ids,
                     const SamplingOptions& o, int64_t vocab, int64_t max_new_tokens)
    : min_new_tokens_(o.min_new_tokens),
      min_length_(o.min_length),
      max_new_tokens_(max_new_tokens),
      decay_start_(o.length_decay_start),
      decay_factor_(o.length_decay_factor),
      forced_eos_(o.forced_eos_token_ids),
      begin_(!o.begin_suppress_tokens.empty()) {
  if (o.forced_bos_token_id >= 0) forced_bos_ = {o.forced_bos_token_id};
  // The stop ids the length decay boosts: each once (a caller may list an id twice, as the
  // tokenizer's eos and the config's eos_token_id; transformers boosts it once) and of the vocabulary.
  for (int64_t id : stop_ids)
    if (id >= 0 && id < vocab && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end())
      stop_ids_.push_back(id);
  // Flags over the vocabulary from `from` (empty: every id) less `ids` (empty stays empty when no id
  // leaves).
  auto less = [vocab](const std::vector<bool>& from, const std::vector<int64_t>& ids) {
    if (ids.empty()) return from;
    std::vector<bool> out = from.empty() ? std::vector<bool>(size_t(vocab), true) : from;
    for (int64_t id : ids)
      if (id >= 0 && id < vocab) out[size_t(id)] = false;
    return out;
  };
  masks_[0][0] = allowed;
  if (o.min_new_tokens > 0 || o.min_length > 0) masks_[1][0] = less(allowed, stop_ids);
  if (begin_)
    for (int held = 0; held < 2; ++held) masks_[held][1] = less(masks_[held][0], o.begin_suppress_tokens);
}

const std::vector<bool>& StepMasks::at(int64_t prompt_length, int64_t t) const {
  // (A forced step's ids replace the logits min_new_tokens / min_length would hold back, as there.)
  const bool forced = forced_eos(t) || forced_bos(prompt_length, t);
  const bool held = !forced && (t < min_new_tokens_ || prompt_length + t < min_length_);
  // begin_suppress_tokens: the first new token, or the one after a forced bos token (transformers
  // starts SuppressTokensAtBegin one later when forced_bos_token_id is set and the prompt is one id).
  const int64_t begin = !forced_bos_.empty() && prompt_length == 1 ? 1 : 0;
  return masks_[held ? 1 : 0][begin_ && t == begin ? 1 : 0];
}

StepForcing StepMasks::forcing(int64_t prompt_length, int64_t t) const {
  // transformers applies ForcedBOSTokenLogitsProcessor, then ForcedEOSTokenLogitsProcessor: the eos
  // ids win a step that is both.
  if (forced_eos(t)) return {forced_eos_, {}, 0};
  if (forced_bos(prompt_length, t)) return {forced_bos_, {}, 0};
  // ExponentialDecayLengthPenalty: its cur_len (prompt + t) past start + the prompt's length.
  if (decay_factor_ == 1 || t <= decay_start_) return {};
  return {{}, stop_ids_, std::pow(decay_factor_, double(t - decay_start_)) - 1};
}

namespace {

// One row's logits as the processors leave them (transformers' order: the sequence bias, the
// repetition penalty, then the n-gram rule and the bad words) and the ids that may be chosen: allowed, not
// banned, and not NaN (a NaN logit says the model diverged, not that the token is likely).
class Candidates {
 public:
  Candidates(std::span<const float> logits_in, const SamplingOptions& o, const std::vector<bool>& allowed,
             std::span<const int64_t> sequence, const StepForcing& forcing)
      : allowed_(allowed) {
    const int64_t V = int64_t(logits_in.size());
    for (int64_t id : sequence)
      TITAN_CHECK(id >= 0 && id < V, "pick_next_token: sequence id ", id, " is outside the ", V, " logits");
    TITAN_CHECK(allowed.empty() || int64_t(allowed.size()) == V, "pick_next_token: ", allowed.size(),
                " allowed flags for ", V, " logits");
    if (!forcing.forced.empty()) {
      // transformers' ForcedBOS/ForcedEOSTokenLogitsProcessor: every logit -inf but the forced ids'
      // 0, whatever the processors before made of them; suppress_tokens applies after it.
      penalized_.assign(size_t(V), -std::numeric_limits<float>::infinity());
      banned_.assign(size_t(V), true);
      for (int64_t id : forcing.forced) {
        TITAN_CHECK(id >= 0 && id < V, "sampling: forced id ", id, " is outside the vocabulary [0, ", V, ")");
        penalized_[size_t(id)] = 0;
        banned_[size_t(id)] = false;
      }
      for (int64_t id : o.suppress_tokens)
        if (id >= 0 && id < V) banned_[size_t(id)] = true;
      logits = penalized_;
      return;
    }
    // transformers' SequenceBiasLogitsProcessor, first: the biases added in f32.
    std::span<const float> base = logits_in;
    const std::vector<std::pair<int64_t, float>> biases = sequence_biases(sequence, o);
    if (!biases.empty()) {
      biased_.assign(logits_in.begin(), logits_in.end());
      for (const auto& [id, bias] : biases) {
        TITAN_CHECK(id >= 0 && id < V, "sampling: sequence_bias names id ", id,
                    ", outside the vocabulary [0, ", V, ")");
        biased_[size_t(id)] += bias;
      }
      base = biased_;
    }
    // transformers' RepetitionPenaltyLogitsProcessor, in f32 as it computes: each id of the sequence,
    // its logit divided by the penalty when positive, multiplied when not (a repeated id once).
    if (o.repetition_penalty != 1 && !sequence.empty()) {
      penalized_.assign(base.begin(), base.end());
      const float penalty = float(o.repetition_penalty);
      for (int64_t id : sequence) {
        const float l = base[size_t(id)];
        penalized_[size_t(id)] = l < 0 ? l * penalty : l / penalty;
      }
    }
    // transformers' ExponentialDecayLengthPenalty: the stop ids' logits l + |l| * boost, in f32.
    if (forcing.boost != 0 && !forcing.boosted.empty()) {
      if (penalized_.empty()) penalized_.assign(base.begin(), base.end());
      const float boost = float(forcing.boost);
      for (int64_t id : forcing.boosted)
        if (id >= 0 && id < V && std::isfinite(penalized_[size_t(id)]))
          penalized_[size_t(id)] += std::fabs(penalized_[size_t(id)]) * boost;
    }
    logits = penalized_.empty() ? base : std::span<const float>(penalized_);
    banned_ = banned_ids(sequence, o, V);
  }

  std::span<const float> logits;

  bool ok(int64_t id) const {
    return (allowed_.empty() || allowed_[size_t(id)]) && (banned_.empty() || !banned_[size_t(id)]) &&
           !std::isnan(logits[size_t(id)]);
  }

  // The most likely (the lowest id on a tie: transformers' argmax), in one pass: a batch's rows each
  // scan V logits per step.
  int64_t most_likely() const {
    int64_t best = -1;
    for (int64_t id = 0; id < int64_t(logits.size()); ++id)
      if (ok(id) && (best < 0 || logits[size_t(id)] > logits[size_t(best)])) best = id;
    TITAN_CHECK(best >= 0, kNoneLeft);
    return best;
  }

  // One key per candidate whose unsigned order is the sampler's: descending logits, then ascending
  // ids (sorting keys, where comparisons through the logits took ~10 ms for Qwen3's 151936 ids).
  std::vector<uint64_t> keys() const {
    std::vector<uint64_t> out;
    out.reserve(logits.size());
    for (int64_t id = 0; id < int64_t(logits.size()); ++id)
      if (ok(id)) {
        uint32_t bits;
        std::memcpy(&bits, &logits[size_t(id)], 4);
        // IEEE order as unsigned (negatives flipped whole, positives with the sign bit set), then
        // inverted for descending; -0 and +0 compare equal as floats, so both take +0's key.
        if ((bits << 1) == 0) bits = 0;
        const uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
        out.push_back((uint64_t(~ascending) << 32) | uint64_t(uint32_t(id)));
      }
    TITAN_CHECK(!out.empty(), kNoneLeft);
    return out;
  }
  static int64_t id_of(uint64_t key) { return int64_t(key & 0xFFFFFFFFu); }

 private:
  static constexpr const char* kNoneLeft =
      "generate: every logit is NaN, or no id is allowed (the tokenizer's ids, no_repeat_ngram_size, "
      "bad words, suppressed ids, min_new_tokens / min_length holding the stop ids back): the model "
      "cannot pick a token";
  const std::vector<bool>& allowed_;
  std::vector<float> biased_, penalized_;
  std::vector<bool> banned_;
};

// id's probability relative to the most likely one's (logit `top`) at temperature T, in double:
// exp((l - top) / T) from the largest (no overflow). An infinite largest logit (+inf: certain;
// every logit -inf: nothing to tell them apart) shares the mass among the ids that hold it: inf -
// inf would be NaN.
double relative_probability(double l, double top, double T) {
  return std::isinf(top) ? double(l == top) : std::exp((l - top) / T);
}

}  // namespace

namespace {

// The sampling distribution of `candidates` (temperature > 0): the warpers in transformers' order,
// each keeping at least `min_keep` ids (transformers' min_tokens_to_keep: 1 when sampling, more in
// beam sampling).
std::vector<std::pair<int64_t, double>> warped_distribution(const Candidates& candidates,
                                                            const SamplingOptions& o, size_t min_keep) {
  const std::span<const float> logits = candidates.logits;
  std::vector<uint64_t> keys = candidates.keys();
  const size_t keep = o.top_k > 0 ? std::min(keys.size(), std::max(size_t(o.top_k), min_keep)) : keys.size();
  if (keep < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + ptrdiff_t(keep), keys.end());
    keys.resize(keep);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> ids(keep);
  for (size_t i = 0; i < keep; ++i) ids[i] = Candidates::id_of(keys[i]);
  // Softmax of logits / temperature: p[i] is id i's probability relative to the most likely id's.
  const double top = logits[size_t(ids[0])];
  std::vector<double> p(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    p[i] = relative_probability(logits[size_t(ids[i])], top, o.temperature);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  // Nucleus: the shortest most-likely prefix whose mass reaches top_p (always at least one id).
  size_t n = p.size();
  if (o.top_p < 1) {
    double mass = 0;
    for (n = 0; n < p.size();) {
      mass += p[n++] / total;
      if (mass >= o.top_p) break;
    }
    n = std::max(n, std::min(min_keep, p.size()));
  }
  // min-p: the ids at least min_p times as likely as the most likely (p[0] = 1), a prefix again.
  if (o.min_p > 0)
    while (n > std::max<size_t>(1, min_keep) && p[n - 1] < o.min_p) --n;
  p.resize(n);
  ids.resize(n);
  // Typical: over what is left, the ids whose surprise |-log q - H| is smallest, in that order, until
  // their mass reaches typical_p; every id no more surprising than the last of them stays.
  if (o.typical_p < 1 && n > 1) {
    const double kept = std::accumulate(p.begin(), p.end(), 0.0);
    double entropy = 0;
    std::vector<double> surprise(n);
    for (size_t i = 0; i < n; ++i) {
      const double q = p[i] / kept, log_q = std::log(q);
      if (q > 0) entropy -= q * log_q;
      surprise[i] = log_q;  // finished below, once the entropy is known
    }
    for (size_t i = 0; i < n; ++i) surprise[i] = std::abs(-surprise[i] - entropy);
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return surprise[a] < surprise[b]; });
    double mass = 0;
    size_t last = 0;  // transformers: the count of the order's prefix masses below typical_p
    for (; last + 1 < n; ++last) {
      mass += p[order[last]] / kept;
      if (!(mass < o.typical_p)) break;
    }
    const double bound = surprise[order[last]];
    std::vector<bool> least_surprising(n, false);  // the min_keep first of the order stay too
    for (size_t j = 0; j < std::min(min_keep, n); ++j) least_surprising[order[j]] = true;
    size_t w = 0;
    for (size_t i = 0; i < n; ++i)
      if (surprise[i] <= bound || least_surprising[i]) {
        ids[w] = ids[i];
        p[w++] = p[i];
      }
    ids.resize(w);
    p.resize(w);
  }
  // Epsilon, then eta: the ids whose probability (among those left) is below the cut leave, except
  // those as likely as the min_keep-th most likely (transformers keeps the top scores' ids).
  auto cut_below = [&](double cut) {
    const double kept = std::accumulate(p.begin(), p.end(), 0.0),
                 kept_logit = logits[size_t(ids[std::min(min_keep, ids.size()) - 1])];
    size_t w = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      if (p[i] / kept >= cut || logits[size_t(ids[i])] >= kept_logit) {
        ids[w] = ids[i];
        p[w++] = p[i];
      }
    ids.resize(w);
    p.resize(w);
  };
  if (o.epsilon_cutoff > 0) cut_below(o.epsilon_cutoff);
  if (o.eta_cutoff > 0) {
    const double kept = std::accumulate(p.begin(), p.end(), 0.0);
    double entropy = 0;
    for (double w : p)
      if (w > 0) entropy -= w / kept * std::log(w / kept);
    cut_below(std::min(o.eta_cutoff, std::sqrt(o.eta_cutoff) * std::exp(-entropy)));
  }
  const double kept = std::accumulate(p.begin(), p.end(), 0.0);
  // (An id whose probability underflows to 0, far below the top one, cannot be drawn: left out.)
  std::vector<std::pair<int64_t, double>> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    if (p[i] > 0) out.emplace_back(ids[i], p[i] / kept);
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, double>> next_token_distribution(std::span<const float> logits,
                                                                const SamplingOptions& o,
                                                                const std::vector<bool>& allowed,
                                                                std::span<const int64_t> sequence,
                                                                const StepForcing& forcing) {
  const Candidates candidates(logits, o, allowed, sequence, forcing);
  if (o.temperature == 0) return {{candidates.most_likely(), 1.0}};
  return warped_distribution(candidates, o, 1);
}

int64_t pick_next_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng,
                        const std::vector<bool>& allowed, std::span<const int64_t> sequence,
                        const StepForcing& forcing) {
  if (o.temperature == 0) return Candidates(logits, o, allowed, sequence, forcing).most_likely();
  // One uniform draw in [0, 1): the first id, most likely first, whose running probability passes it.
  if (o.typical_p < 1 || o.epsilon_cutoff > 0 || o.eta_cutoff > 0) {  // these read the whole set
    const std::vector<std::pair<int64_t, double>> d =
        next_token_distribution(logits, o, allowed, sequence, forcing);
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    double run = 0;
    for (const auto& [id, prob] : d)
      if ((run += prob) > u) return id;
    return d.back().first;  // u within rounding of 1
  }
  // Temperature, top-k, top-p and min-p keep a most-likely prefix, and the draw walks it from the
  // top: only as much of the order as the walks reach is sorted, in chunks growing fourfold (a
  // peaked distribution sorts a few hundred ids, not the vocabulary). The same draw as from
  // next_token_distribution, up to the order in which the total is summed.
  const Candidates candidates(logits, o, allowed, sequence, forcing);
  std::vector<uint64_t> keys = candidates.keys();
  if (o.top_k > 0 && size_t(o.top_k) < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + o.top_k, keys.end());
    keys.resize(size_t(o.top_k));
  }
  const size_t count = keys.size();
  const double top =
      candidates.logits[size_t(Candidates::id_of(*std::min_element(keys.begin(), keys.end())))];
  auto probability = [&](uint64_t key) {
    return relative_probability(candidates.logits[size_t(Candidates::id_of(key))], top, o.temperature);
  };
  double total = 0;
  size_t at_least_min_p = 0;  // the min-p prefix: the ids at least min_p times as likely as the top one
  for (uint64_t key : keys) {
    const double q = probability(key);
    total += q;
    at_least_min_p += q >= o.min_p;
  }
  std::vector<double> p;  // of the sorted prefix keys[0, sorted)
  size_t sorted = 0, chunk = 256;
  auto sort_to = [&](size_t i) {  // keys[0, i] sorted (i < count)
    while (sorted <= i) {
      const size_t to = std::min(count, sorted + chunk);
      if (to < count)
        std::nth_element(keys.begin() + ptrdiff_t(sorted), keys.begin() + ptrdiff_t(to), keys.end());
      std::sort(keys.begin() + ptrdiff_t(sorted), keys.begin() + ptrdiff_t(to));
      for (size_t k = sorted; k < to; ++k) p.push_back(probability(keys[k]));
      sorted = to;
      chunk *= 4;
    }
  };
  // Nucleus: the shortest prefix whose mass reaches top_p; then min-p; at least one id.
  size_t n = count;
  if (o.top_p < 1) {
    double mass = 0;
    for (n = 0; n < count;) {
      sort_to(n);
      mass += p[n++] / total;
      if (mass >= o.top_p) break;
    }
  }
  if (o.min_p > 0) n = std::max<size_t>(1, std::min(n, at_least_min_p));
  double kept = total;
  if (n < count) {
    sort_to(n - 1);
    kept = std::accumulate(p.begin(), p.begin() + ptrdiff_t(n), 0.0);
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double run = 0;
  for (size_t i = 0; i < n; ++i) {
    sort_to(i);
    if ((run += p[i] / kept) > u) return Candidates::id_of(keys[i]);
  }
  sort_to(n - 1);
  return Candidates::id_of(keys[n - 1]);  // u within rounding of 1
}

namespace {

// One prompt's generation as it grows: its sampler's stream, the ids the processors read (prompt and
// new tokens), and what it returns.
struct Growing {
  Growing(const std::vector<int64_t>& prompt, uint64_t seed) : rng(seed), sequence(prompt) {
    out.stop_reason = "max new tokens";
  }
  std::mt19937_64 rng;
  std::vector<int64_t> sequence;
  Generation out;
};

// What every step of a generation follows, generate_batch's rows and a GenerationSession's turns
// alike: how the next token is chosen, and when a sequence ends.
class StepRules {
 public:
  StepRules(const ModelArgs& a, int64_t max_new_tokens, const SamplingOptions& options,
            const std::vector<int64_t>& stop_ids, const std::vector<bool>& allowed,
            const StopCheck& stop_check, bool logprobs)
      : max_new_tokens_(max_new_tokens),
        options_(without_stop_words(options, stop_ids)),
        stop_ids_(stop_ids),
        stop_check_(stop_check),
        logprobs_(logprobs),
        start_(std::chrono::steady_clock::now()),
        masks_(checked(allowed, options_, a), stop_ids, options_, a.vocab_size, max_new_tokens) {}

  // The next token of `g` from its row of logits (touching `g` alone: rows run in parallel).
  int64_t choose(Growing& g, std::span<const float> logits) const {
    const int64_t t = int64_t(g.out.ids.size()), prompt_length = int64_t(g.sequence.size()) - t;
    const int64_t id = pick_next_token(logits, options_, g.rng, masks_.at(prompt_length, t), g.sequence,
                                       masks_.forcing(prompt_length, t));
    if (logprobs_) g.out.logprobs.push_back(token_log_probability(logits, id));
    return id;
  }

  // Appends `id` to `g`; whether `g` goes on after it (else its stop reason and seconds are set).
  bool take(Growing& g, int64_t id) const {
    g.sequence.push_back(id);
    g.out.ids.push_back(id);
    const bool by_id = std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
    const bool stopped = by_id || (stop_check_ && stop_check_(g.out.ids));
    if (stopped) g.out.stop_reason = by_id ? "stop token" : "stop string";
    if (!stopped && int64_t(g.out.ids.size()) < max_new_tokens_) return true;
    g.out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return false;
  }

 private:
  // `allowed`, once it and the options are checked against the vocabulary.
  static const std::vector<bool>& checked(const std::vector<bool>& allowed, const SamplingOptions& options,
                                          const ModelArgs& a) {
    options.validate(a.vocab_size);
    TITAN_CHECK(allowed.empty() || int64_t(allowed.size()) == a.vocab_size, "generate: ", allowed.size(),
                " allowed flags for a vocabulary of ", a.vocab_size);
    return allowed;
  }

  int64_t max_new_tokens_;
  const SamplingOptions options_;  // as given, less the bad words that are a stop id alone
  const std::vector<int64_t>& stop_ids_;
  const StopCheck& stop_check_;
  bool logprobs_;
  std::chrono::steady_clock::time_point start_;
  StepMasks masks_;  // the ids each step may take
};

}  // namespace

std::vector<Generation> generate_batch(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                       int64_t max_new_tokens, const SamplingOptions& options,
                                       const std::vector<int64_t>& stop_ids, const std::vector<bool>& allowed,
                                       const BatchOptions& batch) {
  const std::vector<uint64_t>& seeds = batch.seeds;
  const int64_t batch_size = batch.batch_size;
  const ModelArgs& a = model.args();
  const StepRules rules(a, max_new_tokens, options, stop_ids, allowed, batch.stop_check, batch.logprobs);
  TITAN_CHECK(seeds.empty() || seeds.size() == prompts.size(), "generate: ", seeds.size(), " seeds for ",
              prompts.size(), " prompts");
  TITAN_CHECK(batch_size >= 0, "generate: batch_size must be >= 0 (0: every prompt at once), got ",
              batch_size);
  check_prompts(a, prompts, max_new_tokens);
  if (options.prompt_lookup_num_tokens > 0) {
    // Prompt lookup decoding drafts each sequence's own tokens: the prompts run one at a time, over
    // one session (a prompt sharing the previous one's start runs only the rest), each sampling from
    // its own stream as in a batch.
    const auto start = std::chrono::steady_clock::now();
    GenerationSession session(model);
    std::vector<Generation> out;
    for (size_t r = 0; r < prompts.size(); ++r) {
      const std::function<void(int64_t)> on_token = [&](int64_t id) {
        if (batch.on_token) batch.on_token(r, id);
      };
      SamplingOptions own = options;
      own.seed = seeds.empty() ? options.seed + r : seeds[r];
      out.push_back(session.generate(prompts[r], max_new_tokens, own, stop_ids, allowed, on_token,
                                     batch.stop_check, batch.logprobs));
      out.back().seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (batch.on_done) batch.on_done(r, out.back());
    }
    return out;
  }

  const ComputeCopies weights(model);
  const size_t n = prompts.size(), width = batch_size > 0 ? std::min(n, size_t(batch_size)) : n;
  std::vector<Growing> grow;
  for (size_t r = 0; r < n; ++r) grow.emplace_back(prompts[r], seeds.empty() ? options.seed + r : seeds[r]);
  // Prompt r's next token from row `row` of `logits` (touching prompt r alone: rows run in parallel);
  // then what it means for prompt r, serially (the callbacks run in row order): whether it goes on.
  auto choose = [&](size_t r, const Tensor& logits, int64_t row) {
    return rules.choose(
        grow[r], std::span<const float>(logits.data<float>() + row * a.vocab_size, size_t(a.vocab_size)));
  };
  auto take = [&](size_t r, int64_t next) {
    const bool goes_on = rules.take(grow[r], next);
    if (batch.on_token) batch.on_token(r, next);
    if (!goes_on && batch.on_done) batch.on_done(r, grow[r].out);
    return goes_on;
  };
  auto to_ids = [&](const std::vector<int64_t>& values, int64_t rows) {
    return Tensor::from_vector(values, {rows, int64_t(values.size()) / rows}).to(model.device());
  };
  std::vector<size_t> waiting(n);  // the prompts not begun, in order
  std::iota(waiting.begin(), waiting.end(), size_t(0));
  while (!waiting.empty()) {
    // A fresh batch: the next `width` prompts, the shorter left-padded to the longest (with their own
    // first token; the padding is never attended to). Its positions may run to max_seq_len.
    std::vector<size_t> live;  // the prompts of the cache's rows, in order
    const size_t begin = std::min(width, waiting.size());
    live.assign(waiting.begin(), waiting.begin() + ptrdiff_t(begin));
    waiting.erase(waiting.begin(), waiting.begin() + ptrdiff_t(begin));
    // A prompt the batch holds more than once (several samples of one prompt) runs through the model
    // once: cache_row[k], the row of the cache (and of the logits) that live prompt k reads, is its
    // first copy's until the rows are copied out after the first token.
    std::vector<size_t> distinct;  // live indexes of the first copy of each prompt
    std::vector<int64_t> cache_row(live.size());
    for (size_t k = 0; k < live.size(); ++k) {
      size_t u = 0;
      while (u < distinct.size() && prompts[live[distinct[u]]] != prompts[live[k]]) ++u;
      if (u == distinct.size()) distinct.push_back(k);
      cache_row[k] = int64_t(u);
    }
    int64_t batch_longest = 0;
    for (size_t r : live) batch_longest = std::max(batch_longest, int64_t(prompts[r].size()));
    std::vector<int64_t> padding, first_ids;
    for (size_t k : distinct) {
      const std::vector<int64_t>& prompt = prompts[live[k]];
      padding.push_back(batch_longest - int64_t(prompt.size()));
      first_ids.insert(first_ids.end(), size_t(padding.back()), prompt[0]);
      first_ids.insert(first_ids.end(), prompt.begin(), prompt.end());
    }
    const bool padded = std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p > 0; });
    KVCache cache =
        model.kv_cache(int64_t(distinct.size()), a.max_seq_len, padded ? padding : std::vector<int64_t>());
    Tensor ids = to_ids(first_ids, int64_t(distinct.size()));
    while (!live.empty()) {
      const Tensor logits = model.next_token_logits(ids, cache).to(Device::CPU).to(DType::F32);
      // Sampling sorts a vocabulary per row: the rows share the threads. (An error cannot leave an
      // OpenMP region: it is carried out and raised after it.)
      std::vector<int64_t> chosen(live.size());
      std::vector<std::exception_ptr> failed(live.size());
#pragma omp parallel for schedule(dynamic, 1) if (live.size() > 1 && options.temperature > 0)
      for (size_t row = 0; row < live.size(); ++row) {
        try {
          chosen[row] = choose(live[row], logits, cache_row[row]);
        } catch (...) {
          failed[row] = std::current_exception();
        }
      }
      for (const std::exception_ptr& e : failed)
        if (e) std::rethrow_exception(e);
      std::vector<size_t> still;
      std::vector<int64_t> kept_rows, next_ids;
      for (size_t row = 0; row < live.size(); ++row)
        if (take(live[row], chosen[row])) {
          still.push_back(live[row]);
          kept_rows.push_back(cache_row[row]);
          next_ids.push_back(chosen[row]);
        }
      if (still.empty()) break;  // the batch is done: the next one starts afresh
      // A prompt that stopped leaves the batch: the next steps run the others alone (and a prompt's
      // copies get rows of their own).
      cache.select_rows(kept_rows);
      live = std::move(still);
      cache_row.resize(live.size());
      std::iota(cache_row.begin(), cache_row.end(), int64_t(0));
      // A free row takes the first prompt waiting that the batch's position has reached (its keys go
      // right-aligned, after padding; a longer one waits for a later step or the next batch), while
      // the batch has room for its new tokens: its prompt runs alone, then its row joins the batch for
      // its second token on.
      for (auto w = waiting.begin(); live.size() < width && w != waiting.end() &&
                                     cache.length() + max_new_tokens - 1 <= cache.capacity();) {
        if (int64_t(prompts[*w].size()) > cache.length()) {
          ++w;
          continue;
        }
        const size_t r = *w;
        w = waiting.erase(w);
        KVCache alone = model.kv_cache(1, int64_t(prompts[r].size()));
        const Tensor first =
            model.next_token_logits(to_ids(prompts[r], 1), alone).to(Device::CPU).to(DType::F32);
        if (!take(r, choose(r, first, 0))) continue;
        cache.add_row(alone);
        live.push_back(r);
        cache_row.push_back(int64_t(live.size()) - 1);
        next_ids.push_back(grow[r].out.ids.back());
      }
      ids = to_ids(next_ids, int64_t(live.size()));
    }
  }
  std::vector<Generation> out;
  for (Growing& g : grow) out.push_back(std::move(g.out));
  return out;
}

namespace {

// transformers' PromptLookupCandidateGenerator: the tokens after the earliest earlier occurrence of
// the sequence's last n ids (n from max_matching_ngram_size down to 1, the first n with one), at most
// prompt_lookup_num_tokens and `most` of them, cut before the first stop id.
std::vector<int64_t> prompt_lookup_draft(const std::vector<int64_t>& sequence, const SamplingOptions& o,
                                         const std::vector<int64_t>& stop_ids, int64_t most) {
  const int64_t L = int64_t(sequence.size()), count = std::min(o.prompt_lookup_num_tokens, most);
  if (count <= 0) return {};
  for (int64_t n = std::min(o.max_matching_ngram_size, L - 1); n >= 1; --n) {
    const auto tail = sequence.end() - n;
    for (int64_t start = 0; start + n < L; ++start) {
      if (!std::equal(tail, sequence.end(), sequence.begin() + start)) continue;
      std::vector<int64_t> draft(sequence.begin() + start + n,
                                 sequence.begin() + std::min(L, start + n + count));
      for (size_t k = 0; k < draft.size(); ++k)
        if (std::find(stop_ids.begin(), stop_ids.end(), draft[k]) != stop_ids.end()) {
          draft.resize(k);
          break;
        }
      return draft;  // (cut to nothing by a stop id: no draft, as transformers)
    }
  }
  return {};
}

}  // namespace

GenerationSession::GenerationSession(Qwen3Model& model)
    : model_(model),
      cache_(model.kv_cache(1, model.args().max_seq_len)),
      weights_(std::make_unique<ComputeCopies>(model)) {}

GenerationSession::~GenerationSession() = default;

Generation GenerationSession::generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                       const SamplingOptions& options, const std::vector<int64_t>& stop_ids,
                                       const std::vector<bool>& allowed,
                                       const std::function<void(int64_t)>& on_token,
                                       const StopCheck& stop_check, bool logprobs) {
  const ModelArgs& a = model_.args();
  const StepRules rules(a, max_new_tokens, options, stop_ids, allowed, stop_check, logprobs);
  check_prompts(a, {prompt}, max_new_tokens);
  // The prompt's last token runs whatever the cache holds, for the logits of the first new one.
  const size_t shared = keep_shared(prompt, prompt.size() - 1);

  Growing g(prompt, options.seed);
  std::vector<int64_t> feed(prompt.begin() + ptrdiff_t(shared), prompt.end());
  // (Sampled, each row's token takes the stream's next number, as without drafts: a draft token is
  // kept when the draw gives it, and the first that differs is what the draw gave there.)
  const bool lookup = options.prompt_lookup_num_tokens > 0;
  for (;;) {
    // Prompt lookup: the draft runs after `feed` in the same pass; logits row j follows draft[0, j).
    const int64_t left = max_new_tokens - int64_t(g.out.ids.size());
    const std::vector<int64_t> draft =
        lookup ? prompt_lookup_draft(g.sequence, options, stop_ids, left - 1) : std::vector<int64_t>();
    std::vector<int64_t> run = feed;
    run.insert(run.end(), draft.begin(), draft.end());
    const int64_t rows = 1 + int64_t(draft.size());
    const Tensor ids = Tensor::from_vector(run, {1, int64_t(run.size())}).to(model_.device());
    const Tensor logits =
        (draft.empty() ? model_.next_token_logits(ids, cache_) : model_.cached_logits(ids, cache_, rows))
            .to(Device::CPU)
            .to(DType::F32);
    cached_.insert(cached_.end(), run.begin(), run.end());
    ++g.out.passes;
    g.out.drafted += int64_t(draft.size());
    // Greedy's token after each accepted draft token, until one differs from the draft (or ends).
    bool goes_on = true;
    int64_t id = -1;
    for (int64_t j = 0; j < rows; ++j) {
      id = rules.choose(
          g, std::span<const float>(logits.data<float>() + j * a.vocab_size, size_t(a.vocab_size)));
      goes_on = rules.take(g, id);
      if (on_token) on_token(id);
      const bool drafted = j < rows - 1 && id == draft[size_t(j)];
      g.out.accepted += drafted;
      if (!goes_on || !drafted) break;
    }
    // The cache keeps the sequence but its last token (the draft tokens taken are the ones it ran).
    const size_t keep = g.sequence.size() - 1;
    if (cached_.size() > keep) {
      cache_.truncate(int64_t(keep));
      cached_.resize(keep);
    }
    if (!goes_on) return std::move(g.out);
    feed = {id};
  }
}

Generation generate(Qwen3Model& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& options, const std::vector<int64_t>& stop_ids,
                    const std::vector<bool>& allowed, const std::function<void(int64_t)>& on_token,
                    const StopCheck& stop_check) {
  return GenerationSession(model).generate(prompt, max_new_tokens, options, stop_ids, allowed, on_token,
                                           stop_check);
}

void BeamSearchOptions::validate() const {
  TITAN_CHECK(num_beams >= 2, "beam search: num_beams must be >= 2 (one beam is greedy search), got ",
              num_beams);
  TITAN_CHECK(num_return_sequences >= 1 && num_return_sequences <= num_beams,
              "beam search: num_return_sequences must be in [1, num_beams = ", num_beams, "], got ",
              num_return_sequences);
  TITAN_CHECK(std::isfinite(length_penalty), "beam search: length_penalty must be finite, got ",
              precise(length_penalty));
}

namespace {

// One prompt's beam search as transformers keeps it (its -1e9 marks included, in double: a mark
// added to a score puts it behind every real one, a sum of log-probabilities being far above -1e9).
constexpr double kMark = -1.0e9;

struct Beam {
  std::vector<int64_t> ids;  // new tokens
  double score = 0;          // running: summed log-probabilities; finished: length-penalised
  bool finished = false;
};

class PromptSearch {
 public:
  // `seed`: the stream of beam sampling's draws (processors with a temperature > 0); its warpers keep
  // at least `min_tokens_to_keep` ids of each beam.
  PromptSearch(const std::vector<int64_t>& prompt, const BeamSearchOptions& o, uint64_t seed,
               size_t min_tokens_to_keep)
      : prompt_(prompt),
        o_(o),
        running_(size_t(o.num_beams)),
        finished_(size_t(o.num_beams)),
        rng_(seed),
        min_tokens_to_keep_(min_tokens_to_keep) {
    for (size_t b = 1; b < running_.size(); ++b) running_[b].score = kMark;  // only beam 0 begins: no copies
    for (Beam& f : finished_) f.score = kMark;
  }

  // Beam b's candidates' scores into out[0, V): its log-probabilities from `logits` (its row), shaped
  // by the processors (the repetition penalty multiplies those of the ids seen, all <= 0; the n-gram
  // rule bans, as transformers applies its processors to log-probabilities) and the step's `forcing`,
  // the ids `allowed` leaves out banned, log-softmaxed again with renormalize_logits, plus the beam's
  // score. A NaN logit is never chosen (the model diverged).
  template <typename T>
  void score_beam(int64_t b, const T* logits, int64_t V, const SamplingOptions& processors,
                  const std::vector<bool>& allowed, const StepForcing& forcing, double* out) const {
    constexpr double kNever = -std::numeric_limits<double>::infinity();
    std::vector<int64_t> sequence(prompt_);
    sequence.insert(sequence.end(), running_[size_t(b)].ids.begin(), running_[size_t(b)].ids.end());
    std::vector<bool> banned;
    if (!forcing.forced.empty()) {
      // A forced step: 0 for the forced ids, -inf for the others (as Candidates), suppress_tokens after.
      std::fill(out, out + V, kNever);
      for (int64_t id : forcing.forced) out[id] = 0;
      for (int64_t id : processors.suppress_tokens) out[id] = kNever;
    } else {
      const double log_z = log_sum_exp(std::span<const T>(logits, size_t(V)));
      for (int64_t v = 0; v < V; ++v) out[v] = std::isnan(logits[v]) ? kNever : double(logits[v]) - log_z;
      // The sequence bias first, as transformers (its ids were checked against the vocabulary).
      for (const auto& [id, bias] : sequence_biases(sequence, processors)) out[id] += double(bias);
      if (processors.repetition_penalty != 1) {
        std::vector<bool> seen(size_t(V), false);  // an id seen twice is penalised once
        for (int64_t id : sequence)
          if (!seen[size_t(id)]) {
            seen[size_t(id)] = true;
            const double l = out[id];
            out[id] = l < 0 ? l * processors.repetition_penalty : l / processors.repetition_penalty;
          }
      }
      for (int64_t id : forcing.boosted)  // exponential_decay_length_penalty (an id held back stays so)
        if (std::isfinite(out[id])) out[id] += std::fabs(out[id]) * forcing.boost;
      banned = banned_ids(sequence, processors, V);
    }
    for (int64_t v = 0; v < V; ++v)
      if ((!banned.empty() && banned[size_t(v)]) || (!allowed.empty() && !allowed[size_t(v)]))
        out[v] = kNever;
    if (processors.temperature > 0) warp(processors, min_tokens_to_keep_, out, V);
    if (processors.renormalize_logits) {  // transformers' LogitNormalization, the last processor
      const double log_z = log_sum_exp(std::span<const double>(out, size_t(V)));
      if (std::isfinite(log_z))
        for (int64_t v = 0; v < V; ++v) out[v] -= log_z;
    }
    for (int64_t v = 0; v < V; ++v) out[v] += running_[size_t(b)].score;
  }

  // One step from the candidates' scores [num_beams x V] after `t` new tokens. Returns whether the
  // search goes on; then `sources` (the beam each running beam extends) and `next_ids` (its new token).
  // `sampled`: beam sampling, whose K candidates are drawn instead of taken best first.
  bool advance(const std::vector<double>& total, int64_t V, int64_t t, int64_t max_new_tokens,
               const std::vector<int64_t>& stop_ids, const StopCheck& stop_check, bool sampled,
               std::vector<int64_t>& sources, std::vector<int64_t>& next_ids) {
    const int64_t nb = o_.num_beams;
    // The K best continuations, K enough that num_beams of them go on even when every beam's best are
    // stop ids (a tie: the lower beam, then the lower id, first). A stop check may end any of them:
    // then K doubles until num_beams go on (or every continuation is a candidate), so that a stopped
    // sequence never runs on in a beam's place.
    // Beam sampling (transformers' torch.multinomial over softmax(total) without replacement, K
    // draws in the order drawn): the K largest of total + Gumbel noise, whose order is that of
    // draws without replacement (the Gumbel-top-k trick), so K can grow by taking more of them.
    std::vector<double> noisy;
    if (sampled) {
      noisy.resize(total.size());
      for (size_t i = 0; i < total.size(); ++i) {
        const double u = (double(rng_() >> 12) + 0.5) * 0x1.0p-52;  // in (0, 1): 1 - 2^-53 at most
        noisy[i] = std::isinf(total[i]) ? total[i] : total[i] - std::log(-std::log(u));
      }
    }
    const std::vector<double>& key = sampled ? noisy : total;
    const auto higher = [&](int64_t x, int64_t y) {
      return key[size_t(x)] > key[size_t(y)] || (key[size_t(x)] == key[size_t(y)] && x < y);
    };
    int64_t K = std::min(nb * V, std::max<int64_t>(2, 1 + int64_t(stop_ids.size())) * nb);
    std::vector<int64_t> best;
    std::vector<Beam> candidates;
    std::vector<int64_t> source;
    std::vector<bool> hits;
    int64_t going = 0;  // candidates that did not stop
    for (;;) {
      best.clear();  // one pass keeping the K best seen in a heap whose top is the worst of them
      best.reserve(size_t(K) + 1);
      for (int64_t i = 0; i < nb * V; ++i) {
        if (int64_t(best.size()) == K) {
          if (!higher(i, best.front())) continue;
          std::pop_heap(best.begin(), best.end(), higher);
          best.pop_back();
        }
        best.push_back(i);
        std::push_heap(best.begin(), best.end(), higher);
      }
      std::sort_heap(best.begin(), best.end(), higher);  // best first
      candidates.assign(size_t(K), Beam{});
      source.assign(size_t(K), 0);
      hits.assign(size_t(K), false);
      going = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t b = best[size_t(j)] / V, id = best[size_t(j)] % V;
        Beam& c = candidates[size_t(j)];
        c.ids = running_[size_t(b)].ids;
        c.ids.push_back(id);
        c.score = total[size_t(best[size_t(j)])];
        source[size_t(j)] = b;
        hits[size_t(j)] = t + 1 == max_new_tokens ||
                          std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end() ||
                          (stop_check && stop_check(c.ids));
        going += !hits[size_t(j)];
      }
      if (going >= nb || K == nb * V || t + 1 == max_new_tokens) break;
      K = std::min(nb * V, 2 * K);
    }
    const bool all_hit = going == 0;
    // The num_beams best candidates that did not stop run on.
    std::vector<double> go_on(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j)
      go_on[size_t(j)] = candidates[size_t(j)].score + (hits[size_t(j)] ? kMark : 0);
    std::vector<int64_t> next(static_cast<size_t>(K));
    std::iota(next.begin(), next.end(), int64_t(0));
    std::stable_sort(next.begin(), next.end(),
                     [&](int64_t x, int64_t y) { return go_on[size_t(x)] > go_on[size_t(y)]; });
    // Finished: those among the num_beams best that stopped, length-penalised, unless the search has
    // no room left (early_stopping true with num_beams finished) or cannot improve; the best
    // num_beams of the finished so far and these are kept.
    // A finished sequence ranks by its score among the finished, and every finished one above every
    // empty slot: transformers ranks them by score alone, against empty slots scored -1e9, so a
    // score below -1e9 (a length penalty of -6 over 24 tokens) lost its place to an empty slot.
    const bool take = !(all_finished() && o_.early_stopping == EarlyStopping::Always) && may_improve_;
    std::vector<Beam> merged = finished_;
    for (int64_t j = 0; j < K; ++j) {
      Beam f = candidates[size_t(j)];
      f.finished = take && hits[size_t(j)] && j < nb;
      f.score = penalised(f.score, t + 1) + (f.finished ? 0 : kMark);
      merged.push_back(std::move(f));
    }
    std::stable_sort(merged.begin(), merged.end(), [](const Beam& x, const Beam& y) {
      return x.finished != y.finished ? x.finished : x.score > y.score;
    });
    merged.resize(size_t(nb));
    finished_ = std::move(merged);
    sources.assign(size_t(nb), 0);
    next_ids.assign(size_t(nb), 0);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t j = next[size_t(b)];
      running_[size_t(b)] = candidates[size_t(j)];
      running_[size_t(b)].score = go_on[size_t(j)];
      sources[size_t(b)] = source[size_t(j)];
      next_ids[size_t(b)] = running_[size_t(b)].ids.back();
    }
    // Whether the running beams could still make the finished ones better: while a slot is empty, or
    // while the best running one, scored at its length now (early_stopping false) or, for "never"
    // with a positive length penalty, at the longest it may grow, beats the worst finished one; once
    // not, never again.
    const int64_t length =
        o_.early_stopping == EarlyStopping::Never && o_.length_penalty > 0 ? max_new_tokens : t + 1;
    const double best_possible = penalised(running_[0].score, length);
    double worst = std::numeric_limits<double>::infinity();
    for (const Beam& f : finished_) worst = std::min(worst, f.score);
    may_improve_ = may_improve_ && (!all_finished() || best_possible > worst);
    return may_improve_ && !(all_finished() && o_.early_stopping == EarlyStopping::Always) && !all_hit;
  }

  // The best num_return_sequences finished sequences, best first, each with its score.
  std::vector<Generation> result(const std::vector<int64_t>& stop_ids, const StopCheck& stop_check,
                                 double seconds) const {
    std::vector<Generation> out;
    for (int64_t r = 0; r < o_.num_return_sequences && finished_[size_t(r)].finished; ++r) {
      const Beam& f = finished_[size_t(r)];
      Generation g;
      g.ids = f.ids;
      g.stop_reason = std::find(stop_ids.begin(), stop_ids.end(), f.ids.back()) != stop_ids.end()
                          ? "stop token"
                      : stop_check && stop_check(f.ids) ? "stop string"
                                                        : "max new tokens";
      g.seconds = seconds;
      g.score = f.score;
      out.push_back(std::move(g));
    }
    return out;
  }

 private:
  double penalised(double score, int64_t length) const {
    return score / std::pow(double(length), o_.length_penalty);
  }
  bool all_finished() const {
    return std::all_of(finished_.begin(), finished_.end(), [](const Beam& f) { return f.finished; });
  }

  // Beam sampling's warpers on one beam's processed log-probabilities out[0, V), as transformers
  // applies them there: divided by the temperature, -inf for the ids that top-k, top-p, min-p,
  // typical-p, epsilon or eta cut (the sampler's own rules on an f32 copy), each keeping at least
  // `min_keep` ids (transformers' min_tokens_to_keep in beam sampling: max(2, 1 + stop ids)).
  static void warp(const SamplingOptions& processors, size_t min_keep, double* out, int64_t V) {
    if (std::none_of(out, out + V, [](double x) { return std::isfinite(x); })) return;  // nothing to keep
    SamplingOptions warpers;
    warpers.temperature = processors.temperature;
    warpers.top_k = processors.top_k;
    warpers.top_p = processors.top_p;
    warpers.min_p = processors.min_p;
    warpers.typical_p = processors.typical_p;
    warpers.epsilon_cutoff = processors.epsilon_cutoff;
    warpers.eta_cutoff = processors.eta_cutoff;
    const std::vector<float> row(out, out + V);
    std::vector<bool> kept(size_t(V), false);
    const Candidates candidates(row, warpers, {}, {}, {});
    for (const auto& [id, p] : warped_distribution(candidates, warpers, min_keep)) kept[size_t(id)] = true;
    for (int64_t v = 0; v < V; ++v)
      out[v] = kept[size_t(v)] ? out[v] / processors.temperature : -std::numeric_limits<double>::infinity();
  }

  const std::vector<int64_t>& prompt_;
  const BeamSearchOptions& o_;
  std::vector<Beam> running_, finished_;
  bool may_improve_ = true;  // transformers' is_early_stop_heuristic_unsatisfied
  std::mt19937_64 rng_;      // beam sampling's draws
  size_t min_tokens_to_keep_;
};

}  // namespace

std::vector<std::vector<Generation>> beam_search_batch(
    Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
    const BeamSearchOptions& o, const SamplingOptions& processors, const std::vector<int64_t>& stop_ids_given,
    const std::vector<bool>& allowed, int64_t batch_size,
    const std::function<void(size_t, const std::vector<Generation>&)>& on_done, const StopCheck& stop_check) {
  o.validate();
  processors.validate();
  // Each stop id once: their count sets how many candidates a step keeps (a caller may list an id
  // twice, as the tokenizer's eos and the config's eos_token_id).
  std::vector<int64_t> stop_ids = stop_ids_given;
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  const bool sampled = processors.temperature > 0;  // beam sampling
  TITAN_CHECK(batch_size >= 0, "beam search: batch_size must be >= 0 (0: every prompt at once), got ",
              batch_size);
  const ModelArgs& a = model.args();
  const int64_t V = a.vocab_size, nb = o.num_beams;
  check_prompts(a, prompts, max_new_tokens);
  TITAN_CHECK(allowed.empty() || int64_t(allowed.size()) == V, "beam search: ", allowed.size(),
              " allowed flags for a vocabulary of ", V);
  const SamplingOptions applied = without_stop_words(processors, stop_ids);
  applied.validate(V);
  const StepMasks masks(allowed, stop_ids, applied, V, max_new_tokens);
  const auto start = std::chrono::steady_clock::now();
  const ComputeCopies weights(model);
  const size_t n = prompts.size(), width = batch_size > 0 ? std::min(n, size_t(batch_size)) : n;
  std::vector<std::vector<Generation>> out(n);
  for (size_t first = 0; first < n; first += width) {
    // The batch's prompts, the shorter left-padded as generate_batch pads them; each prompt's row
    // becomes its num_beams beams' rows once the prompts have run.
    std::vector<size_t> live;  // the prompts still searching, in row-block order
    for (size_t r = first; r < std::min(n, first + width); ++r) live.push_back(r);
    int64_t longest = 0;
    for (size_t r : live) longest = std::max(longest, int64_t(prompts[r].size()));
    std::vector<int64_t> padding, first_ids, expand;
    for (size_t k = 0; k < live.size(); ++k) {
      const std::vector<int64_t>& prompt = prompts[live[k]];
      padding.push_back(longest - int64_t(prompt.size()));
      first_ids.insert(first_ids.end(), size_t(padding.back()), prompt[0]);
      first_ids.insert(first_ids.end(), prompt.begin(), prompt.end());
      expand.insert(expand.end(), size_t(nb), int64_t(k));
    }
    const bool padded = std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p > 0; });
    KVCache cache = model.kv_cache(int64_t(live.size()), longest + max_new_tokens,
                                   padded ? padding : std::vector<int64_t>());
    Tensor logits =
        model
            .next_token_logits(
                Tensor::from_vector(first_ids, {int64_t(live.size()), longest}).to(model.device()), cache)
            .to(Device::CPU);   // f64 for an f64 model, else f32: read as they are
    cache.select_rows(expand);  // every beam holds its prompt
    std::vector<PromptSearch> searches;
    searches.reserve(live.size());
    for (size_t r : live)
      searches.emplace_back(prompts[r], o, processors.seed + r, std::max<size_t>(2, 1 + stop_ids.size()));
    // Row of beam b of the k-th live prompt in `logits`: one per prompt after the prompts' pass.
    int64_t rows_per_prompt = 1;
    // The candidates' scores of the k-th live prompt: num_beams x V (allocated once: a page-faulting
    // fresh buffer per step cost more than the scoring).
    std::vector<std::vector<double>> totals(live.size(), std::vector<double>(size_t(nb * V)));
    for (int64_t t = 0; !live.empty(); ++t) {
      const int64_t L = int64_t(live.size());
      // (An error cannot leave an OpenMP region: it is carried out and raised after it.)
      const double* f64 = logits.dtype() == DType::F64 ? logits.data<double>() : nullptr;
      const float* f32 = f64 ? nullptr : logits.data<float>();
      std::vector<std::exception_ptr> failed(static_cast<size_t>(L * nb));
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t k = 0; k < L; ++k)
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t row = k * rows_per_prompt + (rows_per_prompt == 1 ? 0 : b);
          double* out = totals[size_t(k)].data() + b * V;
          const int64_t prompt_length = int64_t(prompts[live[size_t(k)]].size());
          const std::vector<bool>& may_take = masks.at(prompt_length, t);
          const StepForcing forcing = masks.forcing(prompt_length, t);
          try {
            if (f64)
              searches[size_t(k)].score_beam(b, f64 + row * V, V, applied, may_take, forcing, out);
            else
              searches[size_t(k)].score_beam(b, f32 + row * V, V, applied, may_take, forcing, out);
          } catch (...) {
            failed[size_t(k * nb + b)] = std::current_exception();
          }
        }
      for (const std::exception_ptr& e : failed)
        if (e) std::rethrow_exception(e);
      std::vector<std::vector<int64_t>> sources(static_cast<size_t>(L)), ids(static_cast<size_t>(L));
      std::vector<char> going_on(static_cast<size_t>(L));
      std::vector<std::exception_ptr> stuck(static_cast<size_t>(L));
#pragma omp parallel for schedule(dynamic, 1) if (L > 1)
      for (int64_t k = 0; k < L; ++k) {
        try {
          going_on[size_t(k)] =
              searches[size_t(k)].advance(totals[size_t(k)], V, t, max_new_tokens, stop_ids, stop_check,
                                          sampled, sources[size_t(k)], ids[size_t(k)]);
        } catch (...) {  // a stop check's decode, say
          stuck[size_t(k)] = std::current_exception();
        }
      }
      for (const std::exception_ptr& e : stuck)
        if (e) std::rethrow_exception(e);
      std::vector<int64_t> rows, next_ids;
      std::vector<size_t> still;
      std::vector<PromptSearch> going;
      for (int64_t k = 0; k < L; ++k) {
        if (going_on[size_t(k)]) {
          for (int64_t s : sources[size_t(k)]) rows.push_back(k * nb + s);
          next_ids.insert(next_ids.end(), ids[size_t(k)].begin(), ids[size_t(k)].end());
          still.push_back(live[size_t(k)]);
          going.push_back(std::move(searches[size_t(k)]));
          continue;
        }
        const size_t r = live[size_t(k)];
        out[r] = searches[size_t(k)].result(
            stop_ids, stop_check,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (on_done) on_done(r, out[r]);
      }
      live = std::move(still);
      searches = std::move(going);
      if (live.empty()) break;
      cache.select_rows(rows);  // each running beam's row: the one of the beam it extends
      logits = model
                   .next_token_logits(
                       Tensor::from_vector(next_ids, {int64_t(next_ids.size()), 1}).to(model.device()), cache)
                   .to(Device::CPU);
      rows_per_prompt = nb;
    }
  }
  return out;
}

std::vector<Generation> beam_search(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                    int64_t max_new_tokens, const BeamSearchOptions& beams,
                                    const SamplingOptions& processors, const std::vector<int64_t>& stop_ids,
                                    const std::vector<bool>& allowed) {
  return beam_search_batch(model, {prompt}, max_new_tokens, beams, processors, stop_ids, allowed)[0];
}

ContinuationScore GenerationSession::score(const std::vector<int64_t>& prompt,
                                           const std::vector<int64_t>& continuation) {
  TITAN_CHECK(!continuation.empty(), "score_continuation: the continuation holds no token");
  TITAN_CHECK(!prompt.empty(),
              "score_continuation: the prompt holds no token (the first token has no context)");
  // Prompt ids of the vocabulary, and prompt + continuation within max_seq_len (the continuation's
  // last token is read, never run).
  check_prompts(model_.args(), {prompt}, int64_t(continuation.size()));
  const int64_t V = model_.args().vocab_size;
  for (size_t j = 0; j < continuation.size(); ++j)
    TITAN_CHECK(continuation[j] >= 0 && continuation[j] < V, "score_continuation: continuation token ", j,
                " is id ", continuation[j], ", outside the model's vocabulary [0, ", V, ")");
  std::vector<int64_t> whole = prompt;
  whole.insert(whole.end(), continuation.begin(), continuation.end());
  // Continuation token j's logits are those after prompt + its first j tokens: positions P - 1 ..
  // P + k - 2 of `whole`, run from the first position the cache does not share (at most P - 1).
  const size_t P = prompt.size(), k = continuation.size();
  const size_t shared = keep_shared(whole, P - 1);
  // At most 256 positions' logits at a time: a long continuation's [k, V] would be gigabytes.
  constexpr size_t kLogitRows = 256;
  ContinuationScore out;
  for (size_t from = shared; from < P + k - 1;) {
    const size_t to = std::min(P + k - 1, std::max(from + 1, P - 1 + out.logprobs.size() + kLogitRows));
    const int64_t last = int64_t(to - std::max(from, P - 1));
    const std::vector<int64_t> feed(whole.begin() + ptrdiff_t(from), whole.begin() + ptrdiff_t(to));
    const Tensor logits =
        model_
            .cached_logits(Tensor::from_vector(feed, {1, int64_t(feed.size())}).to(model_.device()), cache_,
                           last)
            .to(Device::CPU);  // f64 for an f64 model, else f32
    cached_.insert(cached_.end(), feed.begin(), feed.end());
    for (int64_t r = 0; r < last; ++r) {
      const int64_t id = continuation[out.logprobs.size()];
      auto read = [&](const auto* values) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(values)>>;
        const std::span<const T> row(values + r * V, size_t(V));
        out.logprobs.push_back(log_probability<T>(row, id));
        out.greedy = out.greedy && std::max_element(row.begin(), row.end()) - row.begin() == id;
      };
      if (logits.dtype() == DType::F64)
        read(logits.data<double>());
      else
        read(logits.data<float>());
    }
    from = to;
  }
  return out;
}

size_t GenerationSession::keep_shared(const std::vector<int64_t>& ids, size_t most) {
  size_t shared = 0;
  while (shared < most && shared < cached_.size() && cached_[shared] == ids[shared]) ++shared;
  cache_.truncate(int64_t(shared));
  cached_.resize(shared);
  reused_ = int64_t(shared);
  return shared;
}

ContinuationScore score_continuation(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                     const std::vector<int64_t>& continuation) {
  return GenerationSession(model).score(prompt, continuation);
}

}  // namespace titan::qwen3
