#pragma once
// The assets scripts/setup.sh (scripts/fetch_assets.sh) prepares: the Qwen3 tokenizer
// and the built-in datasets. Missing assets are an error that says how to get them.
#include <filesystem>
#include <string>
#include <string_view>

namespace titan::data {

// $TITAN_ASSETS_DIR, else the first `assets` folder holding a `.complete` marker found
// in the working directory, the executable's folder, or one of their parents.
std::filesystem::path assets_dir();

std::filesystem::path default_tokenizer_path();  // <assets>/tokenizer/qwen3

// A built-in dataset by name: "nlp-corpus" (`training.dataset`'s default) or "nlp-corpus-validation"
// (`validation.dataset`'s default: documents held out of nlp-corpus by scripts/fetch_assets.sh).
std::filesystem::path builtin_dataset_path(std::string_view name, std::string_view section = "training");
// "" when `name` is a built-in dataset; else why not, with the names there are.
std::string builtin_dataset_error(std::string_view name, std::string_view section = "training");
std::filesystem::path default_dataset_path();

}  // namespace titan::data
