// Deterministic mutation fuzzing of the safetensors parser, part of the normal suite (a few
// seconds). Valid files are mutated (bit flips, interesting bytes, truncation, deletions,
// duplications, header-length and number rewrites); each result must either parse into a
// self-consistent file or throw titan::Error -- never crash, hang or throw anything else. Under
// TITAN_SANITIZE every read is bounds checked too, since each image lives in its own exact-size
// buffer. tests/fuzz/ holds the coverage-guided libFuzzer target for the same parser.
#include <gtest/gtest.h>

#include <random>

#include "io_test_util.h"
#include "titan/io/safetensors.h"

namespace titan::io {
namespace {

namespace fs = std::filesystem;
using namespace titan::io::testing;

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  fs::path dir = titan::testing::fixtures_dir() / "io";
  out.push_back(read_bytes(dir / "mixed.safetensors"));
  for (const auto& e : fs::directory_iterator(dir / "fuzz_seeds")) out.push_back(read_bytes(e.path()));
  std::sort(out.begin(), out.end());  // directory order is not deterministic
  return out;
}

// A parse that succeeded must describe exactly the bytes it was given.
void check_consistent(const ParsedSafetensors& p, const std::vector<std::byte>& buf) {
  ASSERT_LE(p.header_bytes + 8, buf.size());
  const std::byte* data = buf.data() + 8 + p.header_bytes;
  size_t expect = 0;
  for (const TensorInfo& t : p.tensors) {
    ASSERT_EQ(t.offset_begin, expect);
    ASSERT_EQ(t.data, data + t.offset_begin);
    ASSERT_EQ(uint64_t(t.numel()) * dtype_size(t.dtype), t.nbytes());
    expect = t.offset_end;
  }
  ASSERT_EQ(8 + p.header_bytes + expect, buf.size());
}

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const char kBytes[] = {'{',  '}', '[', ']',  '"',    ',',    ':',    '-',    '0',    '9',   ' ',
                                '\\', 'e', '.', '\0', '\x7f', '\x80', '\xc0', '\xed', '\xf4', '\xff'};
  static const char* kNumbers[] = {"0",
                                   "1",
                                   "-1",
                                   "8",
                                   "4294967296",
                                   "9223372036854775807",
                                   "9223372036854775808",
                                   "18446744073709551615",
                                   "18446744073709551616",
                                   "1e400",
                                   "1.5",
                                   "-0"};
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  int rounds = 1 + int(rng() % 3);
  for (int r = 0; r < rounds && !s.empty(); ++r) {
    switch (rng() % 8) {
      case 0:
        s[pick(s.size())] ^= char(1u << (rng() % 8));
        break;
      case 1:
        s[pick(s.size())] = kBytes[pick(sizeof kBytes)];
        break;
      case 2:
        s.resize(pick(s.size()));
        break;
      case 3: {  // delete a range
        size_t a = pick(s.size()), n = 1 + pick(16);
        s.erase(a, n);
        break;
      }
      case 4: {  // duplicate a range (e.g. a whole header entry)
        size_t a = pick(s.size()), n = 1 + pick(64);
        s.insert(pick(s.size()), s.substr(a, n));
        break;
      }
      case 5: {  // rewrite the header length
        uint64_t n = rng() % 4 ? uint64_t(int64_t(s.size()) - 8 + int64_t(rng() % 9) - 4) : rng();
        if (s.size() >= 8) std::memcpy(s.data(), &n, 8);
        break;
      }
      case 6: {  // replace a number in the header with an interesting one
        size_t at = s.find_first_of("0123456789", 8 + pick(s.size()));
        if (at == std::string::npos || at < 8) break;
        size_t end = s.find_first_not_of("0123456789", at);
        s.replace(at, end - at, kNumbers[pick(std::size(kNumbers))]);
        break;
      }
      default: {  // change a dtype name
        static const char* kTypes[] = {"\"F32\"", "\"BF16\"", "\"U8\"", "\"BOOL\"", "\"F64\"", "\"\""};
        size_t at = s.find("\"dtype\":", pick(s.size()));
        if (at == std::string::npos) break;
        size_t v = s.find('"', at + 8), e = v == std::string::npos ? v : s.find('"', v + 1);
        if (e == std::string::npos) break;
        s.replace(v, e - v + 1, kTypes[pick(std::size(kTypes))]);
      }
    }
  }
  return s;
}

TEST(SafetensorsFuzz, MutatedFilesFailCleanly) {
  std::vector<std::string> base = seeds();
  ASSERT_GE(base.size(), 4u);
  std::mt19937_64 rng(20240611);
  size_t accepted = 0, rejected = 0;
  constexpr int kIterations = 60000;
  for (int it = 0; it < kIterations; ++it) {
    std::string img = mutate(base[it % base.size()], rng);
    std::vector<std::byte> buf(img.size());
    if (!img.empty()) std::memcpy(buf.data(), img.data(), img.size());
    try {
      ParsedSafetensors p = parse_safetensors(buf, "fuzz");
      check_consistent(p, buf);
      ++accepted;
    } catch (const titan::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-titan exception " << e.what();
    }
  }
  // Both outcomes must occur, or the mutations are not exercising the parser.
  EXPECT_GT(accepted, 100u);
  EXPECT_GT(rejected, 10000u);
  std::printf("accepted %zu, rejected %zu\n", accepted, rejected);
}

}  // namespace
}  // namespace titan::io
