#pragma once
// Guards on the paths a command reads and writes: inputs must be regular files (a FIFO or a
// device named model.safetensors would hang or never end), and an output must never be, contain or
// lie inside what the command reads, nor swallow a titan checkpoint, because writing it (an
// --overwrite replaces a whole folder) would destroy the very data it is made from.
#include <filesystem>
#include <string>
#include <vector>

namespace titan::io {

// `what: '<path>' is not a regular file (a FIFO / directory / ...)` unless `path` (symlinks followed)
// is a regular file. A missing file is an error too.
void check_regular_file(const std::filesystem::path& path, const std::string& what);

// The whole of the regular file `path` (check_regular_file first); a file that cannot be opened or
// read to its end is an error naming `what` and the path.
std::string read_regular_file(const std::filesystem::path& path, const std::string& what);

// True when `inner` is `outer` or lies below it, both resolved through symlinks and "..".
bool lies_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

// `out` (resolved through symlinks and "..") must not be any of `inputs`, an ancestor of one, or
// inside one; it must not lie inside a titan checkpoint (a folder above it holds COMMITTED), and an
// existing folder `out` must not hold one (a COMMITTED marker at any depth). Errors name `what`
// (e.g. "--out"), both paths and the rule.
void check_output_path(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs,
                       const std::string& what);

// check_output_path for an output FILE, before the command's work rather than after it: also its
// folder must exist and `out` must not be a folder (said first).
void check_output_file(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs,
                       const std::string& what);

// "" when `folder` can be written (see check_writable_folder); else why not ("'/x' is not a folder",
// "creating a folder in it failed: Permission denied").
std::string unwritable_reason(const std::filesystem::path& folder);
// Checks, before a command's work, that `folder` can be written: a folder is created in it and
// removed again (where `folder` does not exist yet, in the nearest folder above it, where it would be
// created). Otherwise an error `what: '<folder>' cannot be written (<why>): <consequence>`, naming
// `what` (the key or option that chose the folder); a file in its place or above it is one too.
void check_writable_folder(const std::filesystem::path& folder, const std::string& what,
                           const std::string& consequence);

}  // namespace titan::io
