#pragma once
// Text generation from a model: the prompt runs through the decoder once, then each new token
// alone (with prompt lookup decoding, with the tokens drafted after it), attending over the keys and
// values cached for the tokens before it (Qwen3Model's KVCache,
// ops::cached_attention); the next token comes from the last position's logits, greedy or sampled,
// shaped as transformers' logits processors shape them (sequence bias, repetition penalty, no
// repeated n-grams, bad words, min new tokens / min length, forced bos / eos ids, the exponential
// length decay, suppressed ids; then temperature, top-k, top-p, min-p, typical-p, epsilon, eta when
// sampling). (torchtitan's scripts/generate reruns the whole sequence for
// every token; the tests hold the cached steps to that full forward's logits.) `titan generate` is the
// command around it.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (the largest logit, the lowest id on a tie)
  int64_t top_k = 0;         // 0: no limit; else only the k most likely ids (ties: lower ids first)
  double top_p = 1.0;        // nucleus: the most likely ids whose probabilities reach top_p
  // min-p: only ids at least min_p times as likely as the most likely one (0: no limit).
  double min_p = 0.0;
  // Locally typical sampling (Meister et al.): the ids whose surprise -log p is closest to the
  // distribution's entropy, as many as reach mass typical_p (1: no limit).
  double typical_p = 1.0;
  // Epsilon sampling (Hewitt et al.): only ids at least this likely, the most likely always kept
  // (0: no limit).
  double epsilon_cutoff = 0.0;
  // Eta sampling: as epsilon, with the cut min(eta, sqrt(eta) * exp(-H)) for H the entropy of the
  // distribution (0: no limit).
  double eta_cutoff = 0.0;
  // transformers' repetition_penalty, applied first, greedy or sampled: every id already in the
  // sequence (prompt and new tokens) has its logit divided by it when positive, multiplied when
  // negative (1: none; above 1 discourages repeats).
  double repetition_penalty = 1.0;
  // transformers' no_repeat_ngram_size n, greedy or sampled: an id that would complete an n-gram
  // already in the sequence is never chosen (0: no limit).
  int64_t no_repeat_ngram_size = 0;
  // transformers' min_new_tokens, greedy, sampled or in beam search: before this many new tokens the
  // stop ids are never chosen (0: none).
  int64_t min_new_tokens = 0;
  // transformers' min_length, greedy, sampled or in beam search: the stop ids held back until the
  // prompt and the new tokens together reach it (0: none). (transformers counts a batch's left
  // padding too; titan counts each prompt's own ids, so a prompt's text does not depend on its batch.)
  int64_t min_length = 0;
  // transformers' bad_words_ids, greedy, sampled or in beam search: a one-id entry is never chosen; a
  // longer entry's last id is never chosen right after its other ids (the prompt counts). An entry
  // that is a stop id alone is dropped, as transformers drops the eos ids.
  std::vector<std::vector<int64_t>> bad_words_ids;
  // transformers' sequence_bias: each entry's bias is added to its last id's logit (a log-probability
  // in beam search) where its other ids end the sequence so far (a one-id entry: always), first of the  //
  // processors (before the repetition penalty); entries of other ids ending in one id add up, and an entry
  // whose ids come again counts once with the last bias (transformers keeps them in a dict).
  std::vector<std::pair<std::vector<int64_t>, double>> sequence_bias;
  // transformers' suppress_tokens (never chosen) and begin_suppress_tokens (never the first new token).
  std::vector<int64_t> suppress_tokens, begin_suppress_tokens;
  // transformers' forced_bos_token_id (-1: none) and forced_eos_token_id (empty: none), greedy,
  // sampled or in beam search: the first new token after a one-id prompt (transformers forces it at
  // sequence length 1) is forced_bos_token_id, and the last new token max_new_tokens allows is one
  // of forced_eos_token_ids: their logits 0, every other id's -inf, in place of the processors
  // before them (the bias, the penalty, the bad words, the n-gram rule, min_new_tokens /
  // min_length); suppress_tokens, begin_suppress_tokens and the tokenizer's ids still apply (a
  // forced bos token moves begin_suppress_tokens to the token after it, as transformers does).
  int64_t forced_bos_token_id = -1;
  std::vector<int64_t> forced_eos_token_ids;
  // transformers' exponential_decay_length_penalty (start, factor): after t > start new tokens, each
  // stop id's logit l (as the processors before leave it) becomes l + |l| * (factor^(t - start) - 1),
  // in f32 as transformers computes it (factor 1: none). A stop id banned or held back stays so
  // (transformers' -inf + |-inf| (factor^k - 1) is NaN for a factor above 1).
  int64_t length_decay_start = 0;
  double length_decay_factor = 1.0;
  // transformers' renormalize_logits: beam search's processed log-probabilities are log-softmaxed
  // again before they add to the beams' scores. (Greedy and sampled choices do not change with it.)
  bool renormalize_logits = false;
  // transformers' prompt lookup decoding (prompt_lookup_num_tokens, max_matching_ngram_size), greedy
  // or sampled (generate_batch then runs its prompts one at a time): each step drafts up to this many
  // tokens, those that followed the earliest earlier occurrence of the sequence's last n-gram (n from
  // max_matching_ngram_size down to 1; cut before a stop id), runs them through the model in one pass
  // with the step's token, and keeps those the search would have chosen (sampled: each position's
  // draw takes the stream's next number, as without drafts), and the search's next token after them.
  // The same tokens as without, for the same seed (up to the rounding of a pass over several
  // positions barring near-ties: the f64 checks give the same tokens), in fewer passes where the
  // text repeats itself. 0: none. Beam search drafts nothing (the command refuses the flag there).
  int64_t prompt_lookup_num_tokens = 0;
  int64_t max_matching_ngram_size = 2;
  uint64_t seed = 0;         // the sampler's random stream (the same seed gives the same text)

  // Names the field and the rule: temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p
  // in [0, 1], typical_p in (0, 1], epsilon_cutoff and eta_cutoff in [0, 1), repetition_penalty
  // finite and > 0, no_repeat_ngram_size >= 0, min_new_tokens >= 0, min_length >= 0; bad words and
  // biased sequences not empty, biases finite; length_decay_start >= 0, length_decay_factor finite
  // and > 0; with `vocab` > 0 every id of the id lists (and forced_bos_token_id, unless -1) inside
  // [0, vocab).
  void validate(int64_t vocab = 0) const;
};

