#include "titan/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>

#include "titan/core/check.h"

namespace titan::data {
using json = nlohmann::json;

void to_json(json& j, const LoaderState& s) {
  j = json{{"version", s.version}, {"doc", s.doc},         {"doc_tokens_taken", s.doc_tokens_taken},
           {"epoch", s.epoch},     {"batches", s.batches}, {"tokens", s.tokens},
           {"seq_len", s.seq_len}, {"eos_id", s.eos_id},   {"text_split", s.text_split}};
  if (!s.chat_field.empty()) j["chat_field"] = s.chat_field;
  if (!s.text_field.empty()) j["text_field"] = s.text_field;
  if (!s.packing.empty()) {
    j["packing"] = s.packing;
    j["rows_taken"] = s.rows_taken;
  }
  if (s.window_end) {
    j["window_end"] = *s.window_end;
    j["window_end_epoch"] = s.window_end_epoch;
  }
}

void from_json(const json& j, LoaderState& s) {
  s.version = j.at("version").get<int>();
  TITAN_CHECK(s.version == 1, "loader state: version ", s.version, " is not supported (expected 1)");
  s.doc = j.at("doc").get<DocPosition>();
  s.doc_tokens_taken = j.at("doc_tokens_taken").get<uint64_t>();
  s.epoch = j.at("epoch").get<uint64_t>();
  s.batches = j.at("batches").get<uint64_t>();
  s.tokens = j.at("tokens").get<uint64_t>();
  // States before 2026-12-06 also hold "dp_rank": 0 and "dp_size": 1 (a sharding only tests used).
  s.seq_len = j.at("seq_len").get<int64_t>();
  s.eos_id = j.at("eos_id").get<int32_t>();
  s.text_split = j.value("text_split", std::string());  // absent from states before the key: not checked
  s.chat_field = j.value("chat_field", std::string());
  s.text_field = j.value("text_field", std::string());  // absent from states before the key: not checked
  s.packing = j.value("packing", std::string());  // absent: next-fit, or text
  s.rows_taken = j.value("rows_taken", uint64_t(0));
  if (j.contains("window_end")) {
    s.window_end = j.at("window_end").get<DocPosition>();
    s.window_end_epoch = j.at("window_end_epoch").get<uint64_t>();
  }
}

namespace {

// A conversation read ahead for best-fit packing.
struct Conversation {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // per token: whether the loss trains on it
  DocPosition position;
};

// Best-fit decreasing over `window` (dataset order): each conversation, longest first (earlier
// first among equals), goes into the row it leaves the least room in (the earliest opened among
// equals), or opens a row; one of seq_len tokens or more fills a row alone. Rows go out in the
// order of their first conversation, each holding its conversations in dataset order.
std::vector<std::vector<Conversation>> best_fit_rows(std::vector<Conversation> window, int64_t seq_len) {
  std::vector<size_t> order(window.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return window[a].ids.size() > window[b].ids.size(); });
  std::vector<std::vector<size_t>> rows;
  std::set<std::pair<int64_t, size_t>> room;  // (tokens it still takes, row) of every row not full
  for (size_t i : order) {
    const int64_t n = int64_t(window[i].ids.size());
    int64_t left = seq_len;
    size_t r = rows.size();
    if (auto fit = room.lower_bound({n, 0}); fit != room.end()) {
      std::tie(left, r) = *fit;
      room.erase(fit);
    } else {
      rows.emplace_back();
    }
    rows[r].push_back(i);
    if (left - n > 0) room.emplace(left - n, r);
  }
  for (auto& row : rows) std::sort(row.begin(), row.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::vector<std::vector<Conversation>> packed(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i : rows[r]) packed[r].push_back(std::move(window[i]));
  return packed;
}

// Turns this rank's documents into windows. Runs on the background thread only.
class Packer {
 public:
  Packer(const LoaderConfig& config, const Tokenizer& tokenizer, int32_t eos)
      : config_(config),
        tokenizer_(tokenizer),
        eos_(eos),
        pad_(tokenizer.pad_id() >= 0 ? tokenizer.pad_id() : tokenizer.document_separator_id()),
        stream_(DatasetConfig{config.paths, config.text_field, config.text_split, config.chat_field}) {
    const auto& files = stream_.files();
    if (std::any_of(files.begin(), files.end(), is_plain_text)) text_split_ = config.text_split;
    if (config.chat_field.empty() &&
        std::any_of(files.begin(), files.end(), [](const auto& f) { return !is_plain_text(f); }))
      text_field_ = config.text_field;
    if (best_fit()) packing_ = "best_fit " + std::to_string(config.best_fit_window);
  }

