#include "titan/ops/same_device.h"

#include <string>

#include "titan/core/check.h"

namespace titan::ops {

void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  const Tensor* first = nullptr;
  bool same = true;
  for (const auto& [name, t] : tensors) {
    if (!t->defined()) continue;
    if (!first)
      first = t;
    else if (t->device() != first->device())
      same = false;
  }
  if (same) return;
  std::string list;
  for (const auto& [name, t] : tensors) {
    if (!t->defined()) continue;
    if (!list.empty()) list += ", ";
    list += std::string(name) + " " + t->str() + " on " + std::string(device_name(t->device()));
  }
  TITAN_FAIL(op, ": ", list, ": an op's tensors must all be on one device");
}

}  // namespace titan::ops
