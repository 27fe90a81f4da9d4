// docs/kernels.md's tolerance table is the one the op specs generate (kernels::tolerance_table_markdown),
// so the tolerances are written once, in each op's spec.cpp. A program of its own: it must see the
// library's kernels only (the parity harness test registers deliberately wrong ones).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "test_util.h"
#include "titan/kernels/spec.h"

TEST(ToleranceTable, DocsTableIsTheOneTheSpecsGenerate) {
  std::ifstream in(titan::testing::source_dir() / "docs" / "kernels.md");
  ASSERT_TRUE(in) << "docs/kernels.md";
  std::string documented;
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| op | variant | f32: atol, rtol |", 0) == 0) in_table = true;
    if (in_table && line.rfind("|", 0) != 0) break;
    if (in_table) documented += line + "\n";
  }
  EXPECT_EQ(documented, titan::kernels::tolerance_table_markdown())
      << "docs/kernels.md's tolerance table differs from the specs': paste the generated one above";
}
