#include "titan/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "titan/core/check.h"
#include "titan/data/utf8.h"
#include "titan/io/json_error.h"

namespace titan::data {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer, used by ByteLevel when `use_regex` is true.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---- ByteLevel: the 256 bytes <-> printable code points of GPT-2 ---------------------
struct ByteLevelTable {
  char32_t byte_to_cp[256];
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      cp_to_byte[byte_to_cp[b]] = uint8_t(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Decodes valid UTF-8 (the caller checked) into code points.
std::u32string utf8_to_u32(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out += cp;
    i += len;
  }
  return out;
}

// Byte-level token text (e.g. "Ġthe") -> its raw bytes (" the"). nullopt when a
// character is outside the byte-level alphabet.
std::optional<std::string> byte_level_decode(std::string_view token) {
  const auto& t = byte_level();
  std::string out;
  for (char32_t cp : utf8_to_u32(token)) {
    auto it = t.cp_to_byte.find(cp);
    if (it == t.cp_to_byte.end()) return std::nullopt;
    out += char(it->second);
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_level().byte_to_cp[b]);
  return out;
}

// ---- merge table: (left id, right id) -> (rank, merged id), open addressing -----------
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, uint64_t>>& entries) {
    size_t cap = 16;
    while (cap < entries.size() * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, 0);
    mask_ = cap - 1;
    for (auto& [k, v] : entries) {
      size_t i = hash(k) & mask_;
      while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
      if (keys_[i] == k) continue;  // a duplicate merge keeps its first (best) rank, as HF does
      keys_[i] = k;
      values_[i] = v;
    }
  }
  // Packed (rank << 32 | merged id), or UINT64_MAX when the pair does not merge.
  uint64_t find(int32_t a, int32_t b) const {
    uint64_t k = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = hash(k) & mask_;
    while (true) {
      uint64_t key = keys_[i];
      if (key == k) return values_[i];
      if (key == kEmpty) return UINT64_MAX;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = UINT64_MAX;
  static size_t hash(uint64_t k) { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17); }
  std::vector<uint64_t> keys_, values_;
  size_t mask_ = 0;
};

// ---- added tokens: leftmost-longest matching, as the HF AddedVocabulary does ----------
class AddedMatcher {
 public:
  void add(std::string content, int32_t id) {
    TITAN_CHECK(!content.empty(), "tokenizer: an added token has empty content (id ", id, ")");
    first_[static_cast<unsigned char>(content[0])] = true;
    tokens_.push_back({std::move(content), id});
    std::stable_sort(tokens_.begin(), tokens_.end(),
                     [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
  }
  bool empty() const { return tokens_.empty(); }
  // First match at or after `from`: (position, length, id); position npos when none.
  std::tuple<size_t, size_t, int32_t> find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_[static_cast<unsigned char>(text[i])]) continue;
      for (auto& [content, id] : tokens_) {
        if (text.compare(i, content.size(), content) == 0) return {i, content.size(), id};
      }
    }
    return {std::string_view::npos, 0, -1};
  }

 private:
  bool first_[256] = {};
  std::vector<std::pair<std::string, int32_t>> tokens_;  // longest first
};

// ---- PCRE2 ----------------------------------------------------------------------------

// Rewrites \s and \S to the Unicode White_Space property: that is what the reference
// (HF tokenizers, Oniguruma) means by \s; PCRE2's UCP \s also takes U+180E.
std::string white_space_semantics(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 's') {
        out += "\\p{White_Space}";
      } else if (c == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += '\\';
        out += c;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern;
};

// Per-thread PCRE2 scratch: match data and a JIT stack large enough for long runs.
struct PcreScratch {
  pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  PcreScratch() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~PcreScratch() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};
PcreScratch& pcre_scratch() {
  thread_local PcreScratch scratch;
  return scratch;
}

