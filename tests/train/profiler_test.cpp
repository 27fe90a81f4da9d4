// The op profiler ([profiling], core/op_timeline.h, train/profiler.h): a timeline's spans tile the
// time from its first mark to its end; an op's forward and each backward node land in spans of
// their own, named after the op and the module it ran in; kernels a backward node calls stay in
// its span; marks are no-ops unless a timeline records, and only on its thread. Through the
// binary: traces at torchtitan's path every profile_freq steps, the table in the log, validation's
// ops outside the training ops, and losses equal to a run without profiling.
#include "titan/train/profiler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "models/small_args.h"
#include "test_util.h"
#include "train_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/core/op_timeline.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/train/job_config.h"

using namespace titan;
using profiling::Span;
using profiling::SpanKind;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

// The spans of one forward + backward of a two-layer model, after a "data" phase mark.
std::vector<Span> profile_a_step(qwen3::Checkpointing checkpointing) {
  qwen3::Qwen3Model model(tt::small_args(2, false), DType::F32);
  model.set_checkpointing(checkpointing);
  model.initialize(5, qwen3::InitScheme::HuggingFace);
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> tok(0, 999);
  std::vector<int64_t> ids(32), targets(32);
  for (auto& t : ids) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  profiling::Timeline timeline(device_services(Device::CPU));
  profiling::mark_phase("data");
  qwen3::LossOutput out = model.forward_loss(Tensor::from_vector(ids, {2, 16}), Tensor::from_vector(targets, {2, 16}));
  autograd::backward(out.loss);
  return timeline.finish();
}

std::multiset<std::string> names_of(const std::vector<Span>& spans, SpanKind kind) {
  std::multiset<std::string> names;
  for (const Span& s : spans)
    if (s.kind == kind) names.insert(s.name);
  return names;
}

void expect_tiling(const std::vector<Span>& spans) {
  ASSERT_FALSE(spans.empty());
  EXPECT_EQ(spans.front().start, 0.0);
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_GE(spans[i].seconds, 0.0) << spans[i].name;
    if (i + 1 < spans.size()) {
      EXPECT_NEAR(spans[i].start + spans[i].seconds, spans[i + 1].start, 1e-9) << "gap after span " << i;
    }
  }
}

}  // namespace

TEST(OpTimeline, AForwardAndBackwardTileTheTimelineOpByOp) {
  const std::vector<Span> spans = profile_a_step(qwen3::Checkpointing::none());
  expect_tiling(spans);
  EXPECT_EQ(spans.front().name, "data");
  EXPECT_EQ(spans.front().kind, SpanKind::Phase);

  // The forward, op by op: one attention per layer, run in that layer's module.
  const auto forward = names_of(spans, SpanKind::Forward);
  for (const char* op : {"embedding", "rms_norm", "linear", "rope", "attention", "swiglu", "linear_cross_entropy"})
    EXPECT_GT(forward.count(op), 0u) << op << " has no forward span";
  EXPECT_EQ(forward.count("attention"), 2u);
  std::vector<std::string> attention_modules;
  for (const Span& s : spans)
    if (s.kind == SpanKind::Forward && s.name == "attention") attention_modules.push_back(s.module);
  EXPECT_EQ(attention_modules, (std::vector<std::string>{"layers.0.attention", "layers.1.attention"}));

  // The backward: each node once, named after its op and the module its forward ran in; the
  // kernels a node calls (its gradient accumulations too) add no span of their own, so no forward
  // span follows the first backward one.
  size_t first_backward = spans.size();
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].kind == SpanKind::Backward) {
      first_backward = std::min(first_backward, i);
    } else {
      EXPECT_LT(i, first_backward) << spans[i].name << " (not a backward node) inside the backward";
    }
  ASSERT_LT(first_backward, spans.size());
  EXPECT_EQ(spans[first_backward].name, "linear_cross_entropy");
  EXPECT_EQ(spans[first_backward].module, "output");
  std::vector<std::string> backward_attention;
  for (const Span& s : spans)
    if (s.kind == SpanKind::Backward && s.name == "attention") backward_attention.push_back(s.module);
  EXPECT_EQ(backward_attention, (std::vector<std::string>{"layers.1.attention", "layers.0.attention"}));
  EXPECT_EQ(names_of(spans, SpanKind::Backward).count("linear"), forward.count("linear"));
}

