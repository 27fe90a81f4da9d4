// UTF-8 repair against Python's bytes.decode("utf-8", errors="replace"), which follows
// the same Unicode "maximal subpart" policy.
#include <gtest/gtest.h>

#include <random>

#include "data_test_util.h"
#include "titan/data/utf8.h"

namespace {
using namespace titan::testing;

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

TEST(Utf8, RepairMatchesPython) {
  std::vector<std::string> cases = {
      "plain ascii", "caf\xC3\xA9", "\xC3", "\xC3(", "\xE2\x82", "\xE2\x82(", "\xF0\x9F\x98", "\xF0\x9F\x98\x80",
      "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80", "\xFF\xFE", "\x80\x80\x80",
      "a\xF0\x80\x80z", "\xEF\xBF\xBD already", "",
  };
  std::mt19937 rng(3);
  const std::string pieces[] = {"a", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\x80", "\xC3", "\xE4\xB8", "\xFF",
                                "\xED\xA0\x80", "\xF0\x9F"};
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = rng() % 12; k > 0; --k) s += pieces[rng() % std::size(pieces)];
    for (int k = rng() % 4; k > 0; --k) s += char(rng() % 256);
    cases.push_back(s);
  }
  auto dir = temp_dir("utf8");
  std::string input;
  for (auto& c : cases) input += hex(c) + "\n";
  write_file(dir / "in.txt", input);
  std::string out;
  ASSERT_EQ(run_command("python3 -c \"import sys\nfor l in open(sys.argv[1]):\n"
                        "  b=bytes.fromhex(l.strip()); s=b.decode('utf-8','replace')\n"
                        "  print('x'+s.encode().hex(), s.count(chr(0xfffd)) - b.count(bytes([0xef,0xbf,0xbd])))\" " +
                            (dir / "in.txt").string(),
                        &out),
            0)
      << out;
  std::istringstream lines(out);
  for (auto& c : cases) {
    std::string want_hex;
    size_t want_count = 0;
    lines >> want_hex >> want_count;
    want_hex = want_hex.substr(1);  // 'x' keeps an empty result a token
    std::string got;
    size_t count = titan::data::sanitize_utf8(c, got);
    EXPECT_EQ(hex(got), want_hex) << "input " << hex(c);
    EXPECT_EQ(count, want_count) << "input " << hex(c);
    EXPECT_EQ(titan::data::is_valid_utf8(c), count == 0) << "input " << hex(c);
    EXPECT_TRUE(titan::data::is_valid_utf8(got));
  }
}

}  // namespace