// ---- per-thread cache of BPE results by piece -----------------------------------------
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct PieceCache {
  uint64_t owner = 0;  // uid of the tokenizer the entries belong to
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> map;
  std::vector<int32_t> ids;
  void reset(uint64_t uid) {
    owner = uid;
    map.clear();
    ids.clear();
  }
};
constexpr size_t kCacheMaxPiece = 64;        // bytes; longer pieces are rare and not cached
constexpr size_t kCacheMaxEntries = 200000;  // then start over: bounded memory per thread
std::atomic<uint64_t> next_uid{1};

const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string token_content(const json& j) {  // "<|x|>" or {"content": "<|x|>", ...}
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return {};
}

}  // namespace

struct Tokenizer::Impl {
  std::filesystem::path source;
  uint64_t uid = next_uid++;
  int32_t byte_id[256];
  MergeTable merges;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab;  // byte-level text
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> raw_vocab;  // only for ignore_merges
  std::vector<std::string> id_bytes;  // id -> bytes it decodes to
  std::vector<uint8_t> id_kind;       // 0 unused, 1 vocab, 2 added, 3 added special
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;
  std::vector<Regex> splits;
  bool nfc = false;
  bool ignore_merges = false;
  bool cleanup_spaces = false;
  bool add_bos = false, add_eos = false;
  int32_t bos = -1, eos = -1, pad = -1;
  std::filesystem::path config_path;  // tokenizer_config.json, when there was one
  const icu::Normalizer2* nfc_norm = nullptr;

  ~Impl() {
    for (auto& r : splits) pcre2_code_free(r.code);
  }

  void parse_normalizer(const json* n) {
    if (!n) return;
    std::string type = n->value("type", "");
    if (type == "NFC") {
      nfc = true;
    } else if (type == "Sequence") {
      for (auto& sub : (*n)["normalizers"]) parse_normalizer(&sub);
    } else {
      TITAN_FAIL("tokenizer ", source, ": normalizer '", type, "' is not implemented (supported: NFC)");
    }
  }