  // How conversations are packed, as LoaderState::packing records it.
  const std::string& packing() const { return packing_; }

  // How plain-text files are cut into documents; "" when the dataset has none (the split then
  // changes nothing).
  const std::string& text_split() const { return text_split_; }
  // The field text documents are read from; "" when no file has fields (or conversations are read).
  const std::string& text_field() const { return text_field_; }

  void reset(const LoaderState& s) {
    stream_.seek(s.doc);
    epoch_ = s.epoch;
    batches_ = s.batches;
    tokens_ = s.tokens;
    epoch_from_start_ = s.doc == DocPosition{};
    epoch_docs_ = 0;
    doc_.clear();
    cursor_ = 0;
    planned_rows_.clear();
    rows_taken_ = 0;
    if (s.rows_taken > 0) {  // re-read the window and plan it again
      TITAN_CHECK(plan_rows() && s.rows_taken < planned_rows_.size(),
                  "loader state: the conversations read from file ", s.doc.file, " offset ", s.doc.offset,
                  " no longer pack into more than ", s.rows_taken,
                  " rows: the dataset changed since the state was saved");
      TITAN_CHECK(
          !s.window_end || (plan_end_ == *s.window_end && plan_end_epoch_ == s.window_end_epoch),
          "loader state: the best-fit window of conversations read from file ", s.doc.file, " offset ",
          s.doc.offset, " ended at file ", s.window_end ? s.window_end->file : 0, " offset ",
          s.window_end ? s.window_end->offset : 0, " (pass ", s.window_end_epoch + 1,
          " over the data) when the state was saved, and reading it again ends at file ", plan_end_.file,
          " offset ", plan_end_.offset, " (pass ", plan_end_epoch_ + 1,
          "): it holds other conversations now (the dataset changed inside it, or grew where it ended)");
      rows_taken_ = s.rows_taken;
    }
    if (s.doc_tokens_taken > 0) {
      TITAN_CHECK(load_document(), "loader state: document at file ", s.doc.file, " offset ", s.doc.offset,
                  " no longer exists in the dataset");
      TITAN_CHECK(doc_pos_ == s.doc && s.doc_tokens_taken <= doc_.size(), "loader state: the document at file ",
                  s.doc.file, " offset ", s.doc.offset, " changed since the state was saved");
      cursor_ = s.doc_tokens_taken;
    }
  }

  LoaderState state() const {
    LoaderState s;
    s.epoch = epoch_;
    if (rows_taken_ < planned_rows_.size()) {  // best-fit, inside a window of conversations
      s.doc = plan_start_;
      s.epoch = plan_epoch_;
      s.rows_taken = rows_taken_;
      s.window_end = plan_end_;
      s.window_end_epoch = plan_end_epoch_;
    } else if (cursor_ < doc_.size()) {
      s.doc = doc_pos_;
      s.doc_tokens_taken = cursor_;
    } else {
      s.doc = stream_.position();
    }
    s.packing = packing_;
    s.batches = batches_;
    s.tokens = tokens_;
    s.seq_len = config_.seq_len;
    s.eos_id = eos_;
    s.text_split = text_split_;
    s.chat_field = config_.chat_field;
    s.text_field = text_field_;
    return s;
  }

  // An empty batch when the data is exhausted and the loader is not infinite.
  Batch next_batch() {
    const int64_t B = config_.local_batch_size, S = config_.seq_len;
    Batch b;
    b.inputs.resize(B * S);
    b.labels.resize(B * S);
    b.lengths.assign(B, S);
    window_.resize(S + 1);
    for (int64_t row = 0; row < B; ++row) {
      b.document_starts.push_back(row * S);
      const bool filled = config_.chat_field.empty() ? fill_window(row, b)
                          : best_fit()               ? fill_best_fit(row, b)
                                                     : fill_conversations(row, b);
      if (!filled) {
        if (row == 0 || !config_.pad_last_batch) return Batch{};
        for (int64_t rest = row; rest < B; ++rest) {
          if (rest > row) b.document_starts.push_back(rest * S);  // (row's is in already)
          pad_row(rest, 0, b);
        }
        break;
      }
    }
    b.batch_size = B;
    b.seq_len = S;
    ++batches_;
    tokens_ += uint64_t(B * S);
    return b;
  }

  const std::vector<std::filesystem::path>& files() const { return stream_.files(); }

