// Packing, sharding, prefetching and exact resume of the token loader.
#include "titan/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "gzip_test_util.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/chat.h"

namespace {
using namespace titan::testing;
using namespace titan::data;
using json = nlohmann::json;

// Documents of varied length, one longer than a whole batch.
std::vector<std::string> make_docs(int n) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    std::string d = "Document number " + std::to_string(i) + ":";
    for (int k = 0; k < (i * 7) % 23; ++k) d += " word" + std::to_string(k * i);
    docs.push_back(d);
  }
  std::string longdoc;
  for (int k = 0; k < 400; ++k) longdoc += "long " + std::to_string(k) + ", ";
  docs[3] = longdoc;
  return docs;
}

std::filesystem::path write_docs(const std::string& name, const std::vector<std::string>& docs) {
  auto dir = temp_dir(name);
  std::string lines;
  for (auto& d : docs) lines += json{{"text", d}}.dump() + "\n";
  write_file(dir / "docs.jsonl", lines);
  return dir;
}

// The packing computed directly: this rank's documents + EOS, concatenated, cut into
// windows of S + 1, repeated over `epochs`.
std::vector<std::vector<int32_t>> expected_windows(const std::vector<std::string>& docs, int64_t S,
                                                   int epochs) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::vector<int32_t> stream;
  for (int e = 0; e < epochs; ++e)
    for (size_t i = 0; i < docs.size(); ++i) {
      auto ids = tok.encode(docs[i]);
      stream.insert(stream.end(), ids.begin(), ids.end());
      stream.push_back(151643);
    }
  std::vector<std::vector<int32_t>> windows;
  for (size_t at = 0; at + S + 1 <= stream.size(); at += S + 1)
    windows.emplace_back(stream.begin() + at, stream.begin() + at + S + 1);
  return windows;
}

void expect_batch(const Batch& b, const std::vector<std::vector<int32_t>>& windows, size_t first, int64_t B,
                  int64_t S) {
  ASSERT_EQ(b.batch_size, B);
  ASSERT_EQ(b.seq_len, S);
  ASSERT_EQ(b.inputs.size(), size_t(B * S));
  for (int64_t r = 0; r < B; ++r) {
    const auto& w = windows.at(first + r);
    for (int64_t t = 0; t < S; ++t) {
      ASSERT_EQ(b.inputs[r * S + t], w[t]) << "row " << r << " t " << t;
      ASSERT_EQ(b.labels[r * S + t], w[t + 1]) << "row " << r << " t " << t;
    }
  }
}

TEST(Loader, PacksDocumentsWithEosIntoWindows) {
  auto docs = make_docs(40);
  auto dir = write_docs("loader_pack", docs);
  const int64_t S = 64, B = 3;
  auto windows = expected_windows(docs, S, 3);
  TokenLoader loader({.paths = {dir}, .seq_len = S, .local_batch_size = B}, qwen3_tokenizer());
  // Enough batches to wrap into the next epochs.
  size_t per_epoch = expected_windows(docs, S, 1).size();
  size_t n = (2 * per_epoch) / B + 2;
  for (size_t i = 0; i < n; ++i) expect_batch(loader.next(), windows, i * B, B, S);
  EXPECT_GE(loader.state()["epoch"].get<int>(), 1);
}

// Every row starts a span, and so does every token that follows a document's EOS inside the row's
// inputs (the last input's EOS ends the row; its next document starts the next one). No padding.
TEST(Loader, TextDocumentsStartAtEveryRowAndAfterEveryEos) {
  auto docs = make_docs(40);
  auto dir = write_docs("loader_starts", docs);
  const int64_t S = 48, B = 3;
  auto windows = expected_windows(docs, S, 1);
  TokenLoader loader({.paths = {dir}, .seq_len = S, .local_batch_size = B}, qwen3_tokenizer());
  int64_t inside = 0;
  for (size_t i = 0; (i + 1) * B <= windows.size(); ++i) {
    const Batch b = loader.next();
    std::vector<int64_t> want;
    for (int64_t r = 0; r < B; ++r) {
      want.push_back(r * S);
      for (int64_t t = 1; t < S; ++t)
        if (windows[i * B + r][size_t(t - 1)] == 151643) want.push_back(r * S + t), ++inside;
    }
    EXPECT_EQ(b.document_starts, want) << "batch " << i;
    EXPECT_EQ(b.lengths, std::vector<int64_t>(B, S)) << "batch " << i;
  }
  EXPECT_GT(inside, 10) << "rows should hold several documents";
}

