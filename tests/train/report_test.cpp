// `titan report`: the page charts real runs, overlaid, with their configs; it is self-contained;
// and a real browser (headless Chromium) renders it without console errors, its pixels showing
// every run's curves.
#include "titan/train/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "test_util.h"
#include "tiny_job.h"
#include "titan/core/check.h"
#include "titan/train/log.h"
#include "titan/train/metrics.h"

namespace {
namespace fs = std::filesystem;
namespace tt = titan::testing;
using json = nlohmann::json;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A 4-step run of a tiny debugmodel through the binary, into `dump`.
// Without [validation] (configs/debugmodel.toml enables it): the dashed held-out curve is
// ValidationLossIsDashedAndBadRunFoldersAreNamed's subject; here each chart holds one curve per run.
void train_tiny(const fs::path& dump, const std::string& lr, const std::string& extra = "") {
  std::string out;
  std::string cmd = tt::titan_binary().string() + " train --config " + (tt::source_dir() / "configs" / "debugmodel.toml").string() +
                    " --job.dump_folder=" + dump.string() + " --optimizer.lr=" + lr +
                    " --training.steps=4 --training.seq_len=32 --model.n_layers=1 --model.dim=64 --model.n_heads=2"
                    " --model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=128 --lr_scheduler.warmup_steps=2"
                    " --metrics.log_freq=1 --checkpoint.enable=false --checkpoint.last_save_in_hf=false"
                    " --validation.enable=false" + extra;
  ASSERT_EQ(tt::run_command(cmd, &out), 0) << out;
}

// Headless Chromium's command line: no network, no profile reuse, logs (console messages
// included) on stderr.
std::string chromium_command(const fs::path& chromium, const fs::path& profile) {
  // `timeout`: a browser that hangs fails the test instead of stalling the suite.
  return "timeout 120 " + chromium.string() +
         " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-quic --no-first-run"
         " --disable-background-networking"
         " --disable-component-update --disable-sync --user-data-dir=" + profile.string() +
         " --enable-logging=stderr --v=0";
}

fs::path find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (fs::exists(p)) return p;
  return {};
}

// Console messages in Chromium's log ("...:INFO:CONSOLE:1] "message", source: ...").
std::string console_lines(const std::string& log) {
  std::string lines, line;
  std::istringstream in(log);
  while (std::getline(in, line))
    if (line.find(":CONSOLE") != std::string::npos) lines += line + "\n";
  return lines;
}