TEST(OpTimeline, ARecomputedLayerHoldsItsForwardAndItsNodesFollowAsSpans) {
  const std::vector<Span> spans = profile_a_step(qwen3::Checkpointing::full());
  expect_tiling(spans);
  // Each recompute node: one span for the forward it reruns, one after its layer's nodes.
  const auto backward = names_of(spans, SpanKind::Backward);
  EXPECT_EQ(backward.count("recompute:layers.0"), 2u);
  EXPECT_EQ(backward.count("recompute:layers.1"), 2u);
  // The layers' own nodes, recorded by the recompute, run as nested backward spans named after
  // the modules the recomputed ops ran in.
  std::vector<std::string> attention;
  for (const Span& s : spans)
    if (s.kind == SpanKind::Backward && s.name == "attention") attention.push_back(s.module);
  EXPECT_EQ(attention, (std::vector<std::string>{"layers.1.attention", "layers.0.attention"}));
  // Layer 1's spans in order: recompute, its nodes, recompute again, then layer 0's.
  std::vector<std::string> order;
  for (const Span& s : spans)
    if (s.kind == SpanKind::Backward && (s.name.rfind("recompute:", 0) == 0 || s.name == "attention"))
      order.push_back(s.name);
  EXPECT_EQ(order, (std::vector<std::string>{"recompute:layers.1", "attention", "recompute:layers.1",
                                             "recompute:layers.0", "attention", "recompute:layers.0"}));
  // The recompute's forward ops stay inside its span: forward spans are the first forward's only.
  EXPECT_EQ(names_of(spans, SpanKind::Forward).count("attention"), 2u);
}

// Selective checkpointing, one layer in 2 as torchtitan counts: of the two layers, layer 1 alone is
// recomputed.
TEST(OpTimeline, SelectiveCheckpointingRecomputesOneLayerInTwo) {
  const auto backward = names_of(profile_a_step(qwen3::Checkpointing::every_nth(2)), SpanKind::Backward);
  EXPECT_EQ(backward.count("recompute:layers.1"), 2u);
  EXPECT_EQ(backward.count("recompute:layers.0"), 0u);
}

TEST(OpTimeline, MarksAreNoOpsUnlessRecordingAndOnlyOnTheRecordingThread) {
  EXPECT_FALSE(profiling::recording());
  profiling::mark_op("add", "");  // nothing records: no effect
  profiling::mark_phase("data");
  profiling::Timeline timeline(device_services(Device::CPU));
  EXPECT_TRUE(profiling::recording());
  const std::string second = tt::error_of([] { profiling::Timeline another(device_services(Device::CPU)); });
  EXPECT_NE(second.find("already recording"), std::string::npos) << second;
  std::thread([] {
    profiling::mark_op("add", "elsewhere");
    profiling::mark_phase("elsewhere");
  }).join();
  profiling::mark_phase("mine");
  const std::vector<Span> spans = timeline.finish();
  EXPECT_FALSE(profiling::recording());
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].name, "mine");
}

TEST(OpTimeline, OpsAfterAPhaseThatHoldsThemAddNoSpans) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  profiling::Timeline timeline(device_services(Device::CPU));
  profiling::mark_phase("evaluation", /*ops_inside=*/true);
  ops::add(a, a);
  profiling::mark_phase("training");
  ops::add(a, a);
  const std::vector<Span> spans = timeline.finish();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "evaluation");
  EXPECT_EQ(spans[1].name, "training");
  EXPECT_EQ(spans[2].name, "add");
  EXPECT_EQ(spans[2].kind, SpanKind::Forward);
}