// A separator that also occurs inside documents ("\n" between the lines of a record) cuts there
// too, as torchtitan's document mask cuts at every separator token.
TEST(Loader, ASeparatorInsideADocumentStartsASpanToo) {
  const int32_t newline = qwen3_tokenizer().encode("\n").at(0);
  std::vector<std::string> docs;
  for (int i = 0; i < 12; ++i)
    docs.push_back("Line one of record " + std::to_string(i) + "\nLine two\nAnd a third line here");
  auto dir = write_docs("loader_starts_newline", docs);
  std::vector<int32_t> stream;
  std::vector<bool> appended;  // per stream token: the separator the loader appends to a document
  for (const std::string& d : docs) {
    for (int32_t id : qwen3_tokenizer().encode(d)) stream.push_back(id), appended.push_back(false);
    stream.push_back(newline);
    appended.push_back(true);
  }
  const int64_t S = 32, B = 2;
  TokenLoader loader({.paths = {dir}, .seq_len = S, .local_batch_size = B, .eos_id = newline},
                     qwen3_tokenizer());
  int64_t inside_documents = 0;
  for (int64_t i = 0; (i + 1) * B * (S + 1) <= int64_t(stream.size()); ++i) {
    const Batch b = loader.next();
    std::vector<int64_t> want;
    for (int64_t r = 0; r < B; ++r) {
      const int64_t w = (i * B + r) * (S + 1);
      want.push_back(r * S);
      for (int64_t t = 1; t < S; ++t)
        if (stream[size_t(w + t - 1)] == newline) {
          want.push_back(r * S + t);
          inside_documents += !appended[size_t(w + t - 1)];
        }
    }
    EXPECT_EQ(b.document_starts, want) << "batch " << i;
  }
  EXPECT_GT(inside_documents, 6) << "the lines' newlines should cut inside the records";
}

TEST(Loader, RestoreGivesIdenticalBatches) {
  auto docs = make_docs(30);
  auto dir = write_docs("loader_restore", docs);
  LoaderConfig config{.paths = {dir}, .seq_len = 48, .local_batch_size = 2};
  TokenLoader reference(config, qwen3_tokenizer());
  std::vector<Batch> batches;
  std::vector<std::string> states = {reference.state().dump()};
  for (int i = 0; i < 40; ++i) {  // spans epochs and the long document
    batches.push_back(reference.next());
    states.push_back(reference.state().dump());
  }
  for (size_t k : {size_t(0), size_t(1), size_t(5), size_t(17), size_t(33)}) {
    TokenLoader resumed(config, qwen3_tokenizer());
    resumed.next();  // a loader that already ran (and prefetched) must restore too
    resumed.restore(json::parse(states[k]));
    for (size_t i = k; i < std::min(k + 6, batches.size()); ++i) {
      Batch b = resumed.next();
      ASSERT_EQ(b.inputs, batches[i].inputs) << "restored at " << k << ", batch " << i;
      ASSERT_EQ(b.labels, batches[i].labels) << "restored at " << k << ", batch " << i;
    }
    EXPECT_EQ(resumed.state().dump(), states[std::min(k + 6, batches.size())]);
  }
  // A state written before 2026-12-06 also holds the sharding keys of a loader of one rank and
  // the document's index in the dataset (the sharding key).
  json older = json::parse(states[5]);
  older["dp_rank"] = 0;
  older["dp_size"] = 1;
  older["doc"]["index"] = 12;
  TokenLoader resumed(config, qwen3_tokenizer());
  resumed.restore(older);
  EXPECT_EQ(resumed.next().inputs, batches[5].inputs);
}

TEST(Loader, RestoreRefusesADifferentPacking) {
  auto dir = write_docs("loader_refuse", make_docs(10));
  TokenLoader a({.paths = {dir}, .seq_len = 16}, qwen3_tokenizer());
  a.next();
  TokenLoader c({.paths = {dir}, .seq_len = 32}, qwen3_tokenizer());
  EXPECT_THROW(c.restore(a.state()), titan::Error);
}

TEST(Loader, FiniteLoaderEndsWithAnEmptyBatch) {
  auto docs = make_docs(10);
  auto dir = write_docs("loader_finite", docs);
  const int64_t S = 16;
  size_t windows = expected_windows(docs, S, 1).size();
  TokenLoader loader({.paths = {dir}, .seq_len = S, .infinite = false}, qwen3_tokenizer());
  for (size_t i = 0; i < windows; ++i) EXPECT_FALSE(loader.next().empty());
  EXPECT_TRUE(loader.next().empty());
  EXPECT_TRUE(loader.next().empty());
}