TEST(Report, TwoRealRunsOverlaidAndRenderedByChromium) {
  const fs::path dir = tt::temp_dir("report_runs");
  train_tiny(dir / "slow_lr", "8e-4");
  // The fast run also profiles steps 2 and 4 ([profiling]): the page tables the newest.
  train_tiny(dir / "fast_lr", "3e-3", " --profiling.enable_profiling=true --profiling.profile_freq=2");
  const fs::path page = dir / "report.html";
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " report " + (dir / "slow_lr").string() + " " +
                                (dir / "fast_lr").string() + " --out " + page.string(),
                            &out),
            0)
      << out;
  const std::string html = read_file(page);

  // Self-contained: no script, no external resource; the only URL is the SVG namespace.
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_EQ(count(html, "src="), 0u);
  EXPECT_EQ(count(html, "href"), 0u);
  EXPECT_EQ(count(html, "url("), 0u);
  EXPECT_EQ(count(html, "http"), count(html, "http://www.w3.org/2000/svg") + 1);  // + the http-equiv meta
  // One chart per metric, each with both runs' curves in their colours, the warm-up step marked.
  const size_t charts = titan::train::report_charts().size();
  EXPECT_EQ(count(html, "<svg"), charts);
  EXPECT_EQ(count(html, "<polyline"), 2 * charts);
  for (size_t run = 0; run < 2; ++run)
    EXPECT_EQ(count(html, "stroke=\"" + titan::train::run_colour(run) + "\" stroke-width"), charts);
  EXPECT_EQ(count(html, "<title>warm-up step 1</title>"), 2 * charts);
  // The legend and each run's config in effect and versions.
  EXPECT_NE(html.find("slow_lr"), std::string::npos);
  EXPECT_NE(html.find("fast_lr"), std::string::npos);
  EXPECT_NE(html.find("optimizer.lr = 0.003"), std::string::npos);
  EXPECT_NE(html.find("optimizer.lr = 8e-04"), std::string::npos);
  EXPECT_NE(html.find("<th>compiler</th>"), std::string::npos);
  EXPECT_EQ(count(html, "<tr><th>ranks</th><td>one process</td></tr>"), 2u);
  // The profiled run's newest profile, one row per op with a bar in its colour; none for the other.
  EXPECT_EQ(count(html, "<h3>where the time went: iteration_4 (rank 0, "), 1u);
  EXPECT_EQ(count(html, "<h3>where the time went"), 1u);
  EXPECT_EQ(count(html, "<tr><td>linear_cross_entropy</td><td>1</td>"), 1u);
  EXPECT_EQ(count(html, "<tr><td>attention</td><td>1</td>"), 1u);  // one layer
  EXPECT_GT(count(html, "class=\"bar\" style=\"width:"), 5u);
  EXPECT_EQ(count(html, ";background:" + titan::train::run_colour(0) + "\"></i></td></tr>"), 0u);

  const fs::path chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it): the browser check did not run";

  // The console detector sees a console error when there is one.
  const fs::path bad = dir / "console_error.html";
  {
    std::ofstream(bad) << "<!DOCTYPE html><html><body><script>console.error('detector check')</script></body></html>";
  }
  std::string log;
  tt::run_command(chromium_command(chromium, tt::temp_dir("report_chromium_a")) + " --dump-dom file://" + bad.string(), &log);
  ASSERT_NE(console_lines(log).find("detector check"), std::string::npos) << log;

  // The report: the DOM Chromium built holds the charts, and nothing reached the console.
  log.clear();
  ASSERT_EQ(tt::run_command(chromium_command(chromium, tt::temp_dir("report_chromium_b")) + " --dump-dom file://" +
                                page.string(),
                            &log),
            0)
      << log;
  EXPECT_EQ(count(log, "<svg"), charts) << log;
  EXPECT_EQ(console_lines(log), "");

  // The screenshot's pixels: each run's colour covers far more than its legend swatches
  // (2 x 26 x 4 pixels), i.e. the curves were drawn.
  const fs::path shot = dir / "report.png";
  log.clear();
  ASSERT_EQ(tt::run_command(chromium_command(chromium, tt::temp_dir("report_chromium_c")) +
                                " --window-size=1200,1400 --screenshot=" + shot.string() + " file://" + page.string(),
                            &log),
            0)
      << log;
  EXPECT_EQ(console_lines(log), "");
  ASSERT_TRUE(fs::exists(shot)) << log;
  std::string counted;
  ASSERT_EQ(tt::run_command("python3 " + (tt::source_dir() / "tests" / "train" / "png_colours.py").string() + " " +
                                shot.string() + " " + titan::train::run_colour(0).substr(1) + " " +
                                titan::train::run_colour(1).substr(1),
                            &counted),
            0)
      << counted;
  json pixels = json::parse(counted);
  EXPECT_EQ(pixels["width"], 1200);
  for (size_t run = 0; run < 2; ++run) {
    const std::string colour = titan::train::run_colour(run).substr(1);
    EXPECT_GT(pixels["counts"][colour].get<int>(), 2000) << "run " << run << " (#" << colour << "): " << counted;
  }
}