// How likely the model finds `continuation` after `prompt` (lm-eval-harness' loglikelihood request):
// each continuation token's log-probability (the log-softmax of the logits at its position, before
// any processor), teacher-forced (prompt and continuation in one pass over a KV cache, GenerationSession),
// and whether every one was the most likely id there (is_greedy; the lowest id on a tie). Both hold at
// least one id of the vocabulary, and together fit max_seq_len.
struct ContinuationScore {
  std::vector<double> logprobs;
  bool greedy = true;
};
ContinuationScore score_continuation(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                     const std::vector<int64_t>& continuation);

// transformers' early_stopping for beam search: when the search may stop before max_new_tokens.
enum class EarlyStopping {
  Heuristic,  // false (transformers' default): once no running beam, scored at its current length,
              // would beat the worst of num_beams finished sequences
  Always,     // true: as soon as num_beams sequences have finished
  Never,      // "never": once none could, at the best length it may reach (the canonical search)
};

struct BeamSearchOptions {
  int64_t num_beams = 1;  // 1: no beam search (greedy or sampled generation)
  // Finished sequences are ranked by score / (new tokens)^length_penalty: > 0 favours longer ones.
  double length_penalty = 1.0;
  EarlyStopping early_stopping = EarlyStopping::Heuristic;
  int64_t num_return_sequences = 1;  // the best this many, at most num_beams

  // For beam_search. Names the field and the rule: num_beams >= 2 (one beam is greedy search),
  // num_return_sequences in [1, num_beams], length_penalty finite.
  void validate() const;
};

// The sampling a transformers generation_config.json asks for when generate is given none, as
// transformers' generate applies it: greedy unless do_sample is true, then its temperature, top_k,
// top_p, min_p, typical_p, epsilon_cutoff and eta_cutoff, with transformers' defaults (1.0, 50, 1.0,
// none, 1.0, 0, 0) for those absent and null as "no limit"; its repetition_penalty,
// no_repeat_ngram_size and min_new_tokens either way (logits processors, not sampling settings), and
// its max_new_tokens (0 when absent: the caller's) and stop_strings; and without do_sample, its
// beam search: num_beams, length_penalty, early_stopping, num_return_sequences (defaults 1, 1.0,
// false, 1; with do_sample and one beam, num_return_sequences is the samples of a prompt; with
// several, beam sampling). The other processors
// (sequence_bias, bad_words_ids, suppress_tokens, begin_suppress_tokens, min_length,
// forced_bos_token_id, forced_eos_token_id, exponential_decay_length_penalty, renormalize_logits)
// go to `sampling` either way. `not_applied` names the keys it sets that titan has no counterpart for
// (num_beam_groups, penalty_alpha and the other processors titan does not have), for the caller to
// say. An ill-typed value is an error naming `where` and the
// key.
struct GenerationDefaults {
  SamplingOptions sampling;  // seed 0
  bool samples = false;      // do_sample
  BeamSearchOptions beams;   // num_beams 1: none
  int64_t max_new_tokens = 0;  // 0: not set
  std::vector<std::string> stop_strings;  // stop_strings (a string or a list of them)
  std::vector<std::string> not_applied;
};
GenerationDefaults generation_defaults(const nlohmann::json& generation_config, const std::string& where);