// pad_last_batch (held-out data): the batch the data ends in comes back with the rows it could not
// begin as padding: no targets, length 0, one document span each; then the empty batch. Without it
// that batch is dropped.
TEST(Loader, APaddedLastBatchHoldsEveryRowTheDataFills) {
  auto docs = make_docs(10);
  auto dir = write_docs("loader_pad_last", docs);
  const int64_t S = 16, B = 3;
  const int64_t windows = int64_t(expected_windows(docs, S, 1).size());
  ASSERT_NE(windows % B, 0) << "the test needs a last batch the data does not fill";
  for (const bool pad : {false, true}) {
    SCOPED_TRACE(pad ? "padded" : "dropped");
    TokenLoader loader(
        {.paths = {dir}, .seq_len = S, .local_batch_size = B, .infinite = false, .pad_last_batch = pad},
        qwen3_tokenizer());
    int64_t rows = 0, padding = 0;
    for (Batch b = loader.next(); !b.empty(); b = loader.next()) {
      EXPECT_TRUE(std::is_sorted(b.document_starts.begin(), b.document_starts.end()) &&
                  std::adjacent_find(b.document_starts.begin(), b.document_starts.end()) ==
                      b.document_starts.end())
          << "strictly ascending";
      for (int64_t r = 0; r < B; ++r) {
        if (b.lengths[size_t(r)] == S) {
          ++rows;
          continue;
        }
        ++padding;
        EXPECT_EQ(b.lengths[size_t(r)], 0);
        EXPECT_TRUE(std::all_of(b.labels.begin() + r * S, b.labels.begin() + (r + 1) * S,
                                [](int64_t l) { return l == kIgnoreLabel; }));
        EXPECT_NE(std::find(b.document_starts.begin(), b.document_starts.end(), r * S),
                  b.document_starts.end());
      }
    }
    EXPECT_EQ(rows, pad ? windows : windows / B * B);
    EXPECT_EQ(padding, pad ? B - windows % B : 0);
    EXPECT_TRUE(loader.next().empty());
  }
}

TEST(Loader, DataErrorsReachTheCaller) {
  auto dir = temp_dir("loader_bad");
  write_file(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": broken}\n");
  TokenLoader loader({.paths = {dir}, .seq_len = 8}, qwen3_tokenizer());
  try {
    loader.next();
    ADD_FAILURE() << "no error";
  } catch (const titan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: malformed JSON"), std::string::npos) << e.what();
  }
  auto empty = temp_dir("loader_empty");
  write_file(empty / "e.jsonl", "{\"text\": \"\"}\n");
  TokenLoader none({.paths = {empty}, .seq_len = 8}, qwen3_tokenizer());
  EXPECT_THROW(none.next(), titan::Error);
}

TEST(Loader, DefaultDatasetFeedsBatches) {
  auto path = default_dataset_path();
  TokenLoader loader({.paths = {path}, .seq_len = 128, .local_batch_size = 2}, qwen3_tokenizer());
  Batch b = loader.next();
  ASSERT_EQ(b.inputs.size(), 256u);
  // The first window starts with the first document of the corpus.
  std::ifstream f(path / "train.jsonl");
  std::string line;
  std::getline(f, line);
  auto first = qwen3_tokenizer().encode(json::parse(line)["text"].get<std::string>());
  for (size_t t = 0; t < std::min<size_t>(first.size(), 128); ++t) ASSERT_EQ(b.inputs[t], first[t]);
}

TEST(Loader, ResumesExactlyInsideCompressedShards) {
  // The bundled corpus cut into 3 gzip shards, named by a glob. A run that stops after k batches,
  // saves the loader state (through JSON, as a checkpoint does) and resumes in a fresh loader
  // continues with exactly the tokens of an uninterrupted run, and those are the tokens of the
  // same shards uncompressed.
  auto dir = temp_dir("loader_gzip_resume");
  std::ifstream corpus(titan::testing::assets_dir() / "datasets" / "nlp-corpus" / "train.jsonl");
  std::string line;
  for (int shard = 0; shard < 3; ++shard) {
    std::string lines;
    for (int i = 0; i < 150 && std::getline(corpus, line); ++i) lines += line + "\n";
    write_file(dir / "gz" / ("part-" + std::to_string(shard) + ".jsonl.gz"), gzip_bytes(lines));
    write_file(dir / "plain" / ("part-" + std::to_string(shard) + ".jsonl"), lines);
  }
  LoaderConfig config{.paths = {dir / "gz" / "part-*.jsonl.gz"}, .seq_len = 64, .local_batch_size = 2};
  TokenLoader reference(config, qwen3_tokenizer());
  std::vector<Batch> batches;
  std::vector<std::string> states = {reference.state().dump()};
  for (int i = 0; i < 60; ++i) {
    batches.push_back(reference.next());
    states.push_back(reference.state().dump());
  }
  LoaderConfig plain_config = config;
  plain_config.paths = {dir / "plain"};
  TokenLoader plain(plain_config, qwen3_tokenizer());
  for (auto& b : batches) ASSERT_EQ(plain.next().inputs, b.inputs);

  int inside = 0;  // resume points that lie inside a shard, past its first byte
  for (size_t k : {size_t(3), size_t(17), size_t(29), size_t(44)}) {
    json state = json::parse(states[k]);
    if (state["doc"]["offset"].get<uint64_t>() > 0) ++inside;
    TokenLoader resumed(config, qwen3_tokenizer());
    resumed.restore(state);
    for (size_t i = k; i < std::min(k + 8, batches.size()); ++i) {
      Batch b = resumed.next();
      ASSERT_EQ(b.inputs, batches[i].inputs) << "resumed after " << k << " batches, batch " << i;
      ASSERT_EQ(b.labels, batches[i].labels) << "resumed after " << k << " batches, batch " << i;
    }
  }
  EXPECT_GE(inside, 3);
  // The run crossed shards: later states name later files.
  EXPECT_GT(json::parse(states.back())["doc"]["file"].get<uint64_t>(), 0u);
}

}  // namespace