  void add_split(const std::string& pattern, bool literal) {
    Regex r;
    r.pattern = literal ? pattern : white_space_semantics(pattern);
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    r.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r.pattern.data()), r.pattern.size(), flags, &err, &off,
                           nullptr);
    if (!r.code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      TITAN_FAIL("tokenizer ", source, ": Split regex does not compile at offset ", off, ": ",
                 reinterpret_cast<char*>(msg), " (pattern: ", pattern, ")");
    }
    r.jit = pcre2_jit_compile(r.code, PCRE2_JIT_COMPLETE) == 0;
    splits.push_back(std::move(r));
  }

  void parse_pre_tokenizer(const json* p) {
    TITAN_CHECK(p, "tokenizer ", source, ": no pre_tokenizer; byte-level BPE needs ByteLevel");
    std::vector<const json*> steps;
    if (p->value("type", "") == "Sequence") {
      for (auto& s : (*p)["pretokenizers"]) steps.push_back(&s);
    } else {
      steps.push_back(p);
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = *steps[i];
      std::string type = s.value("type", "");
      if (type == "Split") {
        TITAN_CHECK(s.value("behavior", "") == "Isolated" && !s.value("invert", false), "tokenizer ", source,
                    ": Split pre-tokenizer with behavior '", s.value("behavior", ""),
                    "', invert=", s.value("invert", false), " is not implemented (supported: Isolated)");
        const json& pat = s["pattern"];
        if (pat.contains("Regex")) {
          add_split(pat["Regex"].get<std::string>(), false);
        } else if (pat.contains("String")) {
          add_split(pat["String"].get<std::string>(), true);
        } else {
          TITAN_FAIL("tokenizer ", source, ": Split pattern needs 'Regex' or 'String'");
        }
      } else if (type == "ByteLevel") {
        TITAN_CHECK(i + 1 == steps.size(), "tokenizer ", source,
                    ": ByteLevel must be the last pre-tokenizer (it maps bytes to symbols)");
        TITAN_CHECK(!s.value("add_prefix_space", false), "tokenizer ", source,
                    ": ByteLevel add_prefix_space=true is not implemented");
        if (s.value("use_regex", true)) add_split(kGpt2Pattern, false);
        return;
      } else {
        TITAN_FAIL("tokenizer ", source, ": pre-tokenizer '", type,
                   "' is not implemented (supported: Split, ByteLevel, Sequence of those)");
      }
    }
    TITAN_FAIL("tokenizer ", source, ": the pre-tokenizer does not end with ByteLevel; only byte-level BPE "
               "is implemented");
  }

  void parse_model(const json& m) {
    std::string type = m.value("type", "");
    TITAN_CHECK(type == "BPE", "tokenizer ", source, ": model type '", type,
                "' is not implemented (supported: BPE)");
    TITAN_CHECK(!m.value("byte_fallback", false), "tokenizer ", source, ": BPE byte_fallback is not implemented");
    const json* dropout = find_key(m, "dropout");
    TITAN_CHECK(!dropout || dropout->get<double>() == 0.0, "tokenizer ", source,
                ": BPE dropout is not implemented (training-time randomness)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json* v = find_key(m, key);
      TITAN_CHECK(!v || v->get<std::string>().empty(), "tokenizer ", source, ": BPE ", key,
                  " is not implemented");
    }
    ignore_merges = m.value("ignore_merges", false);

    int32_t max_id = -1;
    for (auto& [token, id] : m["vocab"].items()) max_id = std::max(max_id, id.get<int32_t>());
    id_bytes.assign(max_id + 1, {});
    id_kind.assign(max_id + 1, 0);
    vocab.reserve(m["vocab"].size());
    for (auto& [token, idj] : m["vocab"].items()) {
      int32_t id = idj.get<int32_t>();
      TITAN_CHECK(id >= 0, "tokenizer ", source, ": negative id for '", token, "'");
      auto bytes = byte_level_decode(token);
      TITAN_CHECK(bytes, "tokenizer ", source, ": vocab entry '", token, "' (id ", id,
                  ") is not byte-level text; only byte-level BPE is implemented");
      vocab.emplace(token, id);
      id_bytes[id] = *bytes;
      id_kind[id] = 1;
      if (ignore_merges) raw_vocab.emplace(*bytes, id);
    }
    for (int b = 0; b < 256; ++b) {
      std::string t;
      append_utf8(t, byte_level().byte_to_cp[b]);
      auto it = vocab.find(t);
      TITAN_CHECK(it != vocab.end(), "tokenizer ", source, ": the vocab lacks byte ", b, " ('", t,
                  "'); byte-level BPE needs all 256");
      byte_id[b] = it->second;
    }

    std::vector<std::pair<uint64_t, uint64_t>> entries;
    const json& ms = m["merges"];
    entries.reserve(ms.size());
    for (size_t rank = 0; rank < ms.size(); ++rank) {
      std::string a, b;
      if (ms[rank].is_string()) {
        auto s = ms[rank].get<std::string>();
        auto sp = s.find(' ');
        TITAN_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "tokenizer ", source,
                    ": merge ", rank, " '", s, "' is not 'a b'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        TITAN_CHECK(ms[rank].is_array() && ms[rank].size() == 2, "tokenizer ", source, ": merge ", rank,
                    " is neither 'a b' nor [a, b]");
        a = ms[rank][0].get<std::string>();
        b = ms[rank][1].get<std::string>();
      }
      auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
      TITAN_CHECK(ia != vocab.end() && ib != vocab.end() && im != vocab.end(), "tokenizer ", source, ": merge ",
                  rank, " ('", a, "', '", b, "') uses a token missing from the vocab");
      entries.push_back({(uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second),
                         (uint64_t(rank) << 32) | uint32_t(im->second)});
    }
    merges.build(entries);
  }

  void parse_added(const json& list) {
    for (auto& t : list) {
      AddedToken a;
      a.content = t["content"].get<std::string>();
      a.id = t["id"].get<int32_t>();
      a.special = t.value("special", false);
      a.normalized = t.value("normalized", !a.special);
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        TITAN_CHECK(!t.value(flag, false), "tokenizer ", source, ": added token '", a.content, "' sets ", flag,
                    "=true, which is not implemented");
      }
      TITAN_CHECK(a.id >= 0, "tokenizer ", source, ": added token '", a.content, "' has a negative id");
      if (a.id >= int32_t(id_bytes.size())) {
        id_bytes.resize(a.id + 1);
        id_kind.resize(a.id + 1, 0);
      }
      // Decoded as HF's ByteLevel decoder does: through the byte map when every
      // character is in it, else the content's own bytes.
      auto bytes = byte_level_decode(a.content);
      id_bytes[a.id] = bytes ? *bytes : a.content;
      id_kind[a.id] = a.special ? 3 : 2;
      (a.normalized && nfc ? normalized_matcher : raw_matcher).add(a.content, a.id);
      added.push_back(a);
    }
  }

  void parse_decoder_and_post(const json& root) {
    if (const json* d = find_key(root, "decoder")) {
      std::string type = d->value("type", "");
      TITAN_CHECK(type == "ByteLevel", "tokenizer ", source, ": decoder '", type,
                  "' is not implemented (supported: ByteLevel)");
    }
    if (const json* p = find_key(root, "post_processor")) {
      std::string type = p->value("type", "");
      TITAN_CHECK(type == "ByteLevel", "tokenizer ", source, ": post_processor '", type,
                  "' is not implemented (supported: ByteLevel; bos/eos come from tokenizer_config.json)");
    }
  }

  int32_t id_of(const std::string& content, const char* what, const std::filesystem::path& config) {
    if (content.empty()) return -1;
    for (auto& a : added)
      if (a.content == content) return a.id;
    auto it = vocab.find(content);
    TITAN_CHECK(it != vocab.end(), "tokenizer ", config, ": ", what, " '", content, "' is not in the vocabulary");
    return it->second;
  }

  void parse_config(const std::filesystem::path& path) {
    const json c = io::read_json_file(path, "tokenizer");
    add_bos = c.value("add_bos_token", false);
    add_eos = c.value("add_eos_token", false);
    cleanup_spaces = c.value("clean_up_tokenization_spaces", false);
    if (const json* t = find_key(c, "eos_token")) eos = id_of(token_content(*t), "eos_token", path);
    if (const json* t = find_key(c, "bos_token")) bos = id_of(token_content(*t), "bos_token", path);
    if (const json* t = find_key(c, "pad_token")) pad = id_of(token_content(*t), "pad_token", path);
    TITAN_CHECK(!add_bos || bos >= 0, "tokenizer ", path, ": add_bos_token=true but no bos_token");
    TITAN_CHECK(!add_eos || eos >= 0, "tokenizer ", path, ": add_eos_token=true but no eos_token");
  }

  // ---- encoding ----

  // BPE of one piece of raw bytes, appended to `out`.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    size_t n = piece.size();
    if (n == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (ignore_merges) {
      auto it = raw_vocab.find(piece);
      if (it != raw_vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (n <= 64) {
      bpe_small(piece, out);
    } else {
      bpe_heap(piece, out);
    }
  }

  // Quadratic in the worst case but with tiny constants: the usual word is < 16 bytes.
  void bpe_small(std::string_view piece, std::vector<int32_t>& out) const {
    int32_t ids[64];
    uint64_t best[64];  // packed (rank, merged) of pair (i, i+1)
    int n = int(piece.size());
    for (int i = 0; i < n; ++i) ids[i] = byte_id[static_cast<unsigned char>(piece[i])];
    for (int i = 0; i + 1 < n; ++i) best[i] = merges.find(ids[i], ids[i + 1]);
    while (n > 1) {
      int at = -1;
      uint64_t lowest = UINT64_MAX;
      for (int i = 0; i + 1 < n; ++i) {
        if (best[i] < lowest) {  // strict: the leftmost of equal ranks wins
          lowest = best[i];
          at = i;
        }
      }
      if (at < 0) break;
      ids[at] = int32_t(uint32_t(lowest));
      for (int i = at + 1; i + 1 < n; ++i) {
        ids[i] = ids[i + 1];
        best[i] = best[i + 1];
      }
      --n;
      if (at > 0) best[at - 1] = merges.find(ids[at - 1], ids[at]);
      best[at] = at + 1 < n ? merges.find(ids[at], ids[at + 1]) : UINT64_MAX;
    }
    out.insert(out.end(), ids, ids + n);
  }

  // O(n log n) for huge pieces (a 10 MB word without whitespace): a min-heap of
  // candidate pairs keyed (rank, position) over a linked list of symbols, the order
  // the HF implementation merges in. Keys are 8 bytes; an entry is stale when the
  // pair now at its position has another rank, and is then skipped.
  void bpe_heap(std::string_view piece, std::vector<int32_t>& out) const {
    size_t n = piece.size();
    TITAN_CHECK(n < (size_t(1) << 32), "tokenizer: a single pre-token of ", n, " bytes is too long");
    std::vector<int32_t> ids(n);
    std::vector<int32_t> prev(n), next(n);  // -1: none
    for (size_t i = 0; i < n; ++i) {
      ids[i] = byte_id[static_cast<unsigned char>(piece[i])];
      prev[i] = int32_t(i) - 1;
      next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    std::vector<uint64_t> heap;
    heap.reserve(n);
    for (size_t i = 0; i + 1 < n; ++i) {
      uint64_t m = merges.find(ids[i], ids[i + 1]);
      if (m != UINT64_MAX) heap.push_back((m >> 32 << 32) | i);
    }
    auto later = std::greater<uint64_t>();
    std::make_heap(heap.begin(), heap.end(), later);
    auto push = [&](int32_t i) {
      if (i < 0 || next[i] < 0) return;
      uint64_t m = merges.find(ids[i], ids[next[i]]);
      if (m == UINT64_MAX) return;
      heap.push_back((m >> 32 << 32) | uint32_t(i));
      std::push_heap(heap.begin(), heap.end(), later);
    };
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      uint64_t key = heap.back();
      heap.pop_back();
      auto pos = int32_t(uint32_t(key));
      int32_t j = next[pos];
      if (ids[pos] < 0 || j < 0) continue;
      uint64_t m = merges.find(ids[pos], ids[j]);
      if (m == UINT64_MAX || (m >> 32) != (key >> 32)) continue;
      ids[pos] = int32_t(uint32_t(m));
      ids[j] = -1;
      next[pos] = next[j];
      if (next[j] >= 0) prev[next[j]] = pos;
      push(prev[pos]);
      push(pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  }

  void bpe_cached(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1 || piece.size() > kCacheMaxPiece) {
      bpe(piece, out);
      return;
    }
    thread_local PieceCache cache;
    if (cache.owner != uid) cache.reset(uid);
    auto it = cache.map.find(piece);
    if (it != cache.map.end()) {
      out.insert(out.end(), cache.ids.begin() + it->second.first,
                 cache.ids.begin() + it->second.first + it->second.second);
      return;
    }
    size_t start = out.size();
    bpe(piece, out);
    if (cache.map.size() >= kCacheMaxEntries) cache.reset(uid);
    cache.map.emplace(std::string(piece), std::pair<uint32_t, uint32_t>(cache.ids.size(), out.size() - start));
    cache.ids.insert(cache.ids.end(), out.begin() + start, out.end());
  }

  // Split regex number `level` cuts `text` into pieces (matches and the gaps between
  // them, HF's "Isolated"); the last level's pieces go to BPE.
  void split_and_bpe(std::string_view text, size_t level, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    if (level == splits.size()) {
      bpe_cached(text, out);
      return;
    }
    const Regex& re = splits[level];
    PcreScratch& s = pcre_scratch();
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0, gap = 0;
    while (pos < text.size()) {
      int rc = re.jit ? pcre2_jit_match(re.code, subject, text.size(), pos, 0, s.md, s.ctx)
                      : pcre2_match(re.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.ctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        TITAN_FAIL("tokenizer: regex match failed: ", reinterpret_cast<char*>(msg));
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match splits nothing: step over one character
        pos = b + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > gap) split_and_bpe(text.substr(gap, b - gap), level + 1, out);
      split_and_bpe(text.substr(b, e - b), level + 1, out);
      pos = gap = e;
    }
    if (gap < text.size()) split_and_bpe(text.substr(gap), level + 1, out);
  }

  // `text` through the normalizer into `normalized` when it changes it; else `text` itself.
  std::string_view normalize(std::string_view text, std::string& normalized) const {
    if (!nfc || !needs_nfc(text)) return text;
    normalized.clear();
    UErrorCode status = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(&normalized, int32_t(text.size()));
    nfc_norm->normalizeUTF8(0, icu::StringPiece(text.data(), int32_t(text.size())), sink, nullptr, status);
    TITAN_CHECK(U_SUCCESS(status), "tokenizer: NFC normalization failed: ", u_errorName(status));
    return normalized;
  }

  void normalized_segment(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    text = normalize(text, normalized);
    size_t pos = 0;
    while (!normalized_matcher.empty()) {
      auto [at, len, id] = normalized_matcher.find(text, pos);
      if (at == std::string_view::npos) break;
      split_and_bpe(text.substr(pos, at - pos), 0, out);
      out.push_back(id);
      pos = at + len;
    }
    split_and_bpe(text.substr(pos), 0, out);
  }

  bool needs_nfc(std::string_view text) const {
    // Code points below U+0300 (lead bytes < 0xCC) are NFC and never compose with what
    // precedes them, so text made only of them is already normalized.
    bool high = false;
    for (unsigned char c : text) high |= c >= 0xCC;
    if (!high) return false;
    UErrorCode status = U_ZERO_ERROR;
    bool yes = nfc_norm->isNormalizedUTF8(icu::StringPiece(text.data(), int32_t(text.size())), status);
    return !(U_SUCCESS(status) && yes);
  }

  void encode(std::string_view text, std::vector<int32_t>& out, bool add_special) const {
    std::string repaired;
    if (!is_valid_utf8(text)) {
      sanitize_utf8(text, repaired);
      text = repaired;
    }
    if (add_special && add_bos) out.push_back(bos);
    size_t pos = 0;
    while (!raw_matcher.empty()) {
      auto [at, len, id] = raw_matcher.find(text, pos);
      if (at == std::string_view::npos) break;
      normalized_segment(text.substr(pos, at - pos), out);
      out.push_back(id);
      pos = at + len;
    }
    normalized_segment(text.substr(pos), out);
    if (add_special && add_eos) out.push_back(eos);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::filesystem::path tokenizer_json(const std::filesystem::path& path) {
  return std::filesystem::is_directory(path) ? path / "tokenizer.json" : path;
}

std::vector<std::filesystem::path> tokenizer_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const fs::path file = tokenizer_json(path);
  std::vector<fs::path> files;
  for (const fs::path& f :
       {file, file.parent_path() / "tokenizer_config.json", file.parent_path() / kChatTemplateFile})
    if (!path.empty() && fs::is_regular_file(f)) files.push_back(f);
  return files;
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const fs::path file = tokenizer_json(path);
  TITAN_CHECK(fs::is_regular_file(file), "tokenizer: ", file, " does not exist (pass a folder holding "
              "tokenizer.json, or the file itself)");
  auto impl = std::make_unique<Impl>();
  impl->source = file;
  json root = io::read_json_file(file, "tokenizer");
  try {
    TITAN_CHECK(root.is_object() && root.contains("model"), "tokenizer: ", file, " has no 'model'");
    impl->parse_normalizer(find_key(root, "normalizer"));
    if (impl->nfc) {
      UErrorCode status = U_ZERO_ERROR;
      impl->nfc_norm = icu::Normalizer2::getNFCInstance(status);
      TITAN_CHECK(U_SUCCESS(status), "tokenizer: ICU NFC data unavailable: ", u_errorName(status));
    }
    impl->parse_pre_tokenizer(find_key(root, "pre_tokenizer"));
    impl->parse_model(root["model"]);
    if (const json* a = find_key(root, "added_tokens")) impl->parse_added(*a);
    impl->parse_decoder_and_post(root);
  } catch (const json::exception& e) {
    TITAN_FAIL("tokenizer: ", file, " has an unexpected structure: ", e.what());
  }
  fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config)) {
    impl->parse_config(config);
    impl->config_path = config;
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, out, add_special_tokens);
  return out;
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens) const {
  impl_->encode(text, out, add_special_tokens);
}

bool Tokenizer::has_id(int32_t id) const {
  return id >= 0 && id < int32_t(impl_->id_kind.size()) && impl_->id_kind[size_t(id)] != 0;
}

size_t Tokenizer::settled_length(std::string_view decoded) const {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (decoded.ends_with(kReplacement)) return 0;  // the stream waits for the character's next bytes
  if (!impl_->cleanup_spaces) return decoded.size();
  // Every rule starts at a space: what comes before the last one stays. A trailing apostrophe too
  // may be the rest of " ' " -> "'", which " ." or " ," (applied first) takes the space from when the
  // next id brings the stop: "a ' " decodes to "a'", "a ' ." to "a '.".
  const size_t last_space = std::min(decoded.size(), decoded.rfind(' '));
  return last_space == decoded.size() && decoded.ends_with('\'') ? decoded.size() - 1 : last_space;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    TITAN_CHECK(has_id(id), "tokenizer decode: id ", id, " is not in the vocabulary (size ",
                impl_->id_kind.size(), ")");
    if (skip_special_tokens && impl_->id_kind[id] == 3) continue;
    bytes += impl_->id_bytes[id];
  }
  sanitize_utf8(bytes);
  if (impl_->cleanup_spaces) {
    // transformers' clean_up_tokenization, applied when tokenizer_config.json asks for it.
    static const std::pair<std::string_view, std::string_view> rules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : rules) {
      std::string next;
      size_t pos = 0, at;
      while ((at = bytes.find(from, pos)) != std::string::npos) {
        next.append(bytes, pos, at - pos).append(to);
        pos = at + from.size();
      }
      next.append(bytes, pos);
      bytes.swap(next);
    }
  }
  return bytes;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  TITAN_CHECK(has_id(id), "tokenizer: id ", id, " is not in the vocabulary (size ", impl_->id_kind.size(),
              ")");
  return impl_->id_bytes[size_t(id)];
}

