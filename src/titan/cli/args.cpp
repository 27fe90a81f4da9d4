#include "titan/cli/args.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/parse.h"
#include "titan/core/suggest.h"
#include "titan/train/job_config.h"
#include "titan/train/log.h"
#include "titan/train/step_profile.h"

namespace titan::cli {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {
  // Errors name the command alone ("titan report: ..."), the usage line its arguments too.
  std::istringstream words(command_);
  for (std::string word;
       words >> word && !std::isupper(static_cast<unsigned char>(word[0])) && word[0] != '[';)
    name_ += (name_.empty() ? "" : " ") + word;
}

ArgParser& ArgParser::option(const std::string& name, const std::string& help, std::optional<std::string> def) {
  order_.push_back(name);
  specs_[name] = {help, false, false, std::move(def)};
  return *this;
}

ArgParser& ArgParser::required(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {help, false, true, std::nullopt};
  return *this;
}

ArgParser& ArgParser::flag(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {help, true, false, std::nullopt};
  return *this;
}

ArgParser& ArgParser::may_be_empty(const std::string& name) {
  auto it = specs_.find(name);
  TITAN_CHECK(it != specs_.end() && !it->second.is_flag, "ArgParser: may_be_empty of an undeclared option --",
              name);
  it->second.may_be_empty = true;
  return *this;
}

ArgParser& ArgParser::default_in_help(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    auto it = specs_.find(name);
    TITAN_CHECK(it != specs_.end() && it->second.def, "ArgParser: default_in_help of --", name,
                ", not a declared option with a default");
    it->second.default_in_help = true;
  }
  return *this;
}

ArgParser& ArgParser::takes_positional() {
  takes_positional_ = true;
  return *this;
}

std::string device_suggestion(const std::string& text) {
  std::string lower;
  for (char c : text) lower += char(std::tolower(static_cast<unsigned char>(c)));
  for (const char* gpu : {"gpu", "cuda:", "nvidia"})
    if (lower.rfind(gpu, 0) == 0) return "; did you mean 'cuda'?";
  return suggestion(text, {"cpu", "cuda"});
}

std::string ArgParser::usage() const {
  std::string u = "usage: titan " + command_ + " [options]\n" + summary_ + "\n\noptions:\n";
  for (auto& n : order_) {
    const Spec& s = specs_.at(n);
    char line[512];
    std::string left = "--" + n + (s.is_flag ? "" : " VALUE");
    std::string right = s.help + (s.is_required ? " (required)" : "") +
                        (s.def && !s.default_in_help ? " [default: " + *s.def + "]" : "");
    std::snprintf(line, sizeof line, "  %-28s %s\n", left.c_str(), right.c_str());
    u += line;
  }
  return u;
}

bool ArgParser::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage().c_str());
      return false;
    }
    if (a.rfind("--", 0) != 0) {
      TITAN_CHECK(takes_positional_, "titan ", name_, ": unexpected argument '", a,
                  "' (options start with --; see --help)");
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      std::string near = nearest(name, order_);
      TITAN_FAIL("titan ", name_, ": unknown option '--", name, "'",
                 near.empty() ? "" : "; did you mean '--" + near + "'?", " (see --help)");
    }
    if (it->second.is_flag) {
      TITAN_CHECK(!has_value, "titan ", name_, ": --", name, " takes no value");
      values_[name] = "true";
      continue;
    }
    if (!has_value) {
      TITAN_CHECK(i + 1 < argc, "titan ", name_, ": --", name, " needs a value");
      value = argv[++i];
    }
    TITAN_CHECK(!values_.count(name), "titan ", name_, ": --", name, " is given twice ('", values_[name],
                "', '", value, "'): give it once");
    TITAN_CHECK(!value.empty() || it->second.may_be_empty, "titan ", name_, ": --", name,
                " is empty; give it a value or leave it out (an unset shell variable?)");
    values_[name] = value;
  }
  for (auto& [n, s] : specs_)
    TITAN_CHECK(!s.is_required || values_.count(n), "titan ", name_, ": missing required option --", n,
                " (see --help)");
  return true;
}

std::string ArgParser::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  auto s = specs_.find(name);
  TITAN_CHECK(s != specs_.end() && s->second.def, "titan ", name_, ": option --", name, " has no value");
  return *s->second.def;
}

std::optional<std::string> ArgParser::get_optional(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto s = specs_.find(name); s != specs_.end() && s->second.def) return s->second.def;
  return std::nullopt;
}

bool ArgParser::has(const std::string& name) const { return values_.count(name) > 0; }

int64_t ArgParser::get_int(const std::string& name, int64_t min) const {
  return parse_int_option(name_, name, get(name), min);
}

int64_t parse_int_option(const std::string& command, const std::string& name, const std::string& text,
                         int64_t min) {
  const std::optional<int64_t> v = parse_int(text);
  TITAN_CHECK(v && *v >= min, "titan ", command, ": --", name, " ", text, ": expected an integer >= ", min);
  return *v;
}