TEST(ProfileTable, RowsSumAnOpsForwardAndBackwardAndTheTableTotals) {
  const std::vector<Span> spans = {
      {"step", "", SpanKind::Phase, 0.0, 0.5, 0},
      {"attention", "layers.0.attention", SpanKind::Forward, 0.5, 1.0, 0},
      {"attention", "layers.1.attention", SpanKind::Forward, 1.5, 1.0, 0},
      {"recompute:layers.1", "layers.1", SpanKind::Backward, 2.5, 0.25, 0},
      {"attention", "layers.1.attention", SpanKind::Backward, 2.75, 3.0, 0},
      {"recompute:layers.0", "layers.0", SpanKind::Backward, 5.75, 0.25, 0},
  };
  const std::vector<train::ProfileRow> rows = train::profile_rows(spans);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "attention");  // most time first
  EXPECT_EQ(rows[0].calls, 2);
  EXPECT_DOUBLE_EQ(rows[0].forward_seconds, 2.0);
  EXPECT_DOUBLE_EQ(rows[0].backward_seconds, 3.0);
  EXPECT_EQ(rows[1].name, "recompute");  // "recompute:layers.N" rows as one
  EXPECT_EQ(rows[1].calls, 0);
  EXPECT_DOUBLE_EQ(rows[1].backward_seconds, 0.5);
  EXPECT_EQ(rows[2].name, "step");
  EXPECT_EQ(rows[2].kind, SpanKind::Phase);

  const std::vector<std::string> table = train::profile_table(rows, 6.0);
  ASSERT_EQ(table.size(), 5u);  // header, three rows, total
  EXPECT_NE(table[1].find("attention"), std::string::npos);
  EXPECT_NE(table[1].find("83.33%"), std::string::npos) << table[1];
  EXPECT_NE(table[3].find("[step]"), std::string::npos) << table[3];
  EXPECT_NE(table[4].find("6.000000"), std::string::npos) << table[4];
}

TEST(ChromeTrace, EverySpanIsAnEventAndEveryStepToo) {
  const std::vector<Span> spans = {
      {"step", "", SpanKind::Phase, 0.0, 0.001, 0},
      {"linear", "layers.0.attention", SpanKind::Forward, 0.001, 0.002, 1 << 30},
      {"linear", "layers.0.attention", SpanKind::Backward, 0.003, 0.004, 1 << 30},
      {"between steps", "", SpanKind::Phase, 0.007, 0.001, 0},
      {"step", "", SpanKind::Phase, 0.008, 0.001, 0},
      {"adamw", "", SpanKind::Forward, 0.009, 0.003, 0},
      {"between steps", "", SpanKind::Phase, 0.012, 0.001, 0},
  };
  const nlohmann::json trace = nlohmann::json::parse(train::chrome_trace(spans, 3, "cpu", 41));
  std::vector<nlohmann::json> steps, ops;
  int counters = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "C") ++counters;
    if (e.at("ph") != "X") continue;
    EXPECT_EQ(e.at("pid"), 3);
    (e.at("cat") == "step" ? steps : ops).push_back(e);
  }
  EXPECT_EQ(counters, int(spans.size()));
  ASSERT_EQ(ops.size(), spans.size());
  EXPECT_EQ(ops[2].at("name"), "linear (backward)");
  EXPECT_EQ(ops[2].at("args").at("module"), "layers.0.attention");
  EXPECT_DOUBLE_EQ(ops[2].at("ts").get<double>(), 3000.0);  // microseconds
  EXPECT_DOUBLE_EQ(ops[2].at("dur").get<double>(), 4000.0);
  // A step runs from its "step" mark to its "between steps" mark.
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].at("name"), "step 41");
  EXPECT_DOUBLE_EQ(steps[0].at("dur").get<double>(), 7000.0);
  EXPECT_EQ(steps[1].at("name"), "step 42");
  EXPECT_DOUBLE_EQ(steps[1].at("ts").get<double>(), 8000.0);
}