TEST(Report, ValidationLossIsDashedAndBadRunFoldersAreNamed) {
  const fs::path dir = tt::temp_dir("report_val");
  // A run that logs a validation loss on some steps (titan does not yet; other tools' runs may).
  fs::create_directories(dir / "with_val");
  {
    std::ofstream f(dir / "with_val" / "metrics.jsonl");
    for (int step = 1; step <= 6; ++step) {
      json r = {{"step", step}, {"loss", 10.0 - step}, {"grad_norm", 1.0}, {"lr", 1e-3}, {"warmup", step == 1}};
      if (step % 2 == 0) r["val_loss"] = 10.5 - step;
      f << r.dump() << "\n";
    }
  }
  titan::train::RunRecord run = titan::train::read_run(dir / "with_val");
  EXPECT_EQ(run.series.at("val_loss").size(), 3u);
  EXPECT_EQ(run.warmup_steps, std::vector<long>({1}));
  const std::string html = titan::train::render_report({run});
  EXPECT_EQ(count(html, "stroke-dasharray"), 1u);
  EXPECT_NE(html.find("with_val val_loss"), std::string::npos);
  EXPECT_NE(html.find("not logged by these runs"), std::string::npos);  // tps, mfu, memory are absent
  EXPECT_NE(html.find("no run_info.json"), std::string::npos);
  EXPECT_EQ(html.find("<h3>titan check</h3>"), std::string::npos);  // no check.json: no table

  // A run folder holding `titan check --json` output shows its rows, FAIL marked.
  std::ofstream(dir / "with_val" / "check.json")
      << json{{"rows", {{{"check", "versions"}, {"status", "PASS"}, {"value", "titan v1"}, {"rule", "listed"}},
                        {{"check", "export"}, {"status", "FAIL"}, {"value", "tensor x differs"}, {"rule", "bit-equal"}}}}}
             .dump();
  const std::string checked = titan::train::render_report({titan::train::read_run(dir / "with_val")});
  EXPECT_NE(checked.find("<h3>titan check</h3>"), std::string::npos);
  EXPECT_NE(checked.find("<td class=\"fail\">FAIL</td><td>tensor x differs</td><td>bit-equal</td>"), std::string::npos);
  EXPECT_NE(checked.find("<td>versions</td><td class=\"ok\">PASS</td>"), std::string::npos);

  auto error_of = [](const fs::path& d) {
    try {
      titan::train::read_run(d);
    } catch (const titan::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of(dir / "missing");
  EXPECT_NE(e.find("report: '" + (dir / "missing").string() +
                   "' does not exist (give a run's dump_folder, or its metrics.jsonl)"),
            std::string::npos)
      << e;
  fs::create_directories(dir / "empty");
  e = error_of(dir / "empty");
  EXPECT_NE(
      e.find("report: '" + (dir / "empty").string() + "' holds no metrics.jsonl: is it a run's dump_folder?"),
      std::string::npos)
      << e;
  fs::create_directories(dir / "broken");
  std::ofstream(dir / "broken" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\"\n";
  e = error_of(dir / "broken");
  EXPECT_NE(
      e.find("report: '" + (dir / "broken" / "metrics.jsonl").string() + "', line 2: not a JSON record"),
      std::string::npos)
      << e;
  std::ofstream(dir / "broken" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 1e400}\n";  // out of range
  e = error_of(dir / "broken");
  EXPECT_NE(e.find("metrics.jsonl', line 1: not a JSON record"), std::string::npos) << e;
  // A last line cut short, without its newline (a run writing it, or stopped while it did), is left
  // out; the records before it are charted.
  std::ofstream(dir / "broken" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"lo";
  EXPECT_EQ(titan::train::read_run(dir / "broken").series.at("loss").size(), 1u);
  // A run stopped while it wrote a record (a full disk, a power loss), then resumed: the resumed
  // run drops the torn record before it appends, so the file stays one record a line and the report
  // reads it (before, the next record was appended to the torn one and every report failed there).
  {
    const fs::path run = dir / "torn";
    const std::string job =
        tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() +
        tt::cli_args(tt::tiny_job(
            run,
            {{"checkpoint.enable", "true"}, {"checkpoint.interval", "2"}, {"validation.enable", "false"}}));
    std::string out;
    ASSERT_EQ(tt::run_command(job + " --training.steps=2", &out), 0) << out;
    std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"step\": 3, \"lo";
    ASSERT_EQ(tt::run_command(job + " --training.steps=4", &out), 0) << out;
    EXPECT_NE(out.find("warning: metrics: '" + (run / "metrics.jsonl").string() +
                       "' ended in a record cut short (step 3; "),
              std::string::npos)
        << out;
    std::ifstream f(run / "metrics.jsonl");
    std::vector<int64_t> steps;
    for (std::string line; std::getline(f, line);)
      steps.push_back(json::parse(line).at("step").get<int64_t>());
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
    EXPECT_EQ(titan::train::read_run(run).series.at("loss").size(), 4u);
  }
  // A run that logged nothing yet: nothing to chart, said.
  std::ofstream(dir / "broken" / "metrics.jsonl") << "";
  e = error_of(dir / "broken");
  EXPECT_NE(e.find("metrics.jsonl' holds no record: the run logged no step (yet)"), std::string::npos) << e;
  // A record of the wrong shape is named by line and field, never charted without it.
  for (const auto& [record, says] : std::vector<std::pair<std::string, std::string>>{
           {"{\"step\": 2, \"loss\": \"abc\"}",
            "metrics.jsonl', line 2: \"loss\" of step 2 is \"abc\", not a number"},
           {"{\"step\": 2, \"loss\": 2, \"trained_tokens\": \"12\"}",
            "metrics.jsonl', line 2: \"trained_tokens\" of step 2 is \"12\", not a number"},
           {"{\"step\": 2, \"grad_norm\": 1.5}",
            "metrics.jsonl', line 2: the record of step 2 has no \"loss\""},
           {"{\"step\": -7, \"loss\": 2}", "metrics.jsonl', line 2: \"step\" is -7; steps count from 1"},
           {"{\"step\": 9999999999999999999, \"loss\": 2}",
            "metrics.jsonl', line 2: \"step\" is 9999999999999999999, past the largest step "
            "(9223372036854775807)"},
           {"{\"step\": 2, \"loss\": 2, \"warmup\": 1}",
            "metrics.jsonl', line 2: \"warmup\" of step 2 is 1, not true or false"},
           {"{\"step\": 2, \"loss\": 2, \"loss\": 3}",
            "metrics.jsonl', line 2: the key \"loss\" appears twice in one record"}}) {
    std::ofstream(dir / "broken" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n" << record << "\n";
    e = error_of(dir / "broken");
    EXPECT_NE(e.find(says), std::string::npos) << record << ": " << e;
  }
  // A value that was not finite is logged as null: that step has no point, and the rest do.
  std::ofstream(dir / "broken" / "metrics.jsonl")
      << "{\"step\": 1, \"loss\": null}\n{\"step\": 2, \"loss\": 3}\n";
  EXPECT_EQ(titan::train::read_run(dir / "broken").series.at("loss").size(), 1u);
  std::ofstream(dir / "broken" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n";
  std::ofstream(dir / "broken" / "check.json")
      << json{{"rows", {{{"check", "export"}, {"status", "MAYBE"}}}}}.dump();
  e = error_of(dir / "broken");
  EXPECT_NE(e.find("check.json': row 'export' has status 'MAYBE', not PASS, FAIL or SKIP"), std::string::npos)
      << e;
  fs::remove(dir / "broken" / "check.json");
  std::ofstream(dir / "broken" / "run_info.json") << "[]";
  e = error_of(dir / "broken");
  EXPECT_NE(e.find("run_info.json' is not a run's run_info.json"), std::string::npos) << e;
}

// Axes that read: a constant series sits mid-chart on its own scale (not on a +-0.05 axis through
// 0), neighbouring y labels differ, and a 2-step run labels both steps.
// A run resumed from an earlier checkpoint (re-logged steps, or a roll-back with
// checkpoint.load_step) logs steps again: the report keeps the newest trajectory only, so the
// abandoned steps past the point it went back to are not charted.
TEST(Report, ARolledBackRunShowsItsNewestTrajectory) {
  const fs::path dir = tt::temp_dir("report_rolled_back");
  {
    std::ofstream f(dir / "metrics.jsonl");
    for (int step = 1; step <= 5; ++step)  // the first run, to step 5
      f << json{{"step", step}, {"loss", 10.0 - step}, {"warmup", step == 1}}.dump() << "\n";
    for (int step = 3; step <= 4; ++step)  // rolled back to step 2's checkpoint, trained to step 4
      f << json{{"step", step}, {"loss", 20.0 + step}, {"warmup", step == 3}}.dump() << "\n";
  }
  const titan::train::RunRecord r = titan::train::read_run(dir);
  const std::map<long, double> want = {{1, 9.0}, {2, 8.0}, {3, 23.0}, {4, 24.0}};
  EXPECT_EQ(r.series.at("loss"), want);
  EXPECT_EQ(r.warmup_steps, (std::vector<long>{1, 3}));
  // The page says what the newest trajectory replaced.
  const std::string html = titan::train::render_report({r});
  EXPECT_NE(
      html.find(
          ", 4 logged steps; 3 records replaced by a later trajectory (steps 3-5 re-logged from step 3)</p>"),
      std::string::npos)
      << html;
  // Again, over steps logged every 10 (a resume from step 20's checkpoint logs its first step, 21,
  // then 30 again): each time said, the records counted over both.
  {
    std::ofstream f(dir / "metrics.jsonl", std::ios::app);
    for (int step : {10, 20, 30, 21, 30}) f << json{{"step", step}, {"loss", 1.0}}.dump() << "\n";
  }
  const std::string twice = titan::train::render_report({titan::train::read_run(dir)});
  EXPECT_NE(
      twice.find(
          ", 8 logged steps; 4 records replaced by a later trajectory (steps 3-5 re-logged from step 3; "
          "step 30 re-logged from step 21)</p>"),
      std::string::npos)
      << twice;
  // A run that never went back says nothing of it.
  std::ofstream(dir / "metrics.jsonl") << json{{"step", 1}, {"loss", 1.0}}.dump() << "\n";
  EXPECT_EQ(titan::train::render_report({titan::train::read_run(dir)}).find("replaced"), std::string::npos);
}

// A MoE run's balance is charted (aux loss, expert load, idle experts) from its records; a page of
// dense runs alone has no such charts, and a dense run beside a MoE one adds no curve to them.
TEST(Report, AMoeRunsBalanceIsChartedWhereSomeRunLogsIt) {
  const fs::path dir = tt::temp_dir("report_moe_" + std::to_string(getpid()));
  train_tiny(dir / "moe", "8e-4", " --model.num_experts=4 --model.top_k=2 --model.moe_hidden_dim=32");
  {
    fs::create_directories(dir / "dense");
    std::ofstream f(dir / "dense" / "metrics.jsonl");
    for (int step = 1; step <= 4; ++step) f << json{{"step", step}, {"loss", 10.0 - step}}.dump() << "\n";
  }
  // Each record titan writes starts with its step (a record cut short keeps it readable).
  {
    std::ifstream records(dir / "moe" / "metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(records, line); ++lines)
      EXPECT_EQ(line.rfind("{\"step\":", 0), 0u) << line;
    EXPECT_EQ(lines, 4);
  }
  const titan::train::RunRecord moe = titan::train::read_run(dir / "moe"),
                                dense = titan::train::read_run(dir / "dense");
  for (const char* metric : {"aux_loss", "expert_load_max", "experts_idle"})
    EXPECT_EQ(moe.series.count(metric) ? moe.series.at(metric).size() : 0u, 4u) << metric;
  const std::string both = titan::train::render_report({dense, moe});
  const std::string alone = titan::train::render_report({dense});
  for (const auto& [metric, title] : titan::train::report_moe_charts()) {
    EXPECT_EQ(count(both, "<figcaption>" + title), 1u) << title;
    EXPECT_EQ(count(alone, "<figcaption>" + title), 0u) << title;
  }
  const size_t charts = titan::train::report_charts().size() + titan::train::report_moe_charts().size();
  EXPECT_EQ(count(both, "<svg"), charts);
  // Each run's curve on the charts it logs: the dense run's loss only.
  EXPECT_EQ(count(both, "stroke=\"" + titan::train::run_colour(1) + "\" stroke-width"), charts);
  EXPECT_EQ(count(both, "stroke=\"" + titan::train::run_colour(0) + "\" stroke-width"), 1u);
}

// run_info.json's stretches: a run resumed elsewhere shows its ranks and device per stretch, up to its
// newest logged step; entries another program wrote without a step or a name are left out (one left
// is the run's own line), not an error for the whole report.
TEST(Report, ARunResumedElsewhereShowsEachStretch) {
  const fs::path dir = tt::temp_dir("report_stretches");
  {
    std::ofstream f(dir / "metrics.jsonl");
    for (int step = 1; step <= 7; ++step) f << json{{"step", step}, {"loss", 10.0 - step}}.dump() << "\n";
  }
  auto with_runs = [&](const json& runs) {
    std::ofstream(dir / "run_info.json")
        << json{{"ranks", "one process"}, {"device", "cpu B"}, {"runs", runs}}.dump();
    return titan::train::read_run(dir);
  };
  const json two = {{{"from_step", 1}, {"ranks", "FSDP, 2 ranks"}, {"device", "cpu A"}},
                    {{"from_step", 5}, {"ranks", "one process"}, {"device", "cpu A"}}};
  titan::train::RunRecord r = with_runs(two);
  EXPECT_EQ(r.ranks, "steps 1-4: FSDP, 2 ranks; steps 5-7: one process");
  EXPECT_EQ(r.device, "cpu A");  // the same in both stretches: said once
  r = with_runs({two[0], {{"ranks", "no step"}}, 3, {{"from_step", 2}, {"device", "cpu C"}}});
  EXPECT_EQ(r.ranks, "one process");
  EXPECT_EQ(r.device, "cpu B");
}

// titan train logs a value that is not finite (a diverged loss) as null. The page says at which steps
// (no chart can draw them) and counts every logged step, not only those a chart holds.
TEST(Report, StepsWithANonFiniteLossAreNamedNotDroppedSilently) {
  const fs::path dir = tt::temp_dir("report_not_finite_" + std::to_string(getpid()));
  {
    std::ofstream f(dir / "metrics.jsonl");
    f << json{{"step", 1}, {"loss", 11.5}, {"grad_norm", 2.0}}.dump() << "\n"
      << json{{"step", 2}, {"loss", nullptr}, {"grad_norm", nullptr}}.dump() << "\n"
      << json{{"step", 3}, {"loss", nullptr}, {"grad_norm", 4.0}}.dump() << "\n";
  }
  const titan::train::RunRecord r = titan::train::read_run(dir);
  EXPECT_EQ(r.steps, (std::vector<long>{1, 2, 3}));
  EXPECT_EQ(r.not_finite.at("loss"), (std::vector<long>{2, 3}));
  EXPECT_EQ(r.not_finite.at("grad_norm"), (std::vector<long>{2}));
  EXPECT_EQ(r.series.at("loss").size(), 1u);
  const std::string html = titan::train::render_report({r});
  EXPECT_NE(html.find(", 3 logged steps</p>"), std::string::npos) << html;
  EXPECT_NE(html.find("loss not finite (logged as null) at steps 2, 3: not drawn"), std::string::npos)
      << html;
  EXPECT_NE(html.find("grad_norm not finite (logged as null) at step 2: not drawn"), std::string::npos)
      << html;

  // A roll-back past them forgets them with the rest of the abandoned trajectory; one step is "step".
  {
    std::ofstream f(dir / "metrics.jsonl", std::ios::app);
    f << json{{"step", 1}, {"loss", 11.4}}.dump() << "\n";
  }
  const titan::train::RunRecord back = titan::train::read_run(dir);
  EXPECT_EQ(back.steps, (std::vector<long>{1}));
  EXPECT_TRUE(back.not_finite.empty());
  const std::string one = titan::train::render_report({back});
  EXPECT_NE(
      one.find(
          ", 1 logged step; 3 records replaced by a later trajectory (steps 1-3 re-logged from step 1)</p>"),
      std::string::npos)
      << one;
  EXPECT_EQ(one.find("not finite"), std::string::npos);

  // A long run of them is shortened to its first and last six.
  {
    std::ofstream f(dir / "metrics.jsonl", std::ios::app);
    for (int step = 2; step <= 31; ++step) f << json{{"step", step}, {"loss", nullptr}}.dump() << "\n";
  }
  const std::string many = titan::train::render_report({titan::train::read_run(dir)});
  EXPECT_NE(many.find("at steps 2, 3, 4, 5, 6, 7, ... (18 more), 26, 27, 28, 29, 30, 31: not drawn"),
            std::string::npos)
      << many;
}

TEST(Report, AxesOfConstantTinyRangeAndShortRuns) {
  const fs::path dir = tt::temp_dir("report_axes");
  fs::create_directories(dir / "short");
  {
    std::ofstream f(dir / "short" / "metrics.jsonl");
    f << json{{"step", 1}, {"loss", 11.9412}, {"lr", 8e-4}}.dump() << "\n"
      << json{{"step", 2}, {"loss", 11.9488}, {"lr", 8e-4}}.dump() << "\n";
  }
  const std::string html = titan::train::render_report({titan::train::read_run(dir / "short")});
  auto labels = [&](const std::string& cls, const std::string& figure) {
    std::vector<std::string> out;
    const size_t from = html.find("<figcaption>" + figure), to = html.find("</figure>", from);
    const std::string tag = "class=\"" + cls + "\">";
    for (size_t at = html.find(tag, from); at < to; at = html.find(tag, at + 1)) {
      const size_t b = at + tag.size();
      out.push_back(html.substr(b, html.find('<', b) - b));
    }
    return out;
  };
  const auto loss_y = labels("ytick", "loss");
  ASSERT_GE(loss_y.size(), 3u) << html;
  EXPECT_EQ(std::set<std::string>(loss_y.begin(), loss_y.end()).size(), loss_y.size()) << "repeated labels";
  auto loss_x = labels("xtick", "loss");
  EXPECT_EQ(std::count(loss_x.begin(), loss_x.end(), "1"), 1);
  EXPECT_EQ(std::count(loss_x.begin(), loss_x.end(), "2"), 1);
  for (const std::string& l : labels("ytick", "learning rate")) {
    const double v = std::stod(l);
    EXPECT_TRUE(v > 7e-4 && v < 9e-4) << "a constant lr of 8e-4 on an axis label of " << l;
  }
  // Values one ulp apart (two runs' constant lr, rounded differently): drawn as a constant, where the
  // tick loop's double index used to stop advancing and the report never ended.
  fs::create_directories(dir / "ulps");
  {
    std::ofstream f(dir / "ulps" / "metrics.jsonl");
    for (int step = 1; step <= 4; ++step)
      f << json{{"step", step}, {"loss", 11.9}, {"lr", step % 2 ? 8e-4 : std::nextafter(8e-4, 1.0)}}.dump()
        << "\n";
  }
  const std::string ulps = titan::train::render_report({titan::train::read_run(dir / "ulps")});
  EXPECT_NE(ulps.find("learning rate"), std::string::npos);
}

// The summary table of each run: every figure read from its records (here hand-written, the
// expected figures worked out by hand), speed without the warm-up steps.
TEST(Report, EachRunsSummaryFiguresComeFromItsRecords) {
  const fs::path dir = tt::temp_dir("report_summary");
  fs::create_directories(dir / "full");
  {
    std::ofstream f(dir / "full" / "metrics.jsonl");
    f << json{{"step", 1},  {"loss", 10.0},      {"tps", 100.0},
              {"mfu", 1.0}, {"memory_gib", 0.5}, {"warmup", true}}
             .dump()
      << "\n"
      << json{{"step", 2},           {"loss", 9.0},     {"tps", 200.0},   {"mfu", 2.0},
              {"memory_gib", 0.625}, {"val_loss", 9.5}, {"warmup", false}}
             .dump()
      << "\n"
      << json{{"step", 3},          {"loss", 8.0},      {"tps", 400.0},   {"mfu", 4.0},
              {"memory_gib", 0.75}, {"val_loss", 8.25}, {"warmup", false}}
             .dump()
      << "\n"
      << json{{"step", 4},       {"loss", 7.5},    {"tps", 300.0}, {"mfu", 3.5}, {"memory_gib", 0.6875},
              {"val_loss", 8.5}, {"warmup", false}}
             .dump()
      << "\n";
  }
  const std::string html = titan::train::render_report({titan::train::read_run(dir / "full")});
  // tps: (200 + 400 + 300) / 3; mfu: (2 + 4 + 3.5) / 3 = 3.1666...
  EXPECT_NE(html.find("<table class=\"summary\">"
                      "<tr><th>last logged step</th><td>4 (loss 7.5)</td></tr>"
                      "<tr><th>lowest val_loss</th><td>8.25 (step 3)</td></tr>"
                      "<tr><th>mean tokens/s per rank, warm-up left out</th><td>300.0 (3 steps)</td></tr>"
                      "<tr><th>mean MFU, warm-up left out</th><td>3.17 % (3 steps)</td></tr>"
                      "<tr><th>peak memory of the last step logging it</th><td>0.6875 GiB (step 4)</td></tr>"
                      "</table>"),
            std::string::npos)
      << html;

  // A run with nothing but a warm-up step logging speed, no MFU (an unknown peak), no validation, no
  // memory, and a last loss that was not finite: each figure says it has none.
  fs::create_directories(dir / "sparse");
  {
    std::ofstream f(dir / "sparse" / "metrics.jsonl");
    f << json{{"step", 1}, {"loss", 10.0}, {"tps", 100.0}, {"warmup", true}}.dump() << "\n"
      << json{{"step", 2}, {"loss", nullptr}}.dump() << "\n";
  }
  const std::string sparse = titan::train::render_report({titan::train::read_run(dir / "sparse")});
  EXPECT_NE(
      sparse.find("<table class=\"summary\">"
                  "<tr><th>last logged step</th><td>2 (loss null, not finite)</td></tr>"
                  "<tr><th>lowest val_loss</th><td>n/a (not logged)</td></tr>"
                  "<tr><th>mean tokens/s per rank, warm-up left out</th><td>n/a (no step after warm-up logs "
                  "it)</td></tr>"
                  "<tr><th>mean MFU, warm-up left out</th><td>n/a (no step after warm-up logs it)</td></tr>"
                  "<tr><th>peak memory of the last step logging it</th><td>n/a (not logged)</td></tr>"
                  "</table>"),
      std::string::npos)
      << sparse;
}

// A run stopped while it wrote a record leaves it cut short, without its newline. The next run in the
// folder drops it and says so, naming the file and, when the torn text got past it, the step: the
// resume logs the steps after its checkpoint again, but a torn step at or before the checkpoint has
// no record any more (its loss and val_loss are gone; the report draws across the gap).
TEST(Report, ARecordCutShortIsDroppedAndSaid) {
  const fs::path file = tt::temp_dir("report_torn_record") / "metrics.jsonl";
  titan::train::MetricsOutputs outputs;
  outputs.jsonl = file;
  // Records of titans before 2026-12-07 have their keys in sorted order: "step" after "loss", "lr",
  // "memory_gib", ... (today's start with it: AMoeRunsBalanceIsChartedWhereSomeRunLogsIt checks).
  const std::string whole = json{{"step", 18}, {"loss", 2.5}, {"lr", 1e-3}}.dump() + "\n" +
                            json{{"step", 19}, {"loss", 2.4}, {"lr", 1e-3}}.dump() + "\n";
  const std::string dropped = "warning: metrics: '" + file.string() + "' ended in a record cut short (";
  const std::string rule =
      "; a run stopped while writing it): dropped. A resume logs the steps after its checkpoint "
      "again, not those at or before it: ";
  for (const auto& [torn, says] : std::vector<std::pair<std::string, std::string>>{
           {"{\"loss\":2.3,\"lr\":0.001,\"step\":20,\"step_sec",
            "step 20" + rule + "if the checkpoint is step 20 or later, step 20 has no record\n"},
           // Cut inside the number: "2" may be 20, so no step is named.
           {"{\"loss\":2.3,\"lr\":0.001,\"step\":2",
            "its step unreadable" + rule + "if the torn step is one of those, it has no record\n"},
           {"{\"loss\":2.3,\"l",
            "its step unreadable" + rule + "if the torn step is one of those, it has no record\n"},
       }) {
    std::ofstream(file, std::ios::binary) << whole << torn;
    testing::internal::CaptureStdout();
    { titan::train::MetricsLogger logger(outputs); }
    EXPECT_EQ(testing::internal::GetCapturedStdout(), dropped + says) << torn;
    EXPECT_EQ(read_file(file), whole) << torn;  // ends at the last whole record
  }
  // A file that ends in a whole record is left as it is, and nothing is said.
  testing::internal::CaptureStdout();
  { titan::train::MetricsLogger logger(outputs); }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(read_file(file), whole);
  // Another rank's own file (metrics.save_for_all_ranks): that rank prints no run lines, so it says
  // it on its standard error, naming itself.
  outputs.rank = 1;
  std::ofstream(file, std::ios::binary) << whole << "{\"step\":20,\"lo";
  testing::internal::CaptureStderr();
  {
    titan::train::ConsoleOfRank quiet(/*logging_rank=*/false);
    titan::train::MetricsLogger logger(outputs);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "rank 1: " + dropped + "step 20" + rule +
                "if the checkpoint is step 20 or later, step 20 has no record\n");
  EXPECT_EQ(read_file(file), whole);
}

// The command line: a run is given by its folder or its metrics.jsonl; a folder that does not exist
// is said as such; --out naming a folder is said as such, before anything about what it holds.
TEST(Report, RunArgumentsAndTheOutputFolderAreSaidPlainly) {
  const fs::path dir = tt::temp_dir("report_arguments");
  fs::create_directories(dir / "runs" / "dense");
  std::ofstream(dir / "runs" / "dense" / "metrics.jsonl") << json{{"step", 1}, {"loss", 2.0}}.dump() << "\n";
  const std::string titan = tt::titan_binary().string() + " report ";
  std::string out;

  // The file itself means its folder: the run keeps its folder's name.
  EXPECT_EQ(titan::train::read_run(dir / "runs" / "dense" / "metrics.jsonl").name, "dense");
  EXPECT_EQ(titan::train::run_folder(dir / "runs" / "dense" / "metrics.jsonl"), dir / "runs" / "dense");
  const fs::path page = dir / "page.html";
  ASSERT_EQ(
      tt::run_command(titan + (dir / "runs" / "dense" / "metrics.jsonl").string() + " --out " + page.string(),
                      &out),
      0)
      << out;
  EXPECT_NE(read_file(page).find("<h2><i class=\"swatch\" style=\"background:" + titan::train::run_colour(0) +
                                 "\"></i>dense</h2>"),
            std::string::npos);
  // Another file is no run.
  std::ofstream(dir / "runs" / "dense" / "notes.txt") << "x";
  out.clear();
  EXPECT_EQ(tt::run_command(
                titan + (dir / "runs" / "dense" / "notes.txt").string() + " --out " + page.string(), &out),
            1);
  EXPECT_NE(out.find("titan report: error: '" + (dir / "runs" / "dense" / "notes.txt").string() +
                     "' is not a folder: give a run's dump_folder, or its metrics.jsonl"),
            std::string::npos)
      << out;

  out.clear();
  EXPECT_EQ(tt::run_command(titan + (dir / "bad" / "missing").string() + " --out " + page.string(), &out), 1);
  EXPECT_NE(out.find("titan report: error: '" + (dir / "bad" / "missing").string() +
                     "' does not exist (give a run's dump_folder, or its metrics.jsonl)"),
            std::string::npos)
      << out;

  // --out naming the folder that holds the run.
  out.clear();
  EXPECT_EQ(
      tt::run_command(titan + (dir / "runs" / "dense").string() + " --out " + (dir / "runs").string(), &out),
      1);
  EXPECT_NE(out.find("titan report: error: --out: '" + (dir / "runs").string() +
                     "' is a folder; give the file to write"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("contains the input"), std::string::npos) << out;
}

}  // namespace
