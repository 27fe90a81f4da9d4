#pragma once
// normal_init's CPU kernels' shared pieces (reference.cpp, cpu.cpp), and the vectorised draw of the
// "default" variant at double precision, before the scaling and rounding to f32 hide its last bits:
// what tests/ops/normal_init_test.cpp compares with the reference arithmetic lane by lane.
#include <cstdint>
#include <functional>

namespace titan::ops {

// Elements [begin, begin + n) in chunks of 64 Ki over the OpenMP threads: draw(b, e) per chunk. (The
// largest parameter, a 0.6B model's 155M-element embedding, does not set the pace alone.)
void for_each_init_chunk(int64_t begin, int64_t n, const std::function<void(int64_t b, int64_t e)>& draw);

// Normal pairs first_pair .. first_pair + count - 1 into z[0, 2 count) (component 0 of pair p at
// z[2 (p - first_pair)], component 1 after it), by the widest tier kernel_isa() allows; false, and
// nothing written, when that tier has no vectorised draw.
bool normal_pairs_vectorised(uint64_t stream, uint64_t first_pair, int64_t count, double* z);

}  // namespace titan::ops
