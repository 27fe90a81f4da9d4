#include "titan/io/path_guard.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "titan/core/check.h"

namespace titan::io {
namespace fs = std::filesystem;

namespace {

const char* kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::not_found: return "does not exist";
    case fs::file_type::directory: return "is a directory";
    case fs::file_type::fifo: return "is a FIFO (named pipe)";
    case fs::file_type::socket: return "is a socket";
    case fs::file_type::block: return "is a block device";
    case fs::file_type::character: return "is a character device";
    default: return "is not a regular file";
  }
}

fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// True when `inner` is `outer` or lies below it (both resolved).
bool within(const fs::path& inner, const fs::path& outer) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty() && std::next(o) == outer.end()) break;  // trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

bool lies_within(const fs::path& inner, const fs::path& outer) {
  return within(resolved(inner), resolved(outer));
}

void check_regular_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  TITAN_CHECK(st.type() == fs::file_type::regular, what, ": '", path.string(), "' ", kind_of(st.type()),
              "; only regular files are read");
}

std::string read_regular_file(const fs::path& path, const std::string& what) {
  check_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in, what, ": cannot open '", path.string(), "'");
  std::ostringstream text;
  text << in.rdbuf();
  TITAN_CHECK(!in.bad(), what, ": error reading '", path.string(), "'");
  return std::move(text).str();
}

void check_output_path(const fs::path& out, const std::vector<fs::path>& inputs, const std::string& what) {
  TITAN_CHECK(!out.empty(), what, ": the path is empty");
  const fs::path o = resolved(out);
  for (const fs::path& in : inputs) {
    const fs::path i = resolved(in);
    TITAN_CHECK(o != i, what, ": '", out.string(), "' is the input '", in.string(),
                "'; writing it would destroy what it is made from");
    TITAN_CHECK(!within(i, o), what, ": '", out.string(), "' contains the input '", in.string(),
                "'; replacing it would destroy what it is made from");
    TITAN_CHECK(!within(o, i), what, ": '", out.string(), "' lies inside the input '", in.string(),
                "'; write the output elsewhere");
  }
  std::error_code ec;
  // A finished checkpoint is never written into: its manifest vouches for every file it holds.
  for (fs::path up = o.parent_path(); !up.empty(); up = up.parent_path()) {
    TITAN_CHECK(!fs::exists(up / "COMMITTED", ec), what, ": '", out.string(),
                "' lies inside the titan checkpoint '", up.string(),
                "'; writing there would change a finished checkpoint");
    if (up == up.parent_path()) break;
  }
  if (!fs::is_directory(fs::symlink_status(o, ec))) return;
  for (auto it = fs::recursive_directory_iterator(o, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    TITAN_CHECK(it->path().filename() != "COMMITTED", what, ": '", out.string(),
                "' holds the titan checkpoint '", it->path().parent_path().string(),
                "'; replacing the folder would delete it");
  }
}

void check_output_file(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs,
                       const std::string& what) {
  namespace fs = std::filesystem;
  // A folder given for the file is said as such first: that it also holds the inputs is beside the point.
  TITAN_CHECK(!fs::is_directory(out), what, ": '", out.string(), "' is a folder; give the file to write");
  check_output_path(out, inputs, what);
  const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
  TITAN_CHECK(fs::is_directory(folder), what, ": the folder '", folder.string(), "' does not exist");
}

std::string unwritable_reason(const fs::path& folder) {
  // The folder, or the nearest one above it that exists: where the writes (or the folder's creation)
  // will happen.
  std::error_code ec;
  fs::path at = fs::absolute(folder.empty() ? fs::path(".") : folder, ec).lexically_normal();
  while (at.has_relative_path() && !fs::exists(fs::status(at, ec)) && at.has_parent_path())
    at = at.parent_path();
  // (Built piece by piece: "'" + path + "'" trips GCC 12's -Wrestrict false positive.)
  std::string quoted;
  quoted.push_back('\'');
  quoted += at.native();
  quoted.push_back('\'');
  if (!fs::is_directory(at, ec)) return quoted + " is not a folder";
  // A folder made and removed, as a save makes its temporary one: permissions, a read-only mount, an
  // immutable folder (which stops root too) all refuse it.
  // mkdtemp's random name: ranks on other hosts probe a shared folder at once, with pids that may
  // coincide.
  std::string probe = (at / ".titan-write-probe-XXXXXX").string();
  if (!::mkdtemp(probe.data())) {
    const int err = errno;
    const bool itself = at == fs::absolute(folder.empty() ? fs::path(".") : folder, ec).lexically_normal();
    return "creating a folder in " + (itself ? std::string("it") : quoted) + " failed: " + std::strerror(err);
  }
  ::rmdir(probe.c_str());
  return "";
}

void check_writable_folder(const fs::path& folder, const std::string& what, const std::string& consequence) {
  const std::string why = unwritable_reason(folder);
  TITAN_CHECK(why.empty(), what, ": '", folder.string(), "' cannot be written (", why, "): ", consequence);
}

}  // namespace titan::io
