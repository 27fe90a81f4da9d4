#pragma once
// Testing hook of the CPU loss kernels (ops/cross_entropy/cross_entropy.h defines the ops): with portable_only set,
// the "default" cross_entropy and linear_cross_entropy kernels take their portable row loops (what
// CPUs without AVX-512 run) instead of the AVX-512 ones, so both paths are checked on any machine.
// Set it while no loss kernel is running.
namespace titan::cpu {

void cross_entropy_limit_isa(bool portable_only);

}  // namespace titan::cpu