JobArgs parse_job_args(const std::string& command, int argc, char** argv, const std::vector<std::string>& own) {
  JobArgs r;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      r.help = true;
      return r;
    }
    TITAN_CHECK(a.rfind("--", 0) == 0 && a.size() > 2, "titan ", command, ": unexpected argument '", a,
                "' (options start with -- and name a key: --section.key=value)");
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    // A name without a section is none of the job config's keys: said as what it is, whatever
    // follows it.
    if (key != "config" && std::find(own.begin(), own.end(), key) == own.end() &&
        key.find('.') == std::string::npos) {
      std::string options = "--config";
      for (const std::string& o : own) options += ", --" + o;
      // The config keys of that name ("--steps": training.steps, validation.steps), a few at most;
      // else the command's own option nearest to it ("--confg": --config).
      std::string named;
      int matches = 0;
      for (const std::string& k : train::job_config_keys())
        if (k.size() > key.size() && k.compare(k.size() - key.size(), key.size(), key) == 0 &&
            k[k.size() - key.size() - 1] == '.' && ++matches <= 3)
          named += (named.empty() ? "; did you mean --" : " or --") + k;
      if (matches == 0 || matches > 3) {
        std::vector<std::string> names = {"config"};
        names.insert(names.end(), own.begin(), own.end());
        const std::string near = nearest(key, names);
        named = near.empty() ? "" : "; did you mean --" + near;
        matches = near.empty() ? 0 : 1;
      }
      TITAN_FAIL("titan ", command, ": unknown option --", key, " (its options: ", options,
                 "; the job config's keys are --section.key=value",
                 matches > 0 && matches <= 3 ? named + "?" : "", ")");
    }
    if (eq == std::string::npos) {
      const bool bare = i + 1 == argc || std::string(argv[i + 1]).rfind("--", 0) == 0;
      // A boolean key given bare is true, and its "no_" spelling false (torchtitan's command line:
      // --checkpoint.enable, --checkpoint.no_initial_load_model_only).
      const size_t dot = key.rfind('.');
      const std::string negated =
          key.compare(dot + 1, 3, "no_") == 0 ? key.substr(0, dot + 1) + key.substr(dot + 4) : "";
      if (bare && train::is_boolean_key(key)) {
        value = "true";
      } else if (bare && !negated.empty() && train::is_boolean_key(negated)) {
        key = negated;
        value = "false";
      } else {
        // The next option is not this key's value (a value that starts with -- is given as
        // --key=--value): a mistyped boolean (--checkpoint.enabel) is said as the unknown key it is.
        if (bare && key != "job.config_file") train::check_known_key(key);
        TITAN_CHECK(
            !bare, "titan ", command, ": --", key, " needs a value",
            i + 1 < argc ? std::string(" (the next argument, '") + argv[i + 1] + "', is an option)" : "");
        value = argv[++i];
      }
    }
    // torchtitan's launcher names the job file with --job.config_file.
    if (key == "job.config_file") key = "config";
    TITAN_CHECK(!value.empty() || (key != "config" && std::find(own.begin(), own.end(), key) == own.end()),
                "titan ", command, ": --", key,
                " is empty; give it a value or leave it out (an unset shell "
                "variable?)");
    if (key == "config") {
      TITAN_CHECK(r.config.empty(), "titan ", command, ": --config is given twice ('", r.config, "', '",
                  value, "'): a run has one job config (change single keys with --section.key=value)");
      r.config = value;
    } else if (std::find(own.begin(), own.end(), key) != own.end()) {
      // As ArgParser: a second value is a mistake to name, not a silent last-wins.
      TITAN_CHECK(!r.own.count(key), "titan ", command, ": --", key, " is given twice ('", r.own[key], "', '",
                  value, "')");
      r.own[key] = value;
    } else {
      r.overrides.emplace_back(key, value);
    }
  }
  TITAN_CHECK(!r.config.empty(), "titan ", command, ": --config FILE.toml is required (see configs/)");
  return r;
}

std::string after_step_peak_line(const train::StepProfile& p, const train::StepShape& shape) {
  if (!p.after_step_peak) return "";
  const std::string validation = "by the [validation] forward",
                    exporting = "by the Hugging Face export (a block gathered whole at a time)";
  return "    after the step: " + memory_text(p.after_step_peak) + " held " +
         (shape.validation_batch > 0 && shape.export_gather ? "at most, " + validation + " or " + exporting
          : shape.validation_batch > 0                      ? validation
                                                            : exporting) +
         "\n";
}

std::string compute_weights_line(const train::StepProfile& p) {
  if (!p.compute_weights) return "";
  // The figure shrinks under activation checkpointing on one process: what it holds is said, so it
  // does not read as the whole model's copy.
  std::vector<std::string> cast;
  auto layers = [](int64_t n) { return train::counted(n, "layer"); };
  if (p.cast_layers) cast.push_back("the " + layers(p.cast_layers) + " activation checkpointing covers");
  if (p.cast_experts_only)
    cast.push_back("the experts of the " + layers(p.cast_experts_only) +
                   " activation checkpointing covers (each rank's run of them, held whole)");
  if (p.cast_embedding) cast.push_back("the untied embedding table");
  std::string held = "written by AdamW with each update: no step casts the weights";
  if (!cast.empty()) {
    held = "written by AdamW with each update, of every trained block but " + cast[0];
    for (size_t i = 1; i < cast.size(); ++i) held += (i + 1 == cast.size() ? " and " : ", ") + cast[i];
    held += ": a step casts those at each use";
  }
  return "  weights (bf16 copy)  " + memory_text(p.compute_weights) + " (" + held + ")\n";
}

std::string memory_text(int64_t bytes) {
  // GiB, except where two decimals of a GiB would say little or nothing (under 10 MiB: a tiny
  // model's, a test checkpoint's kilobytes), in the unit that shows it.
  char buf[32];
  const double b = double(bytes);
  if (bytes >= (int64_t(10) << 20) || bytes == 0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  else if (bytes >= (int64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(int64_t(1) << 20));
  else
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  return buf;
}

}  // namespace titan::cli