namespace {

// Conversations of varied length: short ones (padded), one longer than a row (cut), two rounds in some.
std::filesystem::path write_conversations(const std::string& name, int n) {
  auto dir = temp_dir(name);
  std::string lines;
  for (int i = 0; i < n; ++i) {
    std::string answer = "Answer " + std::to_string(i) + ":";
    for (int k = 0; k < (i * 5) % 17; ++k) answer += " word" + std::to_string(k);
    if (i == 2)
      for (int k = 0; k < 60; ++k) answer += " long" + std::to_string(k);
    json messages = json::array({{{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}},
                                 {{"role", "assistant"}, {"content", answer}}});
    if (i % 3 == 1) {
      messages.push_back({{"role", "user"}, {"content", "More?"}});
      messages.push_back({{"role", "assistant"}, {"content", "No more."}});
    }
    lines += json{{"messages", messages}}.dump() + "\n";
  }
  write_file(dir / "chats.jsonl", lines);
  return dir;
}

// Conversation i of write_conversations as tokens, computed directly.
ChatTokens conversation_tokens(const std::filesystem::path& dir, int i) {
  std::ifstream f(dir / "chats.jsonl");
  std::string line;
  for (int k = 0; k <= i; ++k) std::getline(f, line);
  return tokenize_chat(qwen3_tokenizer(),
                       render_qwen3_chat(nlohmann::ordered_json::parse(line).at("messages")));
}

// The first `n` batches of a loader and its state before each and after the last.
struct Recorded {
  std::vector<Batch> batches;
  std::vector<json> states;
};
Recorded record(const LoaderConfig& config, int n) {
  TokenLoader loader(config, qwen3_tokenizer());
  Recorded r{{}, {loader.state()}};
  for (int i = 0; i < n; ++i) {
    r.batches.push_back(loader.next());
    r.states.push_back(loader.state());
  }
  return r;
}

// A loader restored to each recorded state gives the batches recorded after it, field for field.
void expect_every_restore_replays(const LoaderConfig& config, const Recorded& run) {
  for (size_t k = 1; k < run.batches.size(); ++k) {
    TokenLoader resumed(config, qwen3_tokenizer());
    resumed.restore(run.states[k]);
    for (size_t i = k; i < run.batches.size(); ++i) {
      Batch b = resumed.next();
      ASSERT_EQ(b.inputs, run.batches[i].inputs) << "restored at " << k << ", batch " << i;
      ASSERT_EQ(b.labels, run.batches[i].labels) << "restored at " << k << ", batch " << i;
      ASSERT_EQ(b.document_starts, run.batches[i].document_starts) << "restored at " << k << ", batch " << i;
      ASSERT_EQ(b.lengths, run.batches[i].lengths) << "restored at " << k << ", batch " << i;
    }
  }
}

}  // namespace

// One conversation per row: its first S + 1 tokens, padded with <|endoftext|> after its end; a label
// is the next token where the loss trains on it (the assistant's answer and <|im_end|>), else -100.
TEST(Loader, ConversationsFillOneRowEachWithTheirPromptsAndPaddingIgnored) {
  auto dir = write_conversations("loader_chat_rows", 6);
  const int64_t S = 40, B = 2;
  TokenLoader loader({.paths = {dir}, .chat_field = "messages", .seq_len = S, .local_batch_size = B},
                     qwen3_tokenizer());
  int64_t padded = 0, cut = 0, targets = 0;
  for (int batch = 0; batch < 5;
       ++batch) {  // 10 rows: past the end of the 6 conversations, into the next epoch
    Batch b = loader.next();
    ASSERT_EQ(b.batch_size, B);
    int64_t batch_cut = 0, lost = 0;  // conversations cut, and their trained tokens past the row
    for (int64_t row = 0; row < B; ++row) {
      const ChatTokens t = conversation_tokens(dir, int(batch * B + row) % 6);
      const int64_t n = int64_t(t.ids.size());
      padded += n < S;
      cut += n > S + 1;
      batch_cut += n > S + 1;
      for (int64_t p = S + 1; p < n; ++p) lost += t.trained[p];
      for (int64_t p = 0; p < S; ++p) {
        const int64_t at = row * S + p;
        ASSERT_EQ(b.inputs[at], p < n ? t.ids[p] : 151643)
            << "batch " << batch << " row " << row << " position " << p;
        const bool trained = p + 1 < n && t.trained[p + 1];
        ASSERT_EQ(b.labels[at], trained ? t.ids[p + 1] : kIgnoreLabel)
            << "batch " << batch << " row " << row << " position " << p;
        targets += trained;
      }
    }
    EXPECT_EQ(b.conversations, B) << "batch " << batch;
    EXPECT_EQ(b.cut_conversations, batch_cut) << "batch " << batch;
    EXPECT_EQ(b.cut_trained_tokens, lost) << "batch " << batch;
  }
  EXPECT_GT(padded, 0);
  EXPECT_GT(cut, 0);
  EXPECT_GT(targets, 0);
  EXPECT_EQ(loader.state().at("epoch").get<uint64_t>(), 1u);
}

