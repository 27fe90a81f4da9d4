#include "titan/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "test_util.h"
#include "titan/core/check.h"

using namespace titan;
using namespace titan::train;
using namespace titan::testing;

namespace {

const DecayType kTypes[] = {DecayType::Linear, DecayType::Sqrt, DecayType::Cosine};

double decay_curve(DecayType t, double p) {
  switch (t) {
    case DecayType::Linear:
      return 1 - p;
    case DecayType::Sqrt:
      return 1 - std::sqrt(p);
    case DecayType::Cosine:
      return 0.5 * (1 + std::cos(std::numbers::pi * p));
  }
  return NAN;
}

std::string error_of(const LrScheduleConfig& c) {
  try {
    LrSchedule s(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(LrSchedule, BoundariesOfEachPhase) {
  // 100 steps, 10 warmup, decay over the last 20%: stable covers indices 10..80 (71 = 100 + 1 - 10 - 20).
  for (DecayType type : kTypes)
    for (double min_f : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(decay_type_name(type)) + " min " + std::to_string(min_f));
      LrSchedule s({.lr = 1e-3,
                    .steps = 100,
                    .warmup_steps = 10,
                    .decay_ratio = 0.2,
                    .decay_type = type,
                    .min_lr_factor = min_f});
      EXPECT_EQ(s.warmup_steps(), 10);
      EXPECT_EQ(s.decay_steps(), 20);
      EXPECT_EQ(s.stable_steps(), 71);
      EXPECT_TRUE(s.adjustment().empty());
      EXPECT_DOUBLE_EQ(s.factor(0), 0.1);  // first step: 1 / warmup
      EXPECT_DOUBLE_EQ(s.factor(4), 0.5);
      EXPECT_DOUBLE_EQ(s.factor(9), 1.0);   // warmup ends at full lr
      EXPECT_DOUBLE_EQ(s.factor(10), 1.0);  // stable
      EXPECT_DOUBLE_EQ(s.factor(80), 1.0);  // last stable index
      const double first = min_f + (1 - min_f) * decay_curve(type, 1.0 / 20);
      EXPECT_DOUBLE_EQ(s.factor(81), first);  // decay starts one step down
      EXPECT_DOUBLE_EQ(s.factor(99),
                       min_f + (1 - min_f) * decay_curve(type, 19.0 / 20));  // last trained step
      EXPECT_DOUBLE_EQ(s.factor(100), min_f);  // the virtual step after the run reaches the floor
      EXPECT_DOUBLE_EQ(s.lr(4), 5e-4);
      for (int64_t i = 10; i < 100; ++i) {
        EXPECT_LE(s.factor(i + 1), s.factor(i)) << i;
        EXPECT_GE(s.factor(i + 1), min_f) << i;
      }
    }
}

TEST(LrSchedule, NoWarmupAndDefaultDecay) {
  // decay_ratio unset: decay over everything after warmup, with a single stable step.
  LrSchedule s({.steps = 10, .warmup_steps = 0});
  EXPECT_EQ(s.decay_steps(), 10);
  EXPECT_EQ(s.stable_steps(), 1);
  EXPECT_DOUBLE_EQ(s.factor(0), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(1), 0.9);
  EXPECT_DOUBLE_EQ(s.factor(9), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(10), 0.0);
  // decay_ratio 0: warmup then constant.
  LrSchedule c({.steps = 10, .warmup_steps = 4, .decay_ratio = 0.0});
  EXPECT_EQ(c.decay_steps(), 0);
  EXPECT_DOUBLE_EQ(c.factor(0), 0.25);
  for (int64_t i = 3; i <= 10; ++i) EXPECT_DOUBLE_EQ(c.factor(i), 1.0);
  // Warmup over the whole run.
  LrSchedule w({.steps = 5, .warmup_steps = 5, .decay_ratio = 0.0});
  EXPECT_DOUBLE_EQ(w.factor(4), 1.0);
}

TEST(LrSchedule, DecayStepsRoundLikePythonAndShrinkToFit) {
  EXPECT_EQ(LrSchedule({.steps = 10, .warmup_steps = 0, .decay_ratio = 0.25}).decay_steps(), 2);  // 2.5 -> 2
  EXPECT_EQ(LrSchedule({.steps = 10, .warmup_steps = 0, .decay_ratio = 0.75}).decay_steps(), 8);  // 7.5 -> 8
  LrSchedule s({.steps = 10, .warmup_steps = 6, .decay_ratio = 0.5});
  EXPECT_EQ(s.decay_steps(), 4);
  EXPECT_EQ(s.stable_steps(), 1);
  EXPECT_NE(s.adjustment().find("decay shortened to 4"), std::string::npos) << s.adjustment();
}

TEST(LrSchedule, MatchesTorchtitanFormula) {
  // torchtitan's build_lr_schedulers + linear_warmup_stable_decay, transcribed into Python.
  if (run_command("/usr/bin/python3 -c 'import math'", nullptr) != 0) GTEST_SKIP() << "python3 not available";
  auto dir = temp_dir("lr_schedule_torchtitan");
  const char* script = R"PY(
import math, sys
T, W, ratio, kind, lr_min = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
if ratio != "none":
    D = round(T * float(ratio))
    if W + D > T:
        D = T - W
else:
    D = T - W
S = T + 1 - W - D
def f(i):
    ws = W + S
    if i < W:
        return float((i + 1) / W)
    if i < ws:
        return 1.0
    p = float(i + 1 - ws) / D
    a = {"linear": 1 - p, "sqrt": 1 - math.sqrt(p), "cosine": 0.5 * (1.0 + math.cos(math.pi * p))}[kind]
    return lr_min + (1 - lr_min) * a
print(" ".join(repr(f(i)) for i in range(T + 1)))
)PY";
  std::ofstream(dir / "wsd.py") << script;
  struct Case {
    int64_t steps, warmup;
    std::optional<double> ratio;
    double min_f;
  };
  const Case cases[] = {
      {1000, 200, std::nullopt, 0.0}, {37, 5, 0.3, 0.1}, {10, 6, 0.5, 0.0}, {8, 0, 1.0, 0.2}};
  for (const Case& cs : cases)
    for (DecayType type : kTypes) {
      std::ostringstream cmd;
      cmd.precision(17);
      cmd << "/usr/bin/python3 " << (dir / "wsd.py").string() << " " << cs.steps << " " << cs.warmup << " ";
      if (cs.ratio)
        cmd << *cs.ratio;
      else
        cmd << "none";
      cmd << " " << decay_type_name(type) << " " << cs.min_f;
      std::string out;
      ASSERT_EQ(run_command(cmd.str(), &out), 0) << out;
      std::istringstream in(out);
      LrSchedule s({.steps = cs.steps,
                    .warmup_steps = cs.warmup,
                    .decay_ratio = cs.ratio,
                    .decay_type = type,
                    .min_lr_factor = cs.min_f});
      for (int64_t i = 0; i <= cs.steps; ++i) {
        double want = NAN;
        ASSERT_TRUE(in >> want) << out;
        // Same operations in the same order: equal up to libm's last bit in sqrt/cos.
        ASSERT_NEAR(s.factor(i), want, 1e-15) << decay_type_name(type) << " T=" << cs.steps << " step " << i;
      }
    }
}

TEST(LrSchedule, InvalidConfigNamesTheField) {
  EXPECT_NE(error_of({.lr = -1e-3}).find("optimizer.lr = -0.001 must be finite and >= 0"), std::string::npos);
  EXPECT_NE(error_of({.steps = 0}).find("training.steps = 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of({.steps = 10, .warmup_steps = 11})
                .find("lr_scheduler.warmup_steps = 11 must not exceed training.steps = 10"),
            std::string::npos);
  EXPECT_NE(error_of({.warmup_steps = -1}).find("lr_scheduler.warmup_steps = -1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of({.decay_ratio = -0.1}).find("lr_scheduler.decay_ratio = -0.1 must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of({.decay_ratio = 1.5}).find("lr_scheduler.decay_ratio = 1.5 must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of({.min_lr_factor = 2}).find("lr_scheduler.min_lr_factor = 2 must be in [0, 1]"),
            std::string::npos);
  try {
    decay_type_from_name("exponential");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr_scheduler.decay_type = 'exponential'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(decay_type_from_name("cosine"), DecayType::Cosine);
  LrSchedule s({.steps = 10, .warmup_steps = 2});
  EXPECT_THROW(s.factor(-1), Error);
  EXPECT_THROW(s.factor(11), Error);
}

TEST(LrSchedule, StateDictDescribesTheSchedule) {
  LrSchedule s(
      {.lr = 3e-4, .steps = 50, .warmup_steps = 5, .decay_ratio = 0.2, .decay_type = DecayType::Cosine});
  nlohmann::json saved = nlohmann::json::parse(s.state_dict().dump());
  EXPECT_EQ(saved["decay_steps"], 10);
  EXPECT_EQ(saved["decay_type"], "cosine");
  EXPECT_EQ(s.diff_state(saved), "");
  LrSchedule longer(
      {.lr = 3e-4, .steps = 60, .warmup_steps = 5, .decay_ratio = 0.2, .decay_type = DecayType::Cosine});
  std::string d = longer.diff_state(saved);
  EXPECT_NE(d.find("steps: saved 50, now 60"), std::string::npos) << d;
  EXPECT_NE(d.find("decay_steps: saved 10, now 12"), std::string::npos) << d;
  EXPECT_NE(s.diff_state(nlohmann::json::array()), "");
}
