#pragma once
// Every tensor an op takes must be on one device: a kernel handed another device's pointer faults
// far from the cause (a host pointer read on the GPU surfaces as an illegal address at the next
// synchronisation), so the ops check their tensors before choosing a kernel.
#include <initializer_list>
#include <utility>

#include "titan/core/tensor.h"

namespace titan::ops {

// {"x", &x}, {"w", &w}, ...; undefined tensors are skipped. The error names the op and each tensor
// with its device: "linear: x f32[4, 8] on cuda, w f32[8, 8] on cpu: an op's tensors must all be on
// one device".
void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors);

}  // namespace titan::ops