// pack_conversations: whole conversations in dataset order, each row taking every next one that
// still fits after those before it, then padding; a conversation longer than a row fills one alone,
// cut at S + 1 tokens. Each conversation and each row's padding is a document of its own.
TEST(Loader, PackedConversationsFillRowsWholeInOrderThenPadding) {
  const int n = 9;
  auto dir = write_conversations("loader_chat_packed", n);
  const int64_t S = 96, B = 2;
  TokenLoader loader({.paths = {dir},
                      .chat_field = "messages",
                      .pack_conversations = true,
                      .seq_len = S,
                      .local_batch_size = B},
                     qwen3_tokenizer());
  int next = 0;  // the conversation the next row starts with
  int64_t shared_rows = 0, cut = 0;
  for (int batch = 0; batch < 6; ++batch) {  // past the end of the conversations, into the next epoch
    const Batch b = loader.next();
    ASSERT_EQ(b.batch_size, B);
    std::vector<int64_t> starts, lengths;
    int64_t in_batch = 0, batch_cut = 0, lost = 0;
    for (int64_t row = 0; row < B; ++row) {
      int64_t used = 0, in_row = 0;
      while (used < S) {
        const ChatTokens t = conversation_tokens(dir, next % n);
        const int64_t len = int64_t(t.ids.size());
        if (used > 0 && len > S - used) break;
        starts.push_back(row * S + used);
        cut += len > S + 1;
        batch_cut += len > S + 1;
        for (int64_t p = S + 1; p < len; ++p) lost += t.trained[p];
        for (int64_t p = 0; p < std::min(len, S); ++p) {
          const int64_t at = row * S + used + p;
          ASSERT_EQ(b.inputs[at], t.ids[p])
              << "batch " << batch << " row " << row << " conversation " << next;
          const bool trained = p + 1 < len && t.trained[p + 1];
          ASSERT_EQ(b.labels[at], trained ? t.ids[p + 1] : kIgnoreLabel)
              << "batch " << batch << " row " << row << " conversation " << next << " position " << p;
        }
        used += std::min(len, S);
        ++in_row;
        ++next;
      }
      shared_rows += in_row > 1;
      in_batch += in_row;
      if (used < S) starts.push_back(row * S + used);
      lengths.push_back(used);
      for (int64_t p = used; p < S; ++p) {
        ASSERT_EQ(b.inputs[row * S + p], 151643) << "padding, batch " << batch << " row " << row;
        ASSERT_EQ(b.labels[row * S + p], kIgnoreLabel) << "padding, batch " << batch << " row " << row;
      }
    }
    EXPECT_EQ(b.document_starts, starts) << "batch " << batch;
    EXPECT_EQ(b.lengths, lengths) << "batch " << batch;
    // Each conversation counted once, in the batch it is placed in (not in the one it did not fit).
    EXPECT_EQ(b.conversations, in_batch) << "batch " << batch;
    EXPECT_EQ(b.cut_conversations, batch_cut) << "batch " << batch;
    EXPECT_EQ(b.cut_trained_tokens, lost) << "batch " << batch;
  }
  EXPECT_GT(shared_rows, 2) << "rows should hold several conversations";
  EXPECT_GT(cut, 0) << "a conversation should be longer than a row";
  EXPECT_GT(next, n) << "the rows should go on into the next epoch";
}

// A conversation that did not fit the last row of a batch opens the next batch, after a restore too
// (the saved position is the next conversation to place either way).
TEST(Loader, PackedConversationsRestoreExactly) {
  auto dir = write_conversations("loader_chat_packed_restore", 7);
  LoaderConfig config{.paths = {dir},
                      .chat_field = "messages",
                      .pack_conversations = true,
                      .seq_len = 48,
                      .local_batch_size = 2};
  const Recorded run = record(config, 8);
  // A batch whose last row has padding closed it because the next conversation did not fit: that
  // one waited, loaded, for the next batch.
  int64_t waited = 0;
  for (size_t k = 0; k + 1 < run.batches.size(); ++k) waited += run.batches[k].lengths.back() < 48;
  EXPECT_GT(waited, 0) << "some conversation should wait for the next batch";
  expect_every_restore_replays(config, run);
}

// The rows best-fit packing makes of conversations `first` .. `first + count - 1` (mod n) of
// write_conversations, computed directly: longest first (earlier first among equals), each into the
// open row with the least room that takes it (the earliest opened among equals), else a new row;
// rows ordered by their first conversation, each row's conversations ascending.
std::vector<std::vector<int>> best_fit_plan(const std::filesystem::path& dir, int n, int first, int count,
                                            int64_t S) {
  std::vector<int64_t> length(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    length[size_t(i)] = int64_t(conversation_tokens(dir, (first + i) % n).ids.size());
  std::vector<int> order(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return length[size_t(a)] > length[size_t(b)]; });
  std::vector<std::vector<int>> rows;
  std::vector<int64_t> room;
  for (int i : order) {
    int best = -1;
    for (int r = 0; r < int(rows.size()); ++r)
      if (room[size_t(r)] >= length[size_t(i)] && (best < 0 || room[size_t(r)] < room[size_t(best)]))
        best = r;
    if (best < 0) {
      rows.emplace_back();
      room.push_back(S);
      best = int(rows.size()) - 1;
    }
    rows[size_t(best)].push_back(first + i);
    room[size_t(best)] = std::max<int64_t>(0, room[size_t(best)] - length[size_t(i)]);
  }
  for (auto& r : rows) std::sort(r.begin(), r.end());
  std::sort(rows.begin(), rows.end());
  return rows;
}

