// Typed values from text (core/parse.h): the whole string is the value, or there is none.
#include "titan/core/parse.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace {

TEST(Parse, IntegersAreWholeDecimalStrings) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-7"), -7);
  for (const char* bad : {"", " 1", "1 ", "4x", "1e3", "2.5", "0x10", "99999999999999999999"})
    EXPECT_FALSE(parse_int(bad).has_value()) << "'" << bad << "'";
}

TEST(Parse, NumbersAreWholeDecimalStrings) {
  EXPECT_EQ(parse_number("3e-4"), 3e-4);
  EXPECT_EQ(parse_number("0.5"), 0.5);
  EXPECT_EQ(parse_number("-2"), -2.0);
  EXPECT_TRUE(std::isinf(*parse_number("inf")));  // callers that need finite values say so by key
  // Below the normal range: a subnormal, or zero where even those end (as Python and TOML read them).
  EXPECT_EQ(parse_number("1e-310"), 1e-310);
  EXPECT_EQ(parse_number("1e-400"), 0.0);
  for (const char* bad : {"", " 1", "\t1", "1 ", "0x10", "0X1p3", "1e999", "abc", "1.5.2"})
    EXPECT_FALSE(parse_number(bad).has_value()) << "'" << bad << "'";
}

TEST(Parse, BooleansAreTrueOrFalse) {
  EXPECT_EQ(parse_bool("true"), true);
  EXPECT_EQ(parse_bool("false"), false);
  for (const char* bad : {"", "1", "True", " true"}) EXPECT_FALSE(parse_bool(bad).has_value()) << "'" << bad << "'";
}

}  // namespace
}  // namespace titan
