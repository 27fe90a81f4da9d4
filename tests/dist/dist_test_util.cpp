#include "dist_test_util.h"

#include <algorithm>
#include <memory>

#include "titan/dist/communicator.h"

namespace titan::testing {

dist::Communicator& rank_world() {
  static std::unique_ptr<dist::Communicator> world = dist::launch_communicator(dist::CommTimeout(60));
  return *world;
}

std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace titan::testing