 private:
  // The next seq_len + 1 tokens of the document stream as row `row` (inputs window[:-1], labels
  // window[1:]). A span starts after every separator among the row's inputs: where each document
  // ends, and where the separator occurs inside one (a "\n" separator, a special token written in
  // the text), as torchtitan's document mask cuts.
  bool fill_window(int64_t row, Batch& b) {
    const int64_t S = config_.seq_len;
    size_t filled = 0;
    while (filled < window_.size()) {
      if (cursor_ == doc_.size() && !load_document()) return false;
      size_t n = std::min(window_.size() - filled, doc_.size() - cursor_);
      std::copy_n(doc_.begin() + cursor_, n, window_.begin() + filled);
      cursor_ += n;
      filled += n;
    }
    for (int64_t t = 0; t < S; ++t) {
      b.inputs[row * S + t] = window_[t];
      b.labels[row * S + t] = window_[t + 1];
      if (t > 0 && window_[t - 1] == eos_) b.document_starts.push_back(row * S + t);
    }
    return true;
  }

  bool best_fit() const { return config_.pack_conversations && config_.best_fit_window >= 2; }

  // Row `row` of conversations: the next one alone (cut when longer than seq_len + 1 tokens), or
  // with pack_conversations every next one that still fits whole; then padding.
  bool fill_conversations(int64_t row, Batch& b) {
    const int64_t S = config_.seq_len;
    int64_t used = 0;
    while (used < S) {
      // A conversation that did not fit the row before is still loaded, none of it taken. The end of
      // a finite stream (held-out data) ends a row that holds conversations already.
      if (cursor_ == doc_.size() && !load_document()) {
        if (used == 0) return false;
        break;
      }
      if (used > 0 && int64_t(doc_.size()) > S - used) break;  // the next row starts with it
      used += place(doc_, doc_trained_, doc_pos_, row, used, b);
      cursor_ = doc_.size();
      if (!config_.pack_conversations) break;
    }
    pad_row(row, used, b);
    return true;
  }

  // Row `row` of conversations packed best-fit: the next planned row, after planning the next
  // best_fit_window conversations when the last plan's rows are all out.
  bool fill_best_fit(int64_t row, Batch& b) {
    if (rows_taken_ == planned_rows_.size() && !plan_rows()) return false;
    int64_t used = 0;
    for (const Conversation& c : planned_rows_[rows_taken_])
      used += place(c.ids, c.trained, c.position, row, used, b);
    ++rows_taken_;
    pad_row(row, used, b);
    return true;
  }

  // Reads the next best_fit_window conversations (fewer at the end of finite data) and plans their
  // rows; false when none is left.
  bool plan_rows() {
    plan_start_ = stream_.position();
    plan_epoch_ = epoch_;
    std::vector<Conversation> window;
    while (int64_t(window.size()) < config_.best_fit_window && load_document()) {
      window.push_back({std::move(doc_), std::move(doc_trained_), doc_pos_});
      doc_.clear();
      doc_trained_.clear();
      cursor_ = 0;
    }
    plan_end_ = stream_.position();
    plan_end_epoch_ = epoch_;
    planned_rows_ = best_fit_rows(std::move(window), config_.seq_len);
    rows_taken_ = 0;
    return !planned_rows_.empty();
  }

  // Puts conversation `ids` at token `used` of row `row` (a document of its own after the row's
  // first): its first seq_len - used tokens as inputs, each labelled with the next token where the
  // loss trains on that one. Returns how many it placed.
  int64_t place(const std::vector<int32_t>& ids, const std::vector<uint8_t>& trained, const DocPosition& at,
                int64_t row, int64_t used, Batch& b) {
    const int64_t S = config_.seq_len, n = int64_t(ids.size());
    if (used > 0) b.document_starts.push_back(row * S + used);
    ++b.conversations;
    if (n > S + 1) {
      const int64_t lost = std::count(trained.begin() + (S + 1), trained.end(), uint8_t(1));
      ++b.cut_conversations;
      b.cut_trained_tokens += lost;
      warn_cut(n, lost, at);
    }
    const int64_t placed = std::min(n, S - used);
    int64_t* inputs = &b.inputs[row * S + used];
    int64_t* labels = &b.labels[row * S + used];
    for (int64_t t = 0; t < placed; ++t) {
      inputs[t] = ids[size_t(t)];
      labels[t] = t + 1 < n && trained[size_t(t + 1)] ? ids[size_t(t + 1)] : kIgnoreLabel;
    }
    return placed;
  }

