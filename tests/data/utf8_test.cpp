// UTF-8 repair against Python's bytes.decode("utf-8", errors="replace"), which follows
// the same Unicode "maximal subpart" policy.
#include "titan/data/utf8.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "data_test_util.h"

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

// Python's answer for each case: `body` (lines of a loop over `l`, a case's hex, printing 'x' + the
// result's hex and a count) run over the cases; one istringstream of "x<hex> <count>" lines.
std::istringstream python_over(const std::vector<std::string>& cases, const std::string& name,
                               const std::string& body) {
  auto dir = temp_dir(name);
  std::string input;
  for (auto& c : cases) input += hex(c) + "\n";
  write_file(dir / "in.txt", input);
  std::string out;
  EXPECT_EQ(run_command("python3 -c \"import json, sys\nfor l in open(sys.argv[1]):\n" + body + "\" " +
                            (dir / "in.txt").string(),
                        &out),
            0)
      << out;
  return std::istringstream(out);
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
  std::istringstream lines =
      python_over(cases, "utf8",
                  "  b=bytes.fromhex(l.strip()); s=b.decode('utf-8','replace')\n"
                  "  print('x'+s.encode().hex(), s.count(chr(0xfffd)) - b.count(bytes([0xef,0xbf,0xbd])))");
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

// Unpaired surrogate escapes against Python's json.loads, which keeps a lone surrogate as a code
// point of its own (and joins a pair): those code points as U+FFFD, and their count, are what the
// repaired text parses to. Random strings of surrogate escapes high and low, escaped backslashes
// before escape-like letters, other escapes and text; also cut short at the end.
TEST(Utf8, UnpairedSurrogateEscapesMatchPython) {
  const std::string pieces[] = {"\\ud83d", "\\uDE00", "\\udbff", "\\uDC00", "\\\\",    "\\\\\\ud800",
                                "ud83d",   "\\u0041", "\\n",     "a",       "\xC3\xA9"};
  std::mt19937 rng(7);
  std::vector<std::string> cases = {"\"\\ud83d\"", "\"\\ud83d\\ude00\"", "\"\\\\ud83d\""};
  for (int i = 0; i < 400; ++i) {
    std::string s = "\"";
    for (int k = rng() % 8; k > 0; --k) s += pieces[rng() % std::size(pieces)];
    cases.push_back(s + "\"");
  }
  std::istringstream lines =
      python_over(cases, "utf8_surrogates",
                  "  s=json.loads(bytes.fromhex(l.strip()).decode())\n"
                  "  lone=sum(0xD800 <= ord(c) <= 0xDFFF for c in s)\n"
                  "  s=''.join(chr(0xfffd) if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)\n"
                  "  print('x'+s.encode().hex(), lone)");
  for (std::string c : cases) {
    std::string want_hex;
    size_t want_count = 0;
    lines >> want_hex >> want_count;
    const std::string input_text = c;
    EXPECT_EQ(titan::data::repair_surrogate_escapes(c), want_count) << input_text;
    EXPECT_EQ(c.size(), input_text.size()) << input_text;
    EXPECT_EQ(hex(nlohmann::json::parse(c).get<std::string>()), want_hex.substr(1)) << input_text;
  }
  // Text cut short in or after an escape is scanned without reading past its end (a high surrogate
  // before an incomplete escape is unpaired), and stays malformed for the parser to name.
  for (const auto& [cut, count] : {std::pair{"\"\\ud83d", 1}, std::pair{"\"\\ud83d\\u", 1},
                                   std::pair{"\"\\ud83d\\ude0", 1}, std::pair{"\"\\ud8", 0}}) {
    std::string c = cut;
    EXPECT_EQ(titan::data::repair_surrogate_escapes(c), size_t(count)) << cut;
    EXPECT_THROW(nlohmann::json::parse(c), nlohmann::json::parse_error) << cut;
  }
}

}  // namespace