TEST(ChromeTrace, ReadsBackAsTheSpansItWasWrittenFrom) {
  const std::vector<Span> spans = {
      {"step", "", SpanKind::Phase, 0.0, 0.001, 0},
      {"attention", "layers.0.attention", SpanKind::Forward, 0.001, 0.25, 0},
      {"recompute:layers.0", "layers.0", SpanKind::Backward, 0.251, 0.5, 0},
      {"between steps", "", SpanKind::Phase, 0.751, 0.002, 0},
  };
  const std::vector<Span> back = train::spans_of_chrome_trace(train::chrome_trace(spans, 0, "cpu", 7), "t.json");
  ASSERT_EQ(back.size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(back[i].name, spans[i].name);
    EXPECT_EQ(back[i].module, spans[i].module);
    EXPECT_EQ(back[i].kind, spans[i].kind);
    EXPECT_NEAR(back[i].start, spans[i].start, 1e-12);
    EXPECT_NEAR(back[i].seconds, spans[i].seconds, 1e-12);
  }
  const std::string err = tt::error_of([] { train::spans_of_chrome_trace("{\"events\": []}", "bad.json"); });
  EXPECT_NE(err.find("bad.json: not a Chrome trace"), std::string::npos) << err;
}

TEST(Profiling, TrainingWritesATraceEveryFreqStepsAndIsUnchangedByIt) {
  const tt::Overrides common = {{"training.steps", "4"},   {"training.deterministic", "true"},
                                {"validation.enable", "true"}, {"validation.freq", "2"},
                                {"validation.steps", "1"}};
  auto train = [&](const fs::path& dump, const tt::Overrides& extra) {
    std::string out;
    const int rc = tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                                       tt::cli_args(tt::tiny_job(dump, tt::joined(common, extra))),
                                   &out);
    EXPECT_EQ(rc, 0) << out;
    return out;
  };
  const fs::path on = tt::temp_dir("profiling_on"), off = tt::temp_dir("profiling_off");
  const std::string out = train(on, {{"profiling.enable_profiling", "true"}, {"profiling.profile_freq", "2"}});
  train(off, {});

  // Traces at torchtitan's path for steps 2 and 4, each of one step with its ops; the table in the log.
  std::set<std::string> iterations;
  for (auto& e : fs::directory_iterator(on / "profile_traces")) iterations.insert(e.path().filename().string());
  EXPECT_EQ(iterations, (std::set<std::string>{"iteration_2", "iteration_4"}));
  for (int step : {2, 4}) {
    const fs::path trace = on / "profile_traces" / ("iteration_" + std::to_string(step)) / "rank0_trace.json";
    std::ifstream f(trace);
    ASSERT_TRUE(f) << trace;
    const nlohmann::json j = nlohmann::json::parse(f);
    std::map<std::string, int> forward;
    std::vector<std::string> steps;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      if (e.at("cat") == "forward") ++forward[e.at("name").get<std::string>()];
      if (e.at("cat") == "step") steps.push_back(e.at("name"));
    }
    EXPECT_EQ(steps, std::vector<std::string>{"step " + std::to_string(step)});
    // One training forward: validation's passes (steps 2 and 4 validate) are in "between steps".
    EXPECT_EQ(forward["linear_cross_entropy"], 1) << trace;
    EXPECT_EQ(forward["attention"], 2) << trace;  // the tiny job's two layers
    EXPECT_GT(forward["adamw"], 0) << trace;
    EXPECT_NE(out.find("profile of step " + std::to_string(step) + " on cpu"), std::string::npos) << out;
  }
  EXPECT_NE(out.find("linear_cross_entropy"), std::string::npos) << out;

  // Profiling changes nothing in the training: the same losses and gradient norms, bit for bit.
  const auto losses_on = tt::by_step(tt::read_metrics(on), "loss"), losses_off = tt::by_step(tt::read_metrics(off), "loss");
  EXPECT_EQ(losses_on, losses_off);
  EXPECT_EQ(tt::by_step(tt::read_metrics(on), "grad_norm"), tt::by_step(tt::read_metrics(off), "grad_norm"));
  EXPECT_EQ(losses_on.size(), 4u);
}