  // Pads row `row` after its first `used` tokens (the padding a document span of its own; the row's
  // whole span when it holds nothing).
  void pad_row(int64_t row, int64_t used, Batch& b) {
    const int64_t S = config_.seq_len;
    if (used < S) {
      if (used > 0) b.document_starts.push_back(row * S + used);
      b.lengths[size_t(row)] = used;
    }
    std::fill(&b.inputs[row * S] + used, &b.inputs[row * S] + S, int64_t(pad_));
    std::fill(&b.labels[row * S] + used, &b.labels[row * S] + S, kIgnoreLabel);
  }

  // `cut`: of the n - (seq_len + 1) tokens cut off, those trained on.
  void warn_cut(int64_t n, int64_t cut, const DocPosition& at) {
    const int64_t S = config_.seq_len;
    if (!first_warning_of(stream_.files()[at.file], "conversation cut")) return;
    std::fprintf(stderr,
                 "warning: dataset %s:%llu: a conversation of %lld tokens is longer than seq_len + 1 = %lld: "
                 "its last %lld tokens (%lld of them trained on) are cut (one warning per file)\n",
                 stream_.files()[at.file].c_str(), static_cast<unsigned long long>(at.line),
                 static_cast<long long>(n), static_cast<long long>(S + 1), static_cast<long long>(n - S - 1),
                 static_cast<long long>(cut));
  }

  bool load_document() {
    Document d;
    while (!stream_.next(d)) {
      TITAN_CHECK(epoch_docs_ > 0 || !epoch_from_start_, "loader: the dataset '", config_.paths[0].string(),
                  "'", config_.paths.size() > 1 ? " (and the other paths given)" : "", " (",
                  stream_.files().size(), stream_.files().size() == 1 ? " file" : " files",
                  ") holds no non-empty document");
      if (!config_.infinite) return false;
      ++epoch_;
      epoch_docs_ = 0;
      epoch_from_start_ = true;
      stream_.seek(DocPosition{});
    }
    ++epoch_docs_;
    doc_.clear();
    if (!d.chat.empty()) {
      ChatTokens t = tokenize_chat(tokenizer_, d.chat);
      doc_ = std::move(t.ids);
      doc_trained_ = std::move(t.trained);
    } else {
      tokenizer_.encode_into(d.text, doc_);
      doc_.push_back(eos_);
    }
    doc_pos_ = d.position;
    cursor_ = 0;
    return true;
  }

  const LoaderConfig& config_;
  const Tokenizer& tokenizer_;
  int32_t eos_;
  int32_t pad_;             // what fills a conversation's row after its end
  std::string text_split_;  // config.text_split when the dataset has plain-text files, else ""
  std::string text_field_;  // config.text_field when text documents come from record files, else ""
  DocumentStream stream_;
  std::vector<int32_t> doc_;          // tokens of the current document + EOS, or of the current conversation
  std::vector<uint8_t> doc_trained_;  // per token of the current conversation: whether the loss trains on it
  size_t cursor_ = 0;         // of doc_, already in windows
  DocPosition doc_pos_;
  std::vector<int32_t> window_;
  // Best-fit packing: the rows planned for the conversations read from plan_start_ (in epoch
  // plan_epoch_), rows_taken_ of them in batches.
  std::string packing_;  // "best_fit <n>", or "" (LoaderState::packing)
  std::vector<std::vector<Conversation>> planned_rows_;
  size_t rows_taken_ = 0;
  DocPosition plan_start_;
  uint64_t plan_epoch_ = 0;
  DocPosition plan_end_;  // and where its reading ended
  uint64_t plan_end_epoch_ = 0;
  uint64_t epoch_ = 0, epoch_docs_ = 0, batches_ = 0, tokens_ = 0;
  bool epoch_from_start_ = true;
};

struct Item {
  Batch batch;
  LoaderState state;  // after this batch
  std::exception_ptr error;
};

}  // namespace

struct TokenLoader::Impl {
  LoaderConfig config;
  const Tokenizer& tokenizer;
  int32_t eos;
  std::unique_ptr<Packer> packer;
  LoaderState current;  // after the last batch next() returned

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool stop = false;
  bool finished = false;  // the worker produced its last item (end of data or an error)
  std::thread worker;