// What a step's place in the generation adds to the processors (StepMasks::forcing): the ids it is
// forced to (forced_bos_token_id, forced_eos_token_ids: their logits 0, every other id banned) and
// the boost of the stop ids' logits (exponential_decay_length_penalty: l + |l| * boost).
struct StepForcing {
  std::span<const int64_t> forced;   // empty: none
  std::span<const int64_t> boosted;  // the stop ids
  double boost = 0;                  // 0: none
};

// The ids the next token may be and their probabilities (above 0, summing to 1, most likely first, a
// tie lower id first), from one row of logits as transformers' processors and warpers shape them, in
// its order: sequence bias, repetition penalty, no repeated n-gram, bad words, forced ids, the
// stop ids' length boost, suppressed ids, then (sampling) temperature, top-k, top-p, min-p,
// typical-p, epsilon, eta. Greedy (temperature 0): the one most likely id. `allowed` (empty: every
// id) marks the ids that may be chosen; an id outside it is never a candidate (a tokenizer's
// unknown ids: the embedding's padding), nor is a NaN logit. `sequence`: the ids so far (prompt and
// new tokens), which the repetition penalty and the n-gram rule read. `forcing`: the step's.
std::vector<std::pair<int64_t, double>> next_token_distribution(std::span<const float> logits,
                                                                const SamplingOptions& options,
                                                                const std::vector<bool>& allowed = {},
                                                                std::span<const int64_t> sequence = {},
                                                                const StepForcing& forcing = {});

// log softmax(logits)[id] over the logits that are not NaN (a NaN one's is -inf; a +inf logit takes
// the mass, shared among those that hold it; every logit -inf shares it evenly): the model's own
// log-probability of `id` before any processor, as --logprobs and scoring report it. f32 exponentials
// on vectors, about 1e-7 relative of the f64 value.
double token_log_probability(std::span<const float> logits, int64_t id);

// transformers' no_repeat_ngram_size rule: flags over the vocabulary for the ids that would complete
// an n-gram already in `sequence` (empty when none can: n = 0, or a sequence shorter than n - 1).
std::vector<bool> repeated_ngram_ids(std::span<const int64_t> sequence, int64_t n, int64_t vocab);

// The ids the next token may not be after `sequence` (prompt and new tokens), whatever the step: the
// n-gram rule, the bad words (SamplingOptions::bad_words_ids) and suppress_tokens. Flags over the
// vocabulary; empty when none is banned.
std::vector<bool> banned_ids(std::span<const int64_t> sequence, const SamplingOptions& options,
                             int64_t vocab);

// `options` less the bad words that are one stop id alone (transformers drops its eos ids from
// bad_words_ids): what a generation with these stop ids applies.
SamplingOptions without_stop_words(const SamplingOptions& options, const std::vector<int64_t>& stop_ids);

// SamplingOptions::sequence_bias after `sequence`: (id, bias) for each id with a bias, the biases of
// the entries ending in it summed in f32 as transformers sums them (one-id entries first), in id order.
std::vector<std::pair<int64_t, float>> sequence_biases(std::span<const int64_t> sequence,
                                                       const SamplingOptions& options);

// The ids a step may choose among, by what kind of step it is: `allowed` (empty: every id); less the
// stop ids while min_new_tokens or min_length hold them back (unless the step is forced); less
// begin_suppress_tokens at the first new token. And what the step's place forces (forced_bos_token_id,
// forced_eos_token_ids at new token max_new_tokens) or boosts (exponential_decay_length_penalty).
// Built once per generation.
class StepMasks {
 public:
  StepMasks(const std::vector<bool>& allowed, const std::vector<int64_t>& stop_ids,
            const SamplingOptions& options, int64_t vocab, int64_t max_new_tokens = 0);
  // The mask of step t (t new tokens so far) after a prompt of `prompt_length` ids (empty: every id).
  const std::vector<bool>& at(int64_t prompt_length, int64_t t) const;
  // The forced ids and the stop ids' boost of that step (views of this object's lists).
  StepForcing forcing(int64_t prompt_length, int64_t t) const;

