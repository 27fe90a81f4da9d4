#pragma once
// A small, strict option parser shared by the subcommands:
//   --name VALUE | --name=VALUE | --flag ; --help prints usage.
// Unknown options are errors that suggest the nearest known one; an option given twice is an error.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace titan::train {
struct StepProfile;
struct StepShape;
}  // namespace titan::train

namespace titan::cli {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);
  ArgParser& option(const std::string& name, const std::string& help, std::optional<std::string> def = std::nullopt);
  ArgParser& required(const std::string& name, const std::string& help);
  ArgParser& flag(const std::string& name, const std::string& help);
  // Option `name` (declared before) takes an empty value as a value (generate's --system ""). Every
  // other option refuses one: an unset shell variable (--tokenizer "$TOK") must not read as the
  // option left out and bring its default.
  ArgParser& may_be_empty(const std::string& name);
  // Options (declared before, with a default) whose help text says their default itself, because
  // the default shown would not be true: generate's, where the model's generation_config.json
  // decides when the flag is absent. usage() then prints no "[default: X]" for them.
  ArgParser& default_in_help(const std::vector<std::string>& names);
  // The command takes arguments that are not options (report's run folders); without this call
  // one is an error.
  ArgParser& takes_positional();

  // Returns false when --help was given (usage already printed). Throws titan::Error on bad input.
  bool parse(int argc, char** argv);

  std::string get(const std::string& name) const;  // required or defaulted options
  // An integer option (required or defaulted): the whole value must be an integer >= `min`.
  int64_t get_int(const std::string& name, int64_t min) const;
  std::optional<std::string> get_optional(const std::string& name) const;
  bool has(const std::string& name) const;          // flag given / option set
  const std::vector<std::string>& positional() const { return positional_; }
  std::string usage() const;

 private:
  struct Spec {
    std::string help;
    bool is_flag = false, is_required = false;
    std::optional<std::string> def;
    bool may_be_empty = false;
    bool default_in_help = false;
  };
  // command_: the usage line's words ("verify-export DIR"); name_: the command alone, as errors name
  // it ("verify-export").
  std::string command_, name_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool takes_positional_ = false;
};

// The arguments of the job-config commands (train, check, info --config): `--config FILE.toml`, the command's
// own options (`own`, each taking a non-empty value), and every other `--section.key=value` (or
// `--section.key value`) as a config override, in order (an override may be empty: a string key's
// empty value). `help` is set by --help / -h.
struct JobArgs {
  std::string config;
  std::map<std::string, std::string> own;
  std::vector<std::pair<std::string, std::string>> overrides;
  bool help = false;
};
JobArgs parse_job_args(const std::string& command, int argc, char** argv, const std::vector<std::string>& own = {});

// `text`, the value of option --`name` of `command`, as an integer >= `min`; anything else ("1e3",
// "512abc", "2.5") is an error naming the option.
int64_t parse_int_option(const std::string& command, const std::string& name, const std::string& text,
                         int64_t min);

// The "; did you mean ...?" of a --device that is neither cpu nor cuda: 'cuda' for a GPU named as
// other tools name it ("gpu", "cuda:0", "nvidia"; the nearest spelling of "gpu" is "cpu", the
// opposite of what was meant), else the nearest of the two.
std::string device_suggestion(const std::string& text);

// Bytes as the memory tables of `titan info` and `titan plan` print them: "1.96 GiB" (MiB or KiB
// under 10 MiB: "754.75 KiB").
std::string memory_text(int64_t bytes);
// "    after the step: 1.20 GiB held by the [validation] forward\n" (or "by the Hugging Face export
// (a block gathered whole at a time)", or "at most, " either) when the profiled step is followed by
// a validation pass or an export, else "" (titan info and titan plan).
std::string after_step_peak_line(const train::StepProfile& p, const train::StepShape& shape);
// "  weights (bf16 copy)  0.70 GiB (...)\n": the copy AdamW writes and, where some trained blocks keep
// none (StepProfile::cast_layers ...), which ones a step casts at each use instead; "" without a copy.
std::string compute_weights_line(const train::StepProfile& p);

}  // namespace titan::cli
