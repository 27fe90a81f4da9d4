#pragma once
// The index maps of the MoE grouped GEMMs on mma.sync (ops/moe/cuda.cu), as plain functions of a
// thread's index: which element of a shared-memory tile each lane hands to ldmatrix, which output
// element each accumulator register holds, which 16-byte chunk of a pipeline stage each thread
// copies. Plain C++ (host and device), so that tests/ops/moe_mma_layout_test.cpp checks them on any
// machine against the PTX ISA's definitions of ldmatrix and mma.m16n8k16, GPU or not.
#ifdef __CUDACC__
#define TITAN_HOST_DEVICE __host__ __device__
#else
#define TITAN_HOST_DEVICE
#endif

namespace titan::ops::moe_mma {

// The offset (in elements, from the tile's start) of the row address `lane` passes to ldmatrix_x4
// for one 16 x 16 operand fragment, given the operand's tile layout ([row][k]: K contiguous, rows ld
// elements apart; the others alike). The four 8 x 8 matrices must come out in the order
// mma.m16n8k16 takes them: A: (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15,
// k hi); B: (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi). The [k][...] layouts are
// read with ldmatrix's .trans.
// A [row][k], fragment at (row0, k0).
TITAN_HOST_DEVICE constexpr int frag_a_rk(int ld, int row0, int k0, int lane) {
  return (row0 + lane % 16) * ld + k0 + (lane / 16) * 8;
}
// A [k][row] (the weight gradient's transposed A), fragment at (row0, k0).
TITAN_HOST_DEVICE constexpr int frag_a_kr(int ld, int k0, int row0, int lane) {
  return (k0 + lane % 8 + (lane / 16) * 8) * ld + row0 + ((lane / 8) % 2) * 8;
}
// B [n][k] (B^T), fragment at (n0, k0).
TITAN_HOST_DEVICE constexpr int frag_b_nk(int ld, int n0, int k0, int lane) {
  return (n0 + lane % 8 + (lane / 16) * 8) * ld + k0 + ((lane / 8) % 2) * 8;
}
// B [k][n], fragment at (k0, n0).
TITAN_HOST_DEVICE constexpr int frag_b_kn(int ld, int k0, int n0, int lane) {
  return (k0 + lane % 8 + ((lane / 8) % 2) * 8) * ld + n0 + (lane / 16) * 8;
}

// Where accumulator register v (0-3) of tile acc[i][j] of `lane` lands in the block's result: a
// warp (wm, wn) holds 64 x 64 of it as 4 x 8 tiles of 16 x 8 (mma.m16n8k16's C: registers 0 and 1
// at row g, columns 2t and 2t + 1; 2 and 3 at row g + 8; g = lane / 4, t = lane % 4).
struct TileElement {
  int row, col;
};
TITAN_HOST_DEVICE constexpr TileElement mma_tile_element(int wm, int wn, int i, int j, int v, int lane) {
  return {wm * 64 + i * 16 + lane / 4 + (v / 2) * 8, wn * 64 + j * 8 + 2 * (lane % 4) + v % 2};
}

// The 16-byte (8-element) chunks of a [kRows][kCols] bf16 pipeline stage that thread `thread` of
// kThreads copies: chunk c (of stage_chunks) is row stage_chunk_row(c), columns
// stage_chunk_column(c) .. + 7.
template <int kRows, int kCols, int kThreads>
TITAN_HOST_DEVICE constexpr int stage_chunks() {
  static_assert(kRows * kCols % (8 * kThreads) == 0, "whole chunks per thread");
  return kRows * kCols / 8 / kThreads;
}
template <int kCols, int kThreads>
TITAN_HOST_DEVICE constexpr int stage_chunk_row(int c, int thread) {
  return (thread + c * kThreads) / (kCols / 8);
}
template <int kCols, int kThreads>
TITAN_HOST_DEVICE constexpr int stage_chunk_column(int c, int thread) {
  return (thread + c * kThreads) % (kCols / 8) * 8;
}

}  // namespace titan::ops::moe_mma