// pack_strategy best_fit: each window of 8 conversations (one of an epoch's end running on into the
// next) goes out as the rows best_fit_plan makes of it, laid out as next-fit lays out a row: whole
// conversations then padding, a conversation longer than a row alone and cut. On these
// conversations (22 to 77 tokens, one of 212) a window fills about 4 rows of 96 with less padding
// than next-fit leaves. (A window of a row or two can pad more than next-fit, whose rows run on
// across windows: the window has to hold several rows' worth.)
TEST(Loader, BestFitPacksEachWindowLongestFirstIntoTheFullestRow) {
  const int n = 13, window = 8;
  auto dir = write_conversations("loader_chat_best_fit", n);
  const int64_t S = 96, B = 2, batches = 12;
  TokenLoader loader({.paths = {dir},
                      .chat_field = "messages",
                      .pack_conversations = true,
                      .best_fit_window = window,
                      .seq_len = S,
                      .local_batch_size = B},
                     qwen3_tokenizer());
  std::vector<std::vector<int>> plan;  // the rows still to come
  int read = 0, shared_rows = 0, whole_windows = 0;
  int64_t padding = 0, window_padding = 0;  // of the whole windows out, of the current one
  for (int batch = 0; batch < batches; ++batch) {
    const Batch b = loader.next();
    ASSERT_EQ(b.batch_size, B);
    std::vector<int64_t> starts, lengths;
    int64_t in_batch = 0, batch_cut = 0, lost = 0;
    for (int64_t row = 0; row < B; ++row) {
      if (plan.empty()) {
        for (auto& r : best_fit_plan(dir, n, read, window, S)) plan.push_back(r);
        read += window;
      }
      const std::vector<int> members = plan.front();
      plan.erase(plan.begin());
      shared_rows += members.size() > 1;
      int64_t used = 0;
      for (int c : members) {
        const ChatTokens t = conversation_tokens(dir, c % n);
        const int64_t len = int64_t(t.ids.size()), placed = std::min(len, S);
        ASSERT_LE(used + placed, S) << "batch " << batch << " row " << row;
        ++in_batch;
        batch_cut += len > S + 1;
        for (int64_t p = S + 1; p < len; ++p) lost += t.trained[p];
        starts.push_back(row * S + used);
        for (int64_t p = 0; p < placed; ++p) {
          const int64_t at = row * S + used + p;
          ASSERT_EQ(b.inputs[at], t.ids[p]) << "batch " << batch << " row " << row << " conversation " << c;
          const bool trained = p + 1 < len && t.trained[p + 1];
          ASSERT_EQ(b.labels[at], trained ? t.ids[p + 1] : kIgnoreLabel)
              << "batch " << batch << " row " << row << " conversation " << c << " position " << p;
        }
        used += placed;
      }
      if (used < S) starts.push_back(row * S + used);
      lengths.push_back(used);
      window_padding += S - used;
      if (plan.empty()) {
        padding += window_padding;
        window_padding = 0;
        ++whole_windows;
      }
      for (int64_t p = used; p < S; ++p)
        ASSERT_EQ(b.inputs[row * S + p], 151643) << "padding, batch " << batch;
    }
    EXPECT_EQ(b.document_starts, starts) << "batch " << batch;
    EXPECT_EQ(b.lengths, lengths) << "batch " << batch;
    EXPECT_EQ(b.conversations, in_batch) << "batch " << batch;
    EXPECT_EQ(b.cut_conversations, batch_cut) << "batch " << batch;
    EXPECT_EQ(b.cut_trained_tokens, lost) << "batch " << batch;
  }
  EXPECT_GT(shared_rows, 4) << "rows should hold several conversations";
  EXPECT_GT(read, n) << "the windows should go on into the next epoch";

  // Next-fit over the conversations of the whole windows (in dataset order, rows running on across
  // windows) pads more.
  const int conversations = whole_windows * window;
  int64_t next_fit_padding = 0, used = 0;
  for (int c = 0; c < conversations; ++c) {
    const int64_t len = int64_t(conversation_tokens(dir, c % n).ids.size());
    if (used > 0 && len > S - used) {
      next_fit_padding += S - used;
      used = 0;
    }
    used += std::min(len, S);
  }
  next_fit_padding += S - used;
  std::printf("%d conversations in rows of %lld tokens: best-fit pads %lld, next-fit %lld\n", conversations,
              (long long)S, (long long)padding, (long long)next_fit_padding);
  EXPECT_GE(whole_windows, 4);
  EXPECT_LT(padding, next_fit_padding);
}

