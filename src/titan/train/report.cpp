#include "titan/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/parse.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/train/log.h"

namespace titan::train {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Chart geometry (SVG user units).
constexpr double kWidth = 560, kHeight = 250, kLeft = 64, kRight = 16, kTop = 28, kBottom = 36;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, int precision = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

// About five round tick values covering [lo, hi], at least `min_step` apart (1 for steps), and the
// significant digits their labels need to tell neighbours apart (11.942, 11.943, not 11.94 twice).
struct Ticks {
  std::vector<double> values;
  int digits = 4;
};
Ticks ticks(double lo, double hi, double min_step = 0) {
  const double raw = (hi - lo) / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = std::max(min_step, mag * (raw / mag >= 5 ? 5 : raw / mag >= 2 ? 2 : 1));
  Ticks t;
  // Each value from its index (no accumulated rounding: 1 + 5 x 0.2 must be 2, a whole step).
  // Counted in integers: past 2^53 a double index would stop advancing (a range of a few ulps).
  const double first = std::ceil(lo / step - 1e-9), last = std::floor(hi / step + 1e-9);
  for (int64_t i = 0; i <= 20 && first + double(i) <= last; ++i) {
    const double k = first + double(i);
    t.values.push_back(k == 0 ? 0 : k * step);
  }
  const double largest = std::max(std::abs(lo), std::abs(hi));
  t.digits = std::clamp(int(std::ceil(std::log10(largest / step + 1))) + 1, 2, 15);
  return t;
}

std::string chart(const std::vector<RunRecord>& runs, const std::string& metric, const std::string& title) {
  // The dashed companion series (validation loss beside loss).
  const std::string companion = metric == "loss" ? "val_loss" : "";
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (auto& r : runs)
    for (const std::string& m : {metric, companion}) {
      auto it = r.series.find(m);
      if (m.empty() || it == r.series.end()) continue;
      for (auto& [step, v] : it->second) {
        xmin = std::min(xmin, double(step)), xmax = std::max(xmax, double(step));
        ymin = std::min(ymin, v), ymax = std::max(ymax, v);
      }
    }
  std::ostringstream os;
  os << "<figure><figcaption>" << escape(title) << "</figcaption>";
  if (!(xmin <= xmax)) return os.str() + "<p class=\"none\">not logged by these runs</p></figure>\n";
  if (xmax == xmin) xmin -= 1, xmax += 1;
  // A constant, or values a few ulps apart (8e-4 and 8.000000000000001e-4 of two runs' lr): 5 % of
  // its size around it (a constant lr of 8e-4 is no 0).
  if (ymax - ymin <= 1e-9 * std::max(std::abs(ymin), std::abs(ymax))) {
    const double half = ymin != 0 ? std::abs(ymin) * 0.05 : 1;
    ymin -= half, ymax += half;
  }
  const double pad = (ymax - ymin) * 0.05;
  ymin -= pad, ymax += pad;
  auto X = [&](double x) { return kLeft + (x - xmin) / (xmax - xmin) * (kWidth - kLeft - kRight); };
  auto Y = [&](double y) { return kHeight - kBottom - (y - ymin) / (ymax - ymin) * (kHeight - kTop - kBottom); };
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" role=\"img\" aria-label=\"" << escape(title) << "\">";
  os << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kWidth - kLeft - kRight << "\" height=\""
     << kHeight - kTop - kBottom << "\" class=\"plot\"/>";
  const Ticks yt = ticks(ymin, ymax);
  for (double t : yt.values)
    os << "<line x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\"" << Y(t) << "\" y2=\"" << Y(t)
       << "\" class=\"grid\"/><text x=\"" << kLeft - 6 << "\" y=\"" << Y(t) + 4 << "\" class=\"ytick\">"
       << num(t, yt.digits) << "</text>";
  for (double t : ticks(xmin, xmax, /*min_step=*/1).values)  // whole steps
    os << "<text x=\"" << X(t) << "\" y=\"" << kHeight - kBottom + 16 << "\" class=\"xtick\">" << num(t, 15)
       << "</text>";
  os << "<text x=\"" << (kLeft + kWidth - kRight) / 2 << "\" y=\"" << kHeight - 4 << "\" class=\"xtick\">step</text>";
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string colour = run_colour(i);
    for (const std::string& m : {metric, companion}) {
      auto it = runs[i].series.find(m);
      if (m.empty() || it == runs[i].series.end() || it->second.empty()) continue;
      os << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2.5\""
         << (m == companion ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (auto& [step, v] : it->second) os << X(double(step)) << "," << Y(v) << " ";
      os << "\"><title>" << escape(runs[i].name + " " + m) << "</title></polyline>";
      if (it->second.size() == 1) {
        auto& [step, v] = *it->second.begin();
        os << "<circle cx=\"" << X(double(step)) << "\" cy=\"" << Y(v) << "\" r=\"3\" fill=\"" << colour << "\"/>";
      }
    }
    // Warm-up steps pay one-time costs: a hollow ring says "do not read speed from this point".
    auto it = runs[i].series.find(metric);
    if (it == runs[i].series.end()) continue;
    for (long step : runs[i].warmup_steps)
      if (auto p = it->second.find(step); p != it->second.end())
        os << "<circle cx=\"" << X(double(step)) << "\" cy=\"" << Y(p->second) << "\" r=\"6\" class=\"warmup\" stroke=\""
           << colour << "\"><title>warm-up step " << step << "</title></circle>";
  }
  os << "</svg></figure>\n";
  return os.str();
}

// The JSON document of a run's file (run_info.json, check.json).
json read_json(const fs::path& p) {
  return io::read_json_file(p, "report");
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& report_charts() {
  static const std::vector<std::pair<std::string, std::string>> charts = {
      {"loss", "loss (dashed: validation loss)"},
      {"grad_norm", "gradient norm (before clipping)"},
      {"lr", "learning rate"},
      {"tps", "tokens / s (per rank)"},
      {"mfu", "MFU (%)"},
      {"memory_gib", "peak memory (GiB)"},
  };
  return charts;
}

const std::vector<std::pair<std::string, std::string>>& report_moe_charts() {
  static const std::vector<std::pair<std::string, std::string>> charts = {
      {"aux_loss", "MoE load-balancing aux loss"},
      {"expert_load_max", "MoE expert load: most loaded expert / mean tokens per expert (1 = even)"},
      {"experts_idle", "MoE experts that received no token in the step"},
  };
  return charts;
}

namespace {
std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", s);
  return buf;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// The run's figures, each read from its records (the newest trajectory's), as table rows; `r` has
// a step.
std::string summary_rows(const RunRecord& r) {
  auto series = [&](const char* metric) -> const std::map<long, double>* {
    auto it = r.series.find(metric);
    return it == r.series.end() || it->second.empty() ? nullptr : &it->second;
  };
  auto row = [](const std::string& name, const std::string& value) {
    return "<tr><th>" + escape(name) + "</th><td>" + escape(value) + "</td></tr>";
  };
  std::string rows;
  const long last = r.steps.back();
  const auto* loss = series("loss");
  const bool finite = loss && loss->count(last);
  rows +=
      row("last logged step", std::to_string(last) + " (loss " +
                                  (finite ? num(loss->at(last), 5) : std::string("null, not finite")) + ")");
  if (const auto* val = series("val_loss")) {
    const auto lowest = std::min_element(val->begin(), val->end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
    rows += row("lowest val_loss", num(lowest->second, 5) + " (step " + std::to_string(lowest->first) + ")");
  } else {
    rows += row("lowest val_loss", "n/a (not logged)");
  }
  // Speed without the warm-up steps, whose one-time costs are not the run's.
  const std::set<long> warmups(r.warmup_steps.begin(), r.warmup_steps.end());
  auto mean_after_warmup = [&](const char* metric, int decimals, const std::string& unit) {
    double sum = 0;
    long n = 0;
    if (const auto* s = series(metric))
      for (auto& [step, v] : *s)
        if (!warmups.count(step)) sum += v, ++n;
    if (n == 0) return std::string("n/a (no step after warm-up logs it)");
    return fixed(sum / double(n), decimals) + unit + " (" + std::to_string(n) +
           (n == 1 ? " step)" : " steps)");
  };
  rows += row("mean tokens/s per rank, warm-up left out", mean_after_warmup("tps", 1, ""));
  rows += row("mean MFU, warm-up left out", mean_after_warmup("mfu", 2, " %"));
  if (const auto* memory = series("memory_gib")) {
    const auto& [step, gib] = *memory->rbegin();
    rows += row("peak memory of the last step logging it",
                num(gib, 5) + " GiB (step " + std::to_string(step) + ")");
  } else {
    rows += row("peak memory of the last step logging it", "n/a (not logged)");
  }
  return rows;
}

// "10 records replaced by a later trajectory (steps 11-20 re-logged from step 11)"; "" for none.
std::string relogs_text(const RunRecord& r) {
  if (r.relogs.empty()) return "";
  size_t records = 0;
  std::string which;
  for (const RunRecord::Relog& g : r.relogs) {
    records += g.records;
    which += which.empty() ? "" : "; ";
    which += g.first == g.last ? "step " + std::to_string(g.first)
                               : "steps " + std::to_string(g.first) + "-" + std::to_string(g.last);
    which += " re-logged from step " + std::to_string(g.from);
  }
  return std::to_string(records) + (records == 1 ? " record" : " records") +
         " replaced by a later trajectory (" + which + ")";
}
}  // namespace

std::string run_colour(size_t i) {
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
  return palette[i % (sizeof palette / sizeof *palette)];
}

fs::path run_folder(const fs::path& given) {
  std::error_code ec;
  const fs::file_status st = fs::status(given, ec);
  TITAN_CHECK(st.type() != fs::file_type::not_found, "report: '", given.string(),
              "' does not exist (give a run's dump_folder, or its metrics.jsonl)");
  TITAN_CHECK(!ec, "report: '", given.string(), "' cannot be read: ", ec.message());
  if (fs::is_directory(st)) return given;
  TITAN_CHECK(given.filename() == "metrics.jsonl", "report: '", given.string(),
              "' is not a folder: give a run's dump_folder, or its metrics.jsonl");
  return given.has_parent_path() ? given.parent_path() : fs::path(".");
}

RunRecord read_run(const fs::path& given) {
  const fs::path dir = run_folder(given);
  RunRecord r;
  r.dir = dir;
  r.name = fs::absolute(dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  const fs::path metrics = dir / "metrics.jsonl";
  // A run writes metrics.jsonl at its first logged step, run_info.json before: a run that has
  // logged no step yet is not a folder that is no run.
  std::error_code ec;
  TITAN_CHECK(fs::exists(fs::symlink_status(metrics, ec)) || !fs::exists(dir / "run_info.json"), "report: '",
              metrics.string(),
              "' does not exist: the run (its run_info.json is there) logged no step (yet)");
  TITAN_CHECK(fs::exists(fs::symlink_status(metrics, ec)), "report: '", dir.string(),
              "' holds no metrics.jsonl: is it a run's dump_folder?");
  const std::string text = io::read_regular_file(metrics, "report");
  std::set<long> warmups, steps;
  std::map<std::string, std::set<long>> not_finite;
  long last_step = std::numeric_limits<long>::min();  // none yet
  size_t from = 0;
  for (long n = 1; from < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', from), text.size());
    const std::string line = text.substr(from, end - from);
    const bool unterminated = end == text.size();  // the run is writing it, or was stopped while it did
    from = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    std::string duplicate;  // a key written twice in one object: json keeps the last, silently
    std::vector<std::set<std::string>> keys_of_open_objects;
    const json::parser_callback_t note_duplicates = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) keys_of_open_objects.emplace_back();
      if (event == json::parse_event_t::object_end) keys_of_open_objects.pop_back();
      if (event == json::parse_event_t::key &&
          !keys_of_open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    };
    try {
      j = json::parse(line, note_duplicates);
    } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e400)
      if (unterminated) {
        std::fprintf(
            stderr,
            "report: '%s', line %ld: the last line is cut short (a run still writing it, or stopped while "
            "it did): left out\n",
            metrics.string().c_str(), n);
        break;
      }
      // The parser's own "[json.exception.parse_error.101] parse error at line 1, ..." names its
      // internals and the line as its line 1: the column and the fault are what help.
      std::string what = e.what();
      if (const auto* syntax = dynamic_cast<const json::parse_error*>(&e)) {
        const io::JsonErrorAt at = io::locate_json_error(line, *syntax);
        what = "column " + std::to_string(at.column) + ": " + at.what;
      } else if (const size_t close = what.find("] ");
                 what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
        what.erase(0, close + 2);
      }
      TITAN_FAIL("report: '", metrics.string(), "', line ", n, ": not a JSON record: ", what);
    }
    TITAN_CHECK(duplicate.empty(), "report: '", metrics.string(), "', line ", n, ": the key \"", duplicate,
                "\" appears twice in one record; which one is meant?");
    TITAN_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer(), "report: '",
                metrics.string(), "', line ", n, ": a record needs an integer \"step\"");
    // Past int64 the parser holds it unsigned: quoted as written, not wrapped to a negative.
    TITAN_CHECK(!j["step"].is_number_unsigned() || j["step"].get<uint64_t>() <= uint64_t(INT64_MAX),
                "report: '", metrics.string(), "', line ", n, ": \"step\" is ", j["step"].get<uint64_t>(),
                ", past the largest step (", INT64_MAX, ")");
    const long step = j["step"].get<long>();
    TITAN_CHECK(step >= 1, "report: '", metrics.string(), "', line ", n, ": \"step\" is ", step,
                "; steps count from 1");
    // The fields titan train writes: each a number (null where a value was not finite), and every
    // record has a loss. Another program's records may hold fewer, or extra fields, charted when numeric.
    TITAN_CHECK(j.contains("loss"), "report: '", metrics.string(), "', line ", n, ": the record of step ",
                step, " has no \"loss\"");
    for (const char* k : {"loss",
                          "aux_loss",
                          "grad_norm",
                          "lr",
                          "memory_gib",
                          "memory_pct",
                          "tps",
                          "tflops",
                          "mfu",
                          "step_seconds",
                          "val_loss",
                          "val_perplexity",
                          "comm_mib",
                          "comm_seconds",
                          "padding_pct",
                          "trained_tokens",
                          "expert_load_max",
                          "experts_idle",
                          "tokens_seen",
                          "global_max_loss"})
      TITAN_CHECK(!j.contains(k) || j[k].is_number() || j[k].is_null(), "report: '", metrics.string(),
                  "', line ", n, ": \"", k, "\" of step ", step, " is ", j[k].dump(), ", not a number");
    TITAN_CHECK(!j.contains("warmup") || j["warmup"].is_boolean(), "report: '", metrics.string(), "', line ",
                n, ": \"warmup\" of step ", step, " is ", j["warmup"].dump(), ", not true or false");
    // A step at or before the last one logged starts another trajectory (a resume re-logging the
    // steps after its checkpoint, a roll-back to checkpoint.load_step): the records of the steps from
    // there on belong to the one it replaces, and go.
    if (step <= last_step) {
      const auto replaced = steps.lower_bound(step);
      r.relogs.push_back({step, *replaced, last_step, size_t(std::distance(replaced, steps.end()))});
      for (auto& [name, points] : r.series) points.erase(points.lower_bound(step), points.end());
      for (auto& [name, at] : not_finite) at.erase(at.lower_bound(step), at.end());
      warmups.erase(warmups.lower_bound(step), warmups.end());
      steps.erase(steps.lower_bound(step), steps.end());
    }
    last_step = step;
    steps.insert(step);
    for (auto& [k, v] : j.items()) {
      if (k == "step") continue;
      if (v.is_number() && std::isfinite(v.get<double>()))
        r.series[k][step] = v.get<double>();
      else if (v.is_null())
        not_finite[k].insert(step);
    }
    if (j.value("warmup", false)) warmups.insert(step);
  }
  TITAN_CHECK(last_step != std::numeric_limits<long>::min(), "report: '", metrics.string(),
              "' holds no record: the run logged no step (yet)");
  r.warmup_steps.assign(warmups.begin(), warmups.end());
  r.steps.assign(steps.begin(), steps.end());
  for (auto& [k, at] : not_finite)
    if (!at.empty()) r.not_finite[k].assign(at.begin(), at.end());
  const fs::path info_path = dir / "run_info.json";
  if (fs::exists(info_path)) {
    json info = read_json(info_path);
    try {
      r.description = info.value("description", "");
      r.config_in_effect = info.value("config_in_effect", "");
      r.device = info.value("device", "");
      r.ranks = info.value("ranks", "");
      // A run resumed on other ranks or another device: each stretch of steps with its own.
      // (Entries another program wrote, without a step or a name, are left out, as titan train does.)
      json runs = json::array();
      if (info.contains("runs") && info["runs"].is_array())
        for (const json& r : info["runs"])
          if (r.is_object() && r.contains("from_step") && r["from_step"].is_number_integer() &&
              r.value("ranks", json()).is_string() && r.value("device", json()).is_string() &&
              (runs.empty() || r["from_step"].get<long>() > runs.back()["from_step"].get<long>()))
            runs.push_back(r);
      if (runs.size() > 1) {
        auto stretches = [&](const char* field) {
          std::string text;
          bool differ = false;
          for (size_t i = 0; i < runs.size(); ++i) {
            const long from = runs[i].at("from_step").get<long>();
            const long to = i + 1 < runs.size() ? runs[i + 1].at("from_step").get<long>() - 1 : last_step;
            const std::string value = runs[i].at(field).get<std::string>();
            differ = differ || value != runs[0].at(field).get<std::string>();
            if (i) text += "; ";
            text.append("steps ").append(std::to_string(from));
            if (to > from) text.append("-").append(std::to_string(to));
            if (to < from) text.append(" on");  // a stretch that logged no step yet
            text.append(": ").append(value);
          }
          return differ ? text : runs[0].at(field).get<std::string>();
        };
        r.ranks = stretches("ranks");
        r.device = stretches("device");
      }
      if (info.contains("config_notes"))
        r.config_notes = info["config_notes"].get<std::vector<std::string>>();
      if (info.contains("versions"))
        for (auto& [k, v] : info["versions"].items())
          r.versions[k] = v.is_string() ? v.get<std::string>() : v.dump();
    } catch (const json::exception& e) {  // valid JSON of another shape ([], a number for a string)
      TITAN_FAIL("report: '", info_path.string(), "' is not a run's run_info.json: ", e.what());
    }
  }
  // [profiling]: the traces folder named in the config in effect, its newest iteration.
  // The listing quotes strings as JSON does (JobConfig::describe): the value parses as a JSON string.
  const std::string key = "  profiling.save_traces_folder = ";
  std::string traces_folder;
  if (const size_t at = r.config_in_effect.find(key); at != std::string::npos) {
    const size_t from = at + key.size(), to = r.config_in_effect.find('\n', from);
    const json value =
        json::parse(r.config_in_effect.substr(from, to - from), nullptr, /*allow_exceptions=*/false);
    if (value.is_string()) traces_folder = value.get<std::string>();
  }
  if (!traces_folder.empty()) {
    const fs::path traces = dir / traces_folder;
    long newest = -1;
    std::error_code ec;
    for (auto it = fs::directory_iterator(traces, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("iteration_", 0) != 0 || !fs::exists(it->path() / "rank0_trace.json")) continue;
      if (const auto step = parse_int(name.substr(10)); step && *step > newest) newest = long(*step);
    }
    if (newest >= 0) {
      r.profile_trace = traces / ("iteration_" + std::to_string(newest)) / "rank0_trace.json";
      const std::vector<profiling::Span> spans = spans_of_chrome_trace(
          io::read_regular_file(r.profile_trace, "profile trace"), r.profile_trace.string());
      r.profile = profile_rows(spans);
      for (const auto& sp : spans) r.profile_seconds += sp.seconds;
    }
  }
  const fs::path check_path = dir / "check.json";
  if (fs::exists(check_path)) {
    json check = read_json(check_path);
    TITAN_CHECK(check.contains("rows") && check["rows"].is_array(), "report: '", check_path.string(),
                "': a titan check file needs a \"rows\" array (titan check --json writes one)");
    try {
      for (auto& row : check["rows"]) {
        const std::string status = row.value("status", "");
        TITAN_CHECK(status == "PASS" || status == "FAIL" || status == "SKIP", "report: '",
                    check_path.string(), "': row '", row.value("check", ""), "' has status '", status,
                    "', not PASS, FAIL or SKIP");
        r.check_rows.push_back(
            {row.value("check", ""), status, row.value("value", ""), row.value("rule", "")});
      }
    } catch (const json::exception& e) {  // a row of another shape (a number for a string)
      TITAN_FAIL("report: '", check_path.string(), "' is not a titan check file: ", e.what());
    }
  }
  return r;
}

