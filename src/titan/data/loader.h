#pragma once
// Packs tokenized documents into training batches: each document + EOS, concatenated,
// cut into windows of seq_len + 1 (inputs = window[:-1], labels = window[1:]), no
// padding. Conversations (chat_field) are whole: each fills one row, right-padded, or with
// pack_conversations rows hold as many whole conversations as fit, in order, then padding; the
// labels of what the loss does not train on (the prompt turns, a conversation's last token, the
// padding) are kIgnoreLabel; a conversation longer than seq_len + 1 tokens takes a row of its own and is
// cut there (a warning says so once). Packing is next-fit in dataset order, or with best_fit_window n
// best-fit decreasing over each n conversations read together (fuller rows; rows go out in the order of
// their first conversation, each row's conversations in dataset order). Every batch says where its documents
// start and where each row's padding begins (block-causal attention, the MoE aux loss). One loader reads the
// global batch: each data-parallel rank takes its rows of it (train/train_step.cpp). A background thread
// keeps batches ready. state()/restore() resume exactly: the batches after a restore are those an
// uninterrupted run would have produced.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"

namespace titan::data {

// The label of a position the loss skips (the cross-entropy's ignore_index, as in PyTorch).
inline constexpr int64_t kIgnoreLabel = -100;

struct LoaderConfig {
  std::vector<std::filesystem::path> paths;  // files and folders
  std::string text_field = "text";
  std::string chat_field = "";  // non-empty: the records are conversations (DatasetConfig::chat_field)
  bool pack_conversations = false;  // conversations: as many whole ones per row as fit (else one per row)
  // pack_conversations: 0 fills each row with the next conversations that fit (next-fit); n >= 2 reads
  // n conversations at a time and packs them best-fit decreasing (each, longest first, into the row
  // it leaves least room in).
  int64_t best_fit_window = 0;
  std::string text_split = "paragraph";  // plain text files: paragraph | line | file
  int64_t seq_len = 2048;
  int64_t local_batch_size = 1;
  int32_t eos_id = -1;   // document separator; -1: tokenizer.document_separator_id()
  int prefetch = 4;      // batches the background thread keeps ready
  bool infinite = true;  // at the end of the data start the next epoch; else next() returns an empty batch
  // Finite data (a held-out set): the batch the data ends in is returned, the rows it could not
  // begin filled with padding (no targets, length 0), so that one pass scores every row the data
  // fills; else that batch is dropped, as training drops it. (A text row the data cannot fill to
  // seq_len + 1 tokens is not begun either way.)
  bool pad_last_batch = false;
};

struct Batch {
  std::vector<int64_t> inputs;  // [batch_size * seq_len], row-major
  std::vector<int64_t> labels;  // the next token of each input, or kIgnoreLabel
  // Where each document begins, as offsets into the flattened inputs, ascending: every row's first
  // token, the token after each text document's separator, each packed conversation's first token,
  // and a row's padding (a span of its own).
  std::vector<int64_t> document_starts;
  std::vector<int64_t> lengths;  // per row, its tokens before the padding (seq_len: none)
  // Conversations: how many the batch's rows hold, and of those how many were longer than seq_len + 1
  // tokens and cut there, with the trained (answer) tokens the cuts took off. Counted per batch
  // returned, so a sum over the batches a run took (prefetched ones left out) is that run's.
  int64_t conversations = 0, cut_conversations = 0, cut_trained_tokens = 0;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  bool empty() const { return batch_size == 0; }
};

// Position of the loader after the last batch returned, JSON-serialisable.
struct LoaderState {
  int version = 1;
  DocPosition doc;            // the document being consumed, or the next one to read
  uint64_t doc_tokens_taken = 0;  // tokens of `doc` (its EOS included) already in batches
  uint64_t epoch = 0;
  uint64_t batches = 0;  // returned so far
  uint64_t tokens = 0;   // input tokens in them
  // The packing this state belongs to; restore() refuses a different one.
  int64_t seq_len = 0;
  int32_t eos_id = -1;
  std::string text_split;  // how plain-text files were cut into documents; "" when there were none
  std::string chat_field;  // "" for text documents
  // The field text documents are read from in record files (JSON, CSV, Parquet, Arrow); "" when
  // there are none (or conversations are read).
  std::string text_field;
  // Best-fit packing: `doc` is where the window being emitted was read from, and `rows_taken` of its
  // rows are in batches already. `packing` names it ("best_fit 256"; "" for next-fit and text).
  uint64_t rows_taken = 0;
  std::string packing;
  // Where reading that window ended (the stream's position and epoch after its last conversation):
  // planning it again on resume must end there too, or it reads other conversations (a dataset that
  // grew inside it). Absent from states before 2026-12-08.
  std::optional<DocPosition> window_end;
  uint64_t window_end_epoch = 0;
};
void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);

class TokenLoader {
 public:
  // `tokenizer` must outlive the loader.
  TokenLoader(LoaderConfig config, const Tokenizer& tokenizer);
  ~TokenLoader();
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  Batch next();  // rethrows data errors (malformed file, ...) from the background thread
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);
  const LoaderConfig& config() const;
  const std::vector<std::filesystem::path>& files() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