// The conversations of `dir` packed best-fit over windows of 4 into rows of 64 tokens, 2 a batch.
LoaderConfig best_fit_4_config(const std::filesystem::path& dir) {
  return {.paths = {dir},
          .chat_field = "messages",
          .pack_conversations = true,
          .best_fit_window = 4,
          .seq_len = 64,
          .local_batch_size = 2};
}

// Best-fit resumes inside a window (its rows planned again from where the window was read) and
// across epochs; between windows another packing may go on.
TEST(Loader, BestFitRestoresExactlyInsideAWindow) {
  auto dir = write_conversations("loader_chat_best_fit_restore", 7);
  const LoaderConfig config = best_fit_4_config(dir);
  const Recorded run = record(config, 8);
  const std::vector<json>& states = run.states;
  int64_t inside = 0;
  for (const json& st : states) inside += st.value("rows_taken", uint64_t(0)) > 0;
  EXPECT_GT(inside, 2) << "some batches should end inside a window";
  EXPECT_GT(states.back().at("epoch").get<uint64_t>(), 0u);
  expect_every_restore_replays(config, run);
  // Inside a window another packing is refused; between windows any packing goes on from the next
  // conversation (a window's first), and a best-fit run can go on from next-fit's position.
  LoaderConfig next_fit_config = config, window_5 = config;
  next_fit_config.best_fit_window = 0;
  window_5.best_fit_window = 5;
  int64_t between = 0;
  for (size_t k = 1; k < states.size(); ++k)
    for (const LoaderConfig& other : {next_fit_config, window_5}) {
      TokenLoader loader(other, qwen3_tokenizer());
      if (states[k].value("rows_taken", uint64_t(0)) > 0) {
        try {
          loader.restore(states[k]);
          ADD_FAILURE() << "restored state " << k << " inside a best_fit 4 window, best_fit_window "
                        << other.best_fit_window;
        } catch (const titan::Error& e) {
          EXPECT_NE(std::string(e.what()).find("saved inside a best_fit 4 window"), std::string::npos)
              << e.what();
        }
        continue;
      }
      ++between;
      loader.restore(states[k]);
      const int next = int(states[k].at("doc").at("line").get<int64_t>() - 1) % 7;
      const int first =
          other.best_fit_window > 0 ? best_fit_plan(dir, 7, next, 5, 64).front().front() % 7 : next;
      EXPECT_EQ(loader.next().inputs[0], conversation_tokens(dir, first).ids[0]) << "state " << k;
    }
  EXPECT_GT(between, 0) << "some batches should end between windows";
  TokenLoader next_fit(next_fit_config, qwen3_tokenizer());
  for (int i = 0; i < 3; ++i) next_fit.next();
  TokenLoader best_fit(config, qwen3_tokenizer());
  best_fit.restore(next_fit.state());
  const int next = int(next_fit.state().at("doc").at("line").get<int64_t>() - 1) % 7;
  EXPECT_EQ(best_fit.next().inputs[0],
            conversation_tokens(dir, best_fit_plan(dir, 7, next, 4, 64).front().front() % 7).ids[0]);
}