std::string render_report(const std::vector<RunRecord>& runs) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        "<title>titan report</title><style>\n"
        "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}\n"
        "h1{font-size:20px}h2{font-size:16px;margin-top:28px}\n"
        ".charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-weight:600;margin:0 0 2px 4px}\n"
        ".plot{fill:#fafafa;stroke:#bbb}.grid{stroke:#e4e4e4}.ytick{font-size:11px;text-anchor:end;fill:#555}\n"
        ".xtick{font-size:11px;text-anchor:middle;fill:#555}.warmup{fill:none;stroke-width:2}\n"
        ".legend span{display:inline-block;margin-right:18px}.swatch{display:inline-block;width:26px;height:4px;"
        "vertical-align:middle;margin-right:6px}\n"
        "pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}.none{color:#888;width:560px}\n"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}\n"
        ".fail{color:#b00;font-weight:600}.ok{color:#070}.bar{display:inline-block;height:10px}\n"
        "</style></head><body>\n<h1>titan report</h1>\n";
  os << "<p class=\"legend\">";
  for (size_t i = 0; i < runs.size(); ++i)
    os << "<span><i class=\"swatch\" style=\"background:" << run_colour(i) << "\"></i>" << escape(runs[i].name)
       << (runs[i].description.empty() ? "" : " (" + escape(runs[i].description) + ")") << "</span>";
  os << "</p>\n<p>Hollow rings mark warm-up steps (the first step of each invocation pays one-time costs: "
        "read speed and MFU from the others).</p>\n<div class=\"charts\">\n";
  for (auto& [metric, title] : report_charts()) os << chart(runs, metric, title);
  for (auto& [metric, title] : report_moe_charts())
    if (std::any_of(runs.begin(), runs.end(), [&](const RunRecord& r) {
          auto it = r.series.find(metric);
          return it != r.series.end() && !it->second.empty();
        }))
      os << chart(runs, metric, title);
  os << "</div>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    os << "<h2><i class=\"swatch\" style=\"background:" << run_colour(i) << "\"></i>" << escape(r.name) << "</h2>\n";
    os << "<p>" << escape(fs::absolute(r.dir).lexically_normal().string());
    os << ", " << r.steps.size() << (r.steps.size() == 1 ? " logged step" : " logged steps");
    if (const std::string relogs = relogs_text(r); !relogs.empty()) os << "; " << escape(relogs);
    os << "</p>\n";
    if (!r.steps.empty()) os << "<table class=\"summary\">" << summary_rows(r) << "</table>\n";
    for (auto& [metric, at] : r.not_finite) {
      const std::string list = listed_steps(at);
      os << "<p class=\"fail\">" << escape(metric) << " not finite (logged as null) at step"
         << (at.size() == 1 ? " " : "s ") << list << ": not drawn</p>\n";
    }
    if (!r.device.empty() || !r.versions.empty()) {
      os << "<table>";
      if (!r.device.empty()) os << "<tr><th>device</th><td>" << escape(r.device) << "</td></tr>";
      if (!r.ranks.empty()) os << "<tr><th>ranks</th><td>" << escape(r.ranks) << "</td></tr>";
      for (auto& [k, v] : r.versions) os << "<tr><th>" << escape(k) << "</th><td>" << escape(v) << "</td></tr>";
      os << "</table>\n";
    }
    if (!r.profile.empty()) {
      // The newest profile: each op's share of the profiled steps, longest first.
      os << "<h3>where the time went: " << escape(r.profile_trace.parent_path().filename().string())
         << " (rank 0, " << fmt_seconds(r.profile_seconds) << " s; trace " << escape(r.profile_trace.string())
         << ")</h3>\n<table><tr><th>op (or [phase])</th><th>calls</th><th>forward s</th><th>backward s</th>"
            "<th>share</th><th></th></tr>";
      for (const ProfileRow& p : r.profile) {
        const double share = r.profile_seconds > 0 ? 100.0 * p.seconds() / r.profile_seconds : 0.0;
        char pct[32];
        std::snprintf(pct, sizeof pct, "%.1f%%", share);
        os << "<tr><td>" << escape(p.kind == profiling::SpanKind::Phase ? "[" + p.name + "]" : p.name) << "</td><td>"
           << p.calls << "</td><td>" << fmt_seconds(p.forward_seconds) << "</td><td>"
           << fmt_seconds(p.backward_seconds) << "</td><td>" << pct << "</td><td><i class=\"bar\" style=\"width:"
           << int(std::lround(2 * share)) << "px;background:" << run_colour(i) << "\"></i></td></tr>";
      }
      os << "</table>\n";
    }
    if (!r.check_rows.empty()) {
      os << "<h3>titan check</h3>\n<table><tr><th>check</th><th>status</th><th>value</th><th>rule</th></tr>";
      for (auto& c : r.check_rows)
        os << "<tr><td>" << escape(c.check) << "</td><td class=\"" << (c.status == "FAIL" ? "fail" : "ok") << "\">"
           << escape(c.status) << "</td><td>" << escape(c.value) << "</td><td>" << escape(c.rule) << "</td></tr>";
      os << "</table>\n";
    }
    if (r.config_in_effect.empty()) {
      os << "<p class=\"none\">no run_info.json: the config in effect is in the run's start-up log</p>\n";
    } else {
      os << "<pre>" << escape(r.config_in_effect);
      for (auto& n : r.config_notes) os << "# config: " << escape(n) << "\n";
      os << "</pre>\n";
    }
  }
  os << "</body></html>\n";
  return os.str();
}

void write_report(const std::vector<fs::path>& run_dirs, const fs::path& out) {
  TITAN_CHECK(!run_dirs.empty(), "report: give at least one run folder");
  std::vector<RunRecord> runs;
  std::map<std::string, int> seen;
  for (auto& d : run_dirs) {
    runs.push_back(read_run(d));
    // Two runs in folders of the same name: tell them apart in the legend.
    if (int n = seen[runs.back().name]++; n > 0) runs.back().name += " (" + std::to_string(n + 1) + ")";
  }
  io::write_file_atomic(out, render_report(runs));
}

}  // namespace titan::train