  Impl(LoaderConfig c, const Tokenizer& t) : config(std::move(c)), tokenizer(t) {
    TITAN_CHECK(config.seq_len >= 1, "loader: seq_len must be >= 1, got ", config.seq_len);
    TITAN_CHECK(config.local_batch_size >= 1, "loader: local_batch_size must be >= 1, got ",
                config.local_batch_size);
    TITAN_CHECK(config.prefetch >= 1, "loader: prefetch must be >= 1, got ", config.prefetch);
    eos = config.eos_id >= 0 ? config.eos_id : tokenizer.document_separator_id();
    TITAN_CHECK(eos >= 0 && eos < tokenizer.vocab_size(), "loader: eos_id ", eos,
                " is not a token id of the tokenizer (vocab size ", tokenizer.vocab_size(), ")");
    TITAN_CHECK(
        !config.pack_conversations || !config.chat_field.empty(),
        "loader: pack_conversations needs conversations (a chat_field); text documents are always packed");
    TITAN_CHECK(
        config.best_fit_window == 0 || (config.pack_conversations && config.best_fit_window >= 2),
        "loader: best_fit_window ", config.best_fit_window,
        ": best-fit packing needs pack_conversations and a window of at least 2 conversations (0: next-fit)");
    if (!config.chat_field.empty()) check_qwen3_chat_template(tokenizer);
    packer = std::make_unique<Packer>(config, tokenizer, eos);
    current = packer->state();
  }

  ~Impl() { halt(); }

  void run() {
    while (true) {
      Item item;
      try {
        item.batch = packer->next_batch();
        item.state = packer->state();
      } catch (...) {
        item.error = std::current_exception();
      }
      bool last = item.error || item.batch.empty();
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stop || int(queue.size()) < config.prefetch; });
      if (stop) return;
      queue.push_back(std::move(item));
      cv.notify_all();
      if (last) return;
    }
  }

  void halt() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    queue.clear();
    stop = false;
    finished = false;
  }

  Batch next() {
    std::unique_lock lock(mu);
    if (!worker.joinable()) worker = std::thread([this] { run(); });
    if (finished && queue.empty()) return Batch{};
    cv.wait(lock, [&] { return !queue.empty(); });
    Item item = std::move(queue.front());
    queue.pop_front();
    cv.notify_all();
    if (item.error) {
      queue.push_front(Item{{}, {}, item.error});  // every later call fails the same way
      std::rethrow_exception(item.error);
    }
    if (item.batch.empty()) {
      finished = true;
      return Batch{};
    }
    current = item.state;
    return std::move(item.batch);
  }

  void restore(const json& j) {
    LoaderState s;
    try {
      s = j.get<LoaderState>();
    } catch (const json::exception& e) {
      TITAN_FAIL("loader state: malformed: ", e.what());
    }
    TITAN_CHECK(s.seq_len == config.seq_len, "loader state: saved with seq_len ", s.seq_len, ", now ",
                config.seq_len);
    TITAN_CHECK(s.eos_id == eos, "loader state: saved with eos_id ", s.eos_id, ", now ", eos);
    TITAN_CHECK(s.text_split.empty() || packer->text_split().empty() || s.text_split == packer->text_split(),
                "loader state: saved with text_split ", s.text_split, ", now ", packer->text_split());
    const auto reading = [](const std::string& chat_field) {
      return chat_field.empty() ? std::string("for text documents")
                                : "for conversations (chat_field '" + chat_field + "')";
    };
    TITAN_CHECK(s.chat_field == config.chat_field, "loader state: saved ", reading(s.chat_field), ", now ",
                reading(config.chat_field));
    // Between best-fit windows (or at next-fit's next conversation) any packing goes on exactly.
    TITAN_CHECK(s.rows_taken == 0 || s.packing == packer->packing(), "loader state: saved inside a ",
                s.packing, " window, now ",
                packer->packing().empty() ? std::string("next-fit packing (or none)") : packer->packing(),
                " (the window's remaining rows are the saved packing's)");
    TITAN_CHECK(s.packing.empty() || s.doc_tokens_taken == 0,
                "loader state: malformed: a best-fit state with doc_tokens_taken ", s.doc_tokens_taken);
    TITAN_CHECK(s.doc.file <= packer->files().size(), "loader state: names file ", s.doc.file, " but the dataset has ",
                packer->files().size());
    halt();
    packer->reset(s);
    current = s;
  }
};

TokenLoader::TokenLoader(LoaderConfig config, const Tokenizer& tokenizer)
    : impl_(std::make_unique<Impl>(std::move(config), tokenizer)) {}
TokenLoader::~TokenLoader() = default;

Batch TokenLoader::next() { return impl_->next(); }
json TokenLoader::state() const { return impl_->current; }
void TokenLoader::restore(const json& state) { impl_->restore(state); }
const LoaderConfig& TokenLoader::config() const { return impl_->config; }
const std::vector<std::filesystem::path>& TokenLoader::files() const { return impl_->packer->files(); }

}  // namespace titan::data
