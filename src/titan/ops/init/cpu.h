#pragma once
// The vectorised draw of normal_init's CPU "default" variant at double precision, before the scaling
// and rounding to f32 hide its last bits: what tests/ops/normal_init_test.cpp compares with the
// reference arithmetic (init_draw::normal_pair) lane by lane.
#include <cstdint>

namespace titan::ops {

// Normal pairs first_pair .. first_pair + count - 1 into z[0, 2 count) (component 0 of pair p at
// z[2 (p - first_pair)], component 1 after it), by the widest tier kernel_isa() allows; false, and
// nothing written, when that tier has no vectorised draw.
bool normal_pairs_vectorised(uint64_t stream, uint64_t first_pair, int64_t count, double* z);

}  // namespace titan::ops