// A dataset that grew (a conversation appended) leaves a best-fit window read before its old end as
// it was: restored inside it, the loader goes on with the window's rows. A window whose reading ran
// past the old end (into the next pass over the data) would read other conversations now: refused,
// naming where it ended then and where it ends now.
TEST(Loader, BestFitRefusesAWindowADatasetGrewInside) {
  auto dir = write_conversations("loader_chat_best_fit_growth", 7);
  const LoaderConfig config = best_fit_4_config(dir);
  const Recorded run = record(config, 8);
  {
    std::ifstream in(dir / "chats.jsonl");
    std::string first;
    std::getline(in, first);
    std::ofstream(dir / "chats.jsonl", std::ios::app) << first << "\n";
  }
  int64_t kept = 0, refused = 0;
  for (size_t k = 1; k < run.batches.size(); ++k) {
    const json& st = run.states[k];
    if (st.value("rows_taken", uint64_t(0)) == 0) continue;
    ASSERT_TRUE(st.contains("window_end")) << st;
    TokenLoader loader(config, qwen3_tokenizer());
    if (st.at("window_end_epoch") == st.at("epoch")) {  // read within one pass, before the old end
      ++kept;
      loader.restore(st);
      const Batch b = loader.next();
      const int64_t S = config.seq_len;
      EXPECT_TRUE(std::equal(b.inputs.begin(), b.inputs.begin() + S, run.batches[k].inputs.begin()))
          << "state " << k;
      continue;
    }
    ++refused;
    try {
      loader.restore(st);
      ADD_FAILURE() << "restored state " << k << ", whose window ran into the next pass";
    } catch (const titan::Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(" over the data) when the state was saved, and reading it again ends at "
                                     "file 0 offset "),
          std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("): it holds other conversations now"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(refused, 0);
}

// Held-out conversations (a finite loader): the last window holds what is left; then an empty batch.
TEST(Loader, BestFitOnFiniteDataPacksTheLastWindowThenEnds) {
  const int n = 7;
  auto dir = write_conversations("loader_chat_best_fit_finite", n);
  const int64_t S = 96;
  TokenLoader loader({.paths = {dir},
                      .chat_field = "messages",
                      .pack_conversations = true,
                      .best_fit_window = 4,
                      .seq_len = S,
                      .local_batch_size = 1,
                      .infinite = false},
                     qwen3_tokenizer());
  std::vector<std::vector<int>> plan = best_fit_plan(dir, n, 0, 4, S);
  for (auto& r : best_fit_plan(dir, n, 4, 3, S)) plan.push_back(r);
  for (size_t r = 0; r < plan.size(); ++r) {
    const Batch b = loader.next();
    ASSERT_FALSE(b.empty()) << "row " << r;
    const int64_t first = int64_t(conversation_tokens(dir, plan[r].front()).ids.size());
    EXPECT_EQ(b.inputs[0], conversation_tokens(dir, plan[r].front()).ids[0]) << "row " << r;
    EXPECT_EQ(int64_t(b.document_starts.size()) - (b.lengths[0] < S), int64_t(plan[r].size())) << "row " << r;
    EXPECT_GE(b.lengths[0], std::min(first, S)) << "row " << r;
  }
  EXPECT_TRUE(loader.next().empty());
  EXPECT_TRUE(loader.next().empty());
}

// Unpacked, each row is one conversation then its padding (a span of its own).
TEST(Loader, AConversationRowReportsWhereItsPaddingStarts) {
  auto dir = write_conversations("loader_chat_lengths", 6);
  const int64_t S = 40, B = 3;
  TokenLoader loader({.paths = {dir}, .chat_field = "messages", .seq_len = S, .local_batch_size = B},
                     qwen3_tokenizer());
  for (int batch = 0; batch < 2; ++batch) {
    const Batch b = loader.next();
    std::vector<int64_t> starts, lengths;
    for (int64_t row = 0; row < B; ++row) {
      const int64_t n = int64_t(conversation_tokens(dir, int(batch * B + row)).ids.size());
      starts.push_back(row * S);
      if (n < S) starts.push_back(row * S + n);
      lengths.push_back(std::min(n, S));
    }
    EXPECT_EQ(b.document_starts, starts) << "batch " << batch;
    EXPECT_EQ(b.lengths, lengths) << "batch " << batch;
  }
}

TEST(Loader, ConversationsRestoreExactlyAndOnlyIntoConversations) {
  auto dir = write_conversations("loader_chat_restore", 7);
  LoaderConfig config{.paths = {dir}, .chat_field = "messages", .seq_len = 24, .local_batch_size = 3};
  const Recorded run = record(config, 8);
  const std::vector<json>& states = run.states;
  expect_every_restore_replays(config, run);
  // The same files read as text documents count other rows: refused, naming both.
  LoaderConfig as_text = config;
  as_text.chat_field = "";
  as_text.text_field = "messages";
  TokenLoader text(as_text, qwen3_tokenizer());
  try {
    text.restore(states[2]);
    ADD_FAILURE() << "no error";
  } catch (const titan::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("saved for conversations (chat_field 'messages'), now for text documents"),
        std::string::npos)
        << e.what();
  }
}

TEST(Loader, ABadConversationNamesTheFileLineMessageAndField) {
  auto dir = temp_dir("loader_chat_bad");
  write_file(dir / "c.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
             "\"content\": \"hello\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"bot\", \"content\": "
             "\"hello\"}]}\n");
  TokenLoader loader({.paths = {dir}, .chat_field = "messages", .seq_len = 8, .local_batch_size = 2},
                     qwen3_tokenizer());
  try {
    loader.next();
    ADD_FAILURE() << "no error";
  } catch (const titan::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("c.jsonl:2: field 'messages': "), std::string::npos) << what;
    EXPECT_NE(what.find("message 1: role 'bot' is not one of system, user, assistant, tool"),
              std::string::npos)
        << what;
  }
  write_file(dir / "d.jsonl", "{\"text\": \"no conversation here\"}\n");
  TokenLoader missing({.paths = {dir / "d.jsonl"}, .chat_field = "messages", .seq_len = 8},
                      qwen3_tokenizer());
  try {
    missing.next();
    ADD_FAILURE() << "no error";
  } catch (const titan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:1: object has no field 'messages'"), std::string::npos)
        << e.what();
  }
  // Plain text cannot hold conversations: refused when the dataset is opened, naming the file.
  write_file(dir / "notes.txt", "some text\n");
  try {
    TokenLoader text({.paths = {dir / "notes.txt"}, .chat_field = "messages", .seq_len = 8},
                     qwen3_tokenizer());
    ADD_FAILURE() << "no error";
  } catch (const titan::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("notes.txt is plain text, but conversations (chat_field 'messages')"),
        std::string::npos)
        << e.what();
  }
}