 private:
  bool forced_eos(int64_t t) const { return !forced_eos_.empty() && t + 1 == max_new_tokens_; }
  bool forced_bos(int64_t prompt_length, int64_t t) const {
    return !forced_bos_.empty() && prompt_length == 1 && t == 0;
  }

  int64_t min_new_tokens_, min_length_, max_new_tokens_, decay_start_;
  double decay_factor_;
  std::vector<int64_t> stop_ids_, forced_eos_, forced_bos_;  // forced_bos_: none or the one id
  bool begin_ = false;             // begin_suppress_tokens has ids
  std::vector<bool> masks_[2][2];  // [stop ids held back][first new token]
};

// The next token: a draw from next_token_distribution (one uniform number of `rng`).
int64_t pick_next_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng,
                        const std::vector<bool>& allowed = {}, std::span<const int64_t> sequence = {},
                        const StepForcing& forcing = {});

struct Generation {
  std::vector<int64_t> ids;  // the new tokens only (the stop token included when one ended it)
  std::string stop_reason;   // "stop token", "stop string" (a StopCheck) or "max new tokens"
  double seconds = 0;        // wall time of the new tokens
  // Beam search only: the sequence's score, the sum of its tokens' log-probabilities (as the
  // processors left them) divided by (new tokens)^length_penalty.
  std::optional<double> score;
  // BatchOptions::logprobs: each new token's log-probability under the model (the log-softmax of
  // its logits, before any processor or sampling setting shaped them).
  std::vector<double> logprobs;
  // Prompt lookup decoding only (SamplingOptions::prompt_lookup_num_tokens): tokens drafted, and
  // those of them kept; passes through the model.
  int64_t drafted = 0, accepted = 0, passes = 0;
};

// Up to `max_new_tokens` tokens after `prompt` (ids in the model's vocabulary, at least one);
// stops after a token in `stop_ids` (or one `stop_check` accepts). prompt + new tokens must fit the
// model's max_seq_len.
// `on_token` (if set) is called with each new token as soon as it is chosen (streaming output).
// Sampling draws from a stream seeded options.seed.
// Whether a sequence's new tokens so far end it, besides its stop ids (e.g. a stop string in their
// text); called after every new token, from several threads at once in beam search.
using StopCheck = std::function<bool(const std::vector<int64_t>& new_ids)>;

Generation generate(Qwen3Model& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& options, const std::vector<int64_t>& stop_ids,
                    const std::vector<bool>& allowed = {}, const std::function<void(int64_t)>& on_token = {},
                    const StopCheck& stop_check = {});

// Generations that continue one sequence across calls over one KV cache (batch 1): an interactive
// chat, each turn's prompt the whole conversation so far. A call's prompt is compared with the ids
// the cache holds (the previous call's prompt and the tokens generated after it, all but the last):
// the positions they share at the start are not run again, the cache drops those after them
// (KVCache::truncate), and the rest of the prompt runs over it. Each call gives what generate()
// gives the same prompt with the same arguments, up to the rounding of a prompt fed in pieces (exact
// in f64). The cache grows to the model's max_seq_len at most.
class ComputeCopies;

class GenerationSession {
 public:
  // While the session lives, the model's weights are read as they were at its start (a compute dtype
  // other than theirs reads copies cast once, ComputeCopies): no training in between.
  explicit GenerationSession(Qwen3Model& model);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;
  // As generate(); `logprobs` fills the Generation's logprobs.
  Generation generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                      const SamplingOptions& options, const std::vector<int64_t>& stop_ids,
                      const std::vector<bool>& allowed = {},
                      const std::function<void(int64_t)>& on_token = {}, const StopCheck& stop_check = {},
                      bool logprobs = false);
  // score_continuation over the session's cache: the positions prompt + continuation share at the
  // start with what the cache holds are not run again (the choices of a multiple-choice question
  // share the question), and the rest runs in passes of up to 256 scored positions.
  ContinuationScore score(const std::vector<int64_t>& prompt, const std::vector<int64_t>& continuation);
  // The last call's positions taken from the cache (0 before the first call).
  int64_t reused() const { return reused_; }

 private:
  // Keeps the cached positions `ids` starts with, at most `most` of them, and drops the rest; returns
  // how many.
  size_t keep_shared(const std::vector<int64_t>& ids, size_t most);

  Qwen3Model& model_;
  KVCache cache_;
  std::vector<int64_t> cached_;  // the ids whose keys and values the cache holds
  int64_t reused_ = 0;
  std::unique_ptr<ComputeCopies> weights_;
};

