#pragma once
// Every key of torchtitan's TOML job config (all releases of the TOML era, April 2024 to
// February 2026, older spellings included) and what `titan train` does with it, so that a
// torchtitan job file runs unchanged. docs/training.md has the same table for people.
#include <string>
#include <string_view>
#include <vector>

namespace titan::train {

enum class TorchtitanUse {
  Native,   // one of titan's own keys, same meaning
  Alias,    // an older (or other) torchtitan spelling of `target`
  Ignored,  // accepted with a value of torchtitan's type for it: ignoring it cannot change the trained model
  OffOnly,  // accepted only with a value in `off` (the feature stays off); any other value is an error
};

// The values torchtitan accepts for an Ignored key: ignoring a key is no reason to take a value
// torchtitan itself would refuse (compile.enable = "yes").
enum class TorchtitanType {
  Bool,     // true or false
  Int,      // an integer
  Number,   // an integer or a float
  String,   // any string
  Choice,   // one of the '|'-separated strings in `choices`
  Strings,  // an array of strings, or one string (torchtitan's comma-separated list)
  Array,    // an array (of integers or of string lists: pipeline split points, module FQNs per stage)
};

struct TorchtitanKey {
  std::string_view key;     // "checkpoint.enable_checkpoint"
  TorchtitanUse use;
  std::string_view target;  // Alias: the key it stands for; OffOnly: the accepted values, '|'-separated
  std::string_view why;     // Ignored / OffOnly: why it may be ignored, or why titan cannot honour it
  TorchtitanType type = TorchtitanType::String;  // Ignored: the values it takes
  std::string_view choices;                      // Ignored, type Choice: the values, '|'-separated
};

const std::vector<TorchtitanKey>& torchtitan_keys();
// The entry for `key`, or nullptr when torchtitan never had that key.
const TorchtitanKey* find_torchtitan_key(std::string_view key);
// The accepted values of an OffOnly key.
std::vector<std::string> torchtitan_off_values(const TorchtitanKey& k);
// The values of an Ignored key of type Choice.
std::vector<std::string> torchtitan_choices(const TorchtitanKey& k);

}  // namespace titan::train