std::string Tokenizer::normalize(std::string_view text) const {
  // As encode() reads it: invalid UTF-8 repaired, added tokens matched on the raw text first and the
  // text between them normalized (a combining mark after an added token stays apart from it).
  std::string repaired;
  if (!is_valid_utf8(text)) {
    sanitize_utf8(text, repaired);
    text = repaired;
  }
  std::string out, normalized;
  size_t pos = 0;
  while (!impl_->raw_matcher.empty()) {
    auto [at, len, id] = impl_->raw_matcher.find(text, pos);
    if (at == std::string_view::npos) break;
    out += impl_->normalize(text.substr(pos, at - pos), normalized);
    out += text.substr(at, len);
    pos = at + len;
  }
  return out += impl_->normalize(text.substr(pos), normalized);
}

int32_t Tokenizer::eos_id() const { return impl_->eos; }
const std::filesystem::path& Tokenizer::config_path() const {
  return impl_->config_path;
}
const std::filesystem::path& Tokenizer::source() const {
  return impl_->source;
}
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
int32_t Tokenizer::document_separator_id() const {
  auto id = token_to_id("<|endoftext|>");
  return id ? *id : impl_->eos;
}
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }
bool Tokenizer::add_eos_token() const { return impl_->add_eos; }
int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_kind.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  TITAN_CHECK(id >= 0 && id < vocab_size() && impl_->id_kind[id] != 0, "tokenizer: id ", id,
              " is not in the vocabulary");
  for (auto& a : impl_->added)
    if (a.id == id) return a.content;
  return byte_level_encode(impl_->id_bytes[id]);
}

}  // namespace titan::data