TEST(Profiling, ActiveStepsShareOneTracePerCycle) {
  const fs::path dump = tt::temp_dir("profiling_active");
  std::string out;
  const int rc = tt::run_command(
      tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
          tt::cli_args(tt::tiny_job(dump, {{"training.steps", "6"},
                                           {"profiling.enable_profiling", "true"},
                                           {"profiling.profile_freq", "3"},
                                           {"profiling.profiler_active", "2"}})),
      &out);
  ASSERT_EQ(rc, 0) << out;
  for (auto [iteration, first] : {std::pair{3, 2}, std::pair{6, 5}}) {
    std::ifstream f(dump / "profile_traces" / ("iteration_" + std::to_string(iteration)) / "rank0_trace.json");
    ASSERT_TRUE(f) << "no trace for iteration " << iteration;
    const nlohmann::json trace = nlohmann::json::parse(f);
    std::vector<std::string> steps;
    for (const auto& e : trace.at("traceEvents"))
      if (e.at("ph") == "X" && e.at("cat") == "step") steps.push_back(e.at("name"));
    EXPECT_EQ(steps, (std::vector<std::string>{"step " + std::to_string(first), "step " + std::to_string(first + 1)}));
    EXPECT_NE(out.find("profile of steps " + std::to_string(first) + "-" + std::to_string(iteration)), std::string::npos)
        << out;
  }
}

TEST(Profiling, ARunThatEndsInsideAWindowSaysItWroteNoTrace) {
  const fs::path dump = tt::temp_dir("profiling_cut");
  std::string out;
  const int rc = tt::run_command(tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
                                     tt::cli_args(tt::tiny_job(dump, {{"training.steps", "3"},
                                                                      {"profiling.enable_profiling", "true"},
                                                                      {"profiling.profile_freq", "4"},
                                                                      {"profiling.profiler_active", "2"}})),
                                 &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("profiling: the run ended at step 3, before the end of the profiled window (steps 3-4): no "
                     "trace written"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dump / "profile_traces"));
}

TEST(Profiling, TorchtitanKeysAndBadValues) {
  const fs::path dump = tt::temp_dir("profiling_keys");
  // Older spellings apply as today's keys; the warm-up count has nothing to set.
  train::JobConfig c = tt::tiny_config(
      dump, {{"profiling.run_profiler", "true"}, {"profiling.profile_every_x_iter", "5"}, {"profiling.profiler_warmup", "2"}});
  EXPECT_TRUE(c.profiling.enable_profiling);
  EXPECT_EQ(c.profiling.profile_freq, 5);
  bool warmup_note = false;
  for (const std::string& n : c.notes) warmup_note |= n.find("profiling.profiler_warmup") != std::string::npos;
  EXPECT_TRUE(warmup_note);

  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{{"profiling.profile_freq", "0"},
                                                                            {"profiling.profiler_active", "0"},
                                                                            {"profiling.profiler_active", "11"},
                                                                            {"profiling.save_traces_folder", ""}}) {
    train::JobConfig bad = tt::tiny_config(dump, {{"profiling.enable_profiling", "true"}, {key, value}});
    const std::string err = tt::error_of([&] { bad.validate(1); });
    EXPECT_NE(err.find(key), std::string::npos) << key << " = " << value << ": " << err;
    // As torchtitan: the settings of a profiler that is off are not read.
    train::JobConfig off = tt::tiny_config(dump, {{key, value}});
    EXPECT_EQ(tt::error_of([&] { off.validate(1); }), "") << key << " = " << value;
  }
}