// How generate_batch runs its prompts and reports them.
struct BatchOptions {
  // Prompts generating at once, as the rows of one batch (0: all of them). (Prompt lookup decoding
  // runs them one at a time.)
  int64_t batch_size = 0;
  // Prompt i samples from a stream seeded seeds[i] (empty: SamplingOptions::seed + i).
  std::vector<uint64_t> seeds;
  std::function<void(size_t, int64_t)> on_token;           // prompt i's new token, as it is chosen
  std::function<void(size_t, const Generation&)> on_done;  // prompt i has stopped
  StopCheck stop_check;  // (if set) a prompt whose new tokens it accepts stops, with reason "stop string"
  bool logprobs = false;  // fill each Generation's logprobs
};

// generate() for several prompts: each step runs the prompts generating as the rows of one batch
// through the model, at most batch_size of them (the prompts' lengths differ: the shorter are
// left-padded, as transformers pads a batch, and the padding is never attended to, KVCache). Each
// prompt stops on its own and leaves the batch; at the next step its row goes to the first prompt
// waiting whose length the batch's position has reached (continuous batching: its prompt runs
// alone, then its keys and values join the batch right-aligned), while the batch has room for its
// new tokens before max_seq_len; a prompt no row takes waits for a later step or the next batch. Prompt i
// samples from its own stream, so its tokens are those generate() gives it alone with that seed, up to the
// rounding of batched matrix products (exact in f64). The longest prompt + max_new_tokens must fit
// max_seq_len. Each Generation's seconds run from the call's start to that prompt's last token.
std::vector<Generation> generate_batch(Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                       int64_t max_new_tokens, const SamplingOptions& options,
                                       const std::vector<int64_t>& stop_ids,
                                       const std::vector<bool>& allowed = {}, const BatchOptions& batch = {});

// transformers' beam search (its generate with num_beams > 1): num_beams
// sequences grow together as rows of one batch over a KV cache (whose rows follow the beams they
// extend, KVCache::select_rows). Each step scores every continuation of every beam by its sequence's
// summed log-probabilities, the logits' log-softmax shaped by `processors` (every processor of
// SamplingOptions, as transformers applies its processors to log-probabilities, renormalize_logits
// last); keeps the best max(2, 1 + stop ids) x num_beams; a
// continuation among the best num_beams that ends with a stop id (or that stop_check accepts,
// beam_search_batch) or reaches max_new_tokens is a finished sequence, ranked by its length-penalised score,
// and the best num_beams of the rest run on. It stops as early_stopping says, or at max_new_tokens. Returns
// the best num_return_sequences finished sequences, best first, each with its score; `allowed` (empty: every
// id) as for generate. The prompt + max_new_tokens must fit max_seq_len.
// With processors.temperature > 0 it is transformers' beam sampling (num_beams > 1 and do_sample
// true): each beam's log-probabilities are warped as the sampler warps logits (divided by the
// temperature; top-k, top-p, min-p, typical-p, epsilon, eta, each keeping at least max(2, 1 + stop
// ids) ids: transformers' min_tokens_to_keep there), and the max(2, 1 + stop ids) x
// num_beams candidates are drawn without replacement in proportion to the softmax of every beam's
// summed scores (transformers' torch.multinomial), in the order drawn, instead of taken best first.
// The draws come from a stream seeded processors.seed + the prompt's index.
std::vector<Generation> beam_search(Qwen3Model& model, const std::vector<int64_t>& prompt,
                                    int64_t max_new_tokens, const BeamSearchOptions& beams,
                                    const SamplingOptions& processors, const std::vector<int64_t>& stop_ids,
                                    const std::vector<bool>& allowed = {});

// beam_search for several prompts: batch_size of them at a time (0: all), their num_beams beams each
// the rows of one batch (the prompts left-padded as generate_batch pads them); a prompt whose search
// has ended leaves the batch, and `on_done` (if set) gets its sequences then. Each prompt's sequences
// are those beam_search gives it alone, up to the rounding of batched matrix products (exact in f64);
// seconds run from the call's start to the end of that prompt's search.
std::vector<std::vector<Generation>> beam_search_batch(
    Qwen3Model& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
    const BeamSearchOptions& beams, const SamplingOptions& processors, const std::vector<int64_t>& stop_ids,
    const std::vector<bool>& allowed = {}, int64_t batch_size = 0,
    const std::function<void(size_t, const std::vector<Generation>&)>& on_done = {},
    const StopCheck& stop_check = {});

}  // namespace titan::qwen3
