// The index maps of the MoE mma.sync GEMMs (ops/moe/mma_layout.h) against the PTX ISA's definitions
// of ldmatrix.x4 (.trans) and mma.m16n8k16 (bf16), on the host: the kernels' fragments, put
// together as ops/moe/cuda.cu's mma_k_step puts them, must multiply the tiles the kernels stage, for
// each of the three operand layouts; and every 16-byte chunk of every pipeline stage must be copied
// by exactly one thread. A GPU runs the kernels themselves (tests/backend/cuda_moe_test.cpp); these
// checks hold on every machine, and say which map is wrong when one is.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/ops/moe/mma_layout.h"

namespace titan::ops::moe_mma {
namespace {

// What ldmatrix.x4 leaves in a warp: regs[lane][m][h], element h of register m of `lane`. Lanes
// 8m .. 8m + 7 give the addresses of rows 0-7 of matrix m; without .trans, lane l receives (row
// l / 4, columns 2 (l % 4) + h) of each matrix; with .trans, the matrix transposed: (row 2 (l % 4) +
// h, column l / 4).
using Fragment = std::vector<std::array<std::array<float, 2>, 4>>;  // [lane][register][half]
Fragment ldmatrix_x4(const std::vector<float>& tile, const std::function<int(int lane)>& row_address,
                     bool trans) {
  Fragment out(32);
  for (int m = 0; m < 4; ++m)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int h = 0; h < 2; ++h)
        out[size_t(lane)][size_t(m)][size_t(h)] = trans ? tile[size_t(row_address(8 * m + 2 * t + h) + g)]
                                                        : tile[size_t(row_address(8 * m + g) + 2 * t + h)];
    }
  return out;
}

// mma.m16n8k16 with A in registers 0-3 of `a` (a0: row g, k 2t + h; a1: row g + 8; a2: row g, k
// 2t + 8 + h; a3: row g + 8, k 2t + 8 + h) and B in registers b0, b1 of `b` (k 2t + h and 2t + 8 +
// h, column g): C [16][8] += A B.
void mma_16x8x16(const Fragment& a, const Fragment& b, int b0, int b1, float (&c)[16][8]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& ar = a[size_t(lane)];
    const auto& br = b[size_t(lane)];
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = ar[0][size_t(h)];
      A[g + 8][2 * t + h] = ar[1][size_t(h)];
      A[g][2 * t + 8 + h] = ar[2][size_t(h)];
      A[g + 8][2 * t + 8 + h] = ar[3][size_t(h)];
      B[2 * t + h][g] = br[size_t(b0)][size_t(h)];
      B[2 * t + 8 + h][g] = br[size_t(b1)][size_t(h)];
    }
  }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 16; ++k) c[i][j] += A[i][k] * B[k][j];
}

enum class Layout {
  kRowsTimesBT,  // the rows GEMM with B^T [n][k] (the forward's)
  kRowsTimesB,   // the rows GEMM with B [k][n] (the backward's dh and dx)
  kWeightGrad,   // A^T [k][m] times B [k][n] (the weight gradients)
};

// One warp (wm, wn) of a block of 2 x kWarpsN warps over one 32-deep K step, as mma_k_step runs it:
// the product of the staged tiles must come out of the accumulators at mma_tile_element's places.
void check_warp_tile(Layout layout, int kWarpsN, int wm, int wn) {
  constexpr int kM = 128, kK = 32;
  const int kN = 64 * kWarpsN;
  const int ld_k = kK + 8, ld_n = kN + 8, ld_m = kM + 8;  // the kernels' padded tile rows
  // Small integers: every product and sum is exact in f32.
  std::vector<float> a(size_t(kM * kK)), b(size_t(kK * kN));  // A [m][k], B [k][n]
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int((i * 7 + 3) % 11) - 5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int((i * 5 + 1) % 13) - 6);
  std::vector<float> a_tile, b_tile;
  if (layout == Layout::kWeightGrad) {
    a_tile.assign(size_t(kK * ld_m), 0.f);  // [k][m]
    for (int m = 0; m < kM; ++m)
      for (int k = 0; k < kK; ++k) a_tile[size_t(k * ld_m + m)] = a[size_t(m * kK + k)];
  } else {
    a_tile.assign(size_t(kM * ld_k), 0.f);  // [m][k]
    for (int m = 0; m < kM; ++m)
      for (int k = 0; k < kK; ++k) a_tile[size_t(m * ld_k + k)] = a[size_t(m * kK + k)];
  }
  if (layout == Layout::kRowsTimesBT) {
    b_tile.assign(size_t(kN * ld_k), 0.f);  // [n][k]
    for (int k = 0; k < kK; ++k)
      for (int n = 0; n < kN; ++n) b_tile[size_t(n * ld_k + k)] = b[size_t(k * kN + n)];
  } else {
    b_tile.assign(size_t(kK * ld_n), 0.f);  // [k][n]
    for (int k = 0; k < kK; ++k)
      for (int n = 0; n < kN; ++n) b_tile[size_t(k * ld_n + n)] = b[size_t(k * kN + n)];
  }

  float acc[4][8][16][8] = {};  // [i][j]: the 16 x 8 tile of mma_k_step's acc[i][j]
  for (int ks = 0; ks < kK / 16; ++ks) {
    Fragment af[4];
    for (int i = 0; i < 4; ++i)
      af[i] = layout == Layout::kWeightGrad
                  ? ldmatrix_x4(
                        a_tile, [&](int l) { return frag_a_kr(ld_m, ks * 16, wm * 64 + i * 16, l); }, true)
                  : ldmatrix_x4(
                        a_tile, [&](int l) { return frag_a_rk(ld_k, wm * 64 + i * 16, ks * 16, l); }, false);
    for (int j2 = 0; j2 < 4; ++j2) {
      const Fragment bf =
          layout == Layout::kRowsTimesBT
              ? ldmatrix_x4(
                    b_tile, [&](int l) { return frag_b_nk(ld_k, wn * 64 + j2 * 16, ks * 16, l); }, false)
              : ldmatrix_x4(
                    b_tile, [&](int l) { return frag_b_kn(ld_n, ks * 16, wn * 64 + j2 * 16, l); }, true);
      for (int i = 0; i < 4; ++i) {  // mma_16x16x16: registers 0, 1 for columns 0-7; 2, 3 for 8-15
        mma_16x8x16(af[i], bf, 0, 1, acc[i][2 * j2]);
        mma_16x8x16(af[i], bf, 2, 3, acc[i][2 * j2 + 1]);
      }
    }
  }
  // Register v of lane holds C element (g + 8 (v / 2), 2t + v % 2) of its 16 x 8 tile.
  int wrong = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j)
      for (int lane = 0; lane < 32; ++lane)
        for (int v = 0; v < 4; ++v) {
          const float got = acc[i][j][lane / 4 + (v / 2) * 8][2 * (lane % 4) + v % 2];
          const TileElement at = mma_tile_element(wm, wn, i, j, v, lane);
          float want = 0.f;
          for (int k = 0; k < kK; ++k) want += a[size_t(at.row * kK + k)] * b[size_t(k * kN + at.col)];
          if (got != want && ++wrong <= 3)
            ADD_FAILURE() << "acc[" << i << "][" << j << "] register " << v << " of lane " << lane << " -> ("
                          << at.row << ", " << at.col << "): " << got << ", the product holds " << want;
        }
  EXPECT_EQ(wrong, 0);
}

TEST(MoeMmaLayout, TheFragmentsOfEachOperandLayoutMultiplyTheStagedTiles) {
  for (const Layout layout : {Layout::kRowsTimesBT, Layout::kRowsTimesB, Layout::kWeightGrad})
    for (const int warps_n : {2, 4})  // mma_sync and mma_sync_wide
      for (int wm = 0; wm < 2; ++wm)
        for (int wn = 0; wn < warps_n; ++wn) {
          SCOPED_TRACE("layout " + std::to_string(int(layout)) + ", kWarpsN " + std::to_string(warps_n) +
                       ", warp (" + std::to_string(wm) + ", " + std::to_string(wn) + ")");
          check_warp_tile(layout, warps_n, wm, wn);
        }
}

// Each warp's accumulators cover its 64 x 64 share once, and the warps the block's tile.
TEST(MoeMmaLayout, TheAccumulatorsCoverTheBlocksTileOnce) {
  for (const int warps_n : {2, 4}) {
    std::vector<int> hits(size_t(128 * 64 * warps_n), 0);
    for (int wm = 0; wm < 2; ++wm)
      for (int wn = 0; wn < warps_n; ++wn)
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 8; ++j)
            for (int lane = 0; lane < 32; ++lane)
              for (int v = 0; v < 4; ++v) {
                const TileElement at = mma_tile_element(wm, wn, i, j, v, lane);
                ASSERT_TRUE(at.row >= 0 && at.row < 128 && at.col >= 0 && at.col < 64 * warps_n);
                ++hits[size_t(at.row * 64 * warps_n + at.col)];
              }
    for (size_t e = 0; e < hits.size(); ++e)
      ASSERT_EQ(hits[e], 1) << "element " << e << ", kWarpsN " << warps_n;
  }
}

// Every stage the kernels load: rows GEMM A [128][32] and B^T [kN][32] or B [32][kN]; weight
// gradient A^T [32][128] and B [32][kN]; with the 128 threads of mma_sync and the 256 of the wide.
template <int kRows, int kCols, int kThreads>
void check_stage() {
  SCOPED_TRACE(std::to_string(kRows) + " x " + std::to_string(kCols) + " over " + std::to_string(kThreads) +
               " threads");
  std::vector<int> hits(size_t(kRows * kCols / 8), 0);
  for (int thread = 0; thread < kThreads; ++thread)
    for (int c = 0; c < stage_chunks<kRows, kCols, kThreads>(); ++c) {
      const int i = stage_chunk_row<kCols, kThreads>(c, thread),
                j = stage_chunk_column<kCols, kThreads>(c, thread);
      ASSERT_TRUE(i >= 0 && i < kRows && j >= 0 && j < kCols && j % 8 == 0) << i << ", " << j;
      ++hits[size_t(i * (kCols / 8) + j / 8)];
    }
  for (size_t chunk = 0; chunk < hits.size(); ++chunk) ASSERT_EQ(hits[chunk], 1) << "chunk " << chunk;
}

TEST(MoeMmaLayout, EveryChunkOfEveryStageIsCopiedByOneThread) {
  check_stage<128, 32, 128>();  // A [128][32], B^T [kN = 128][32]
  check_stage<128, 32, 256>();  // A [128][32] in the wide block
  check_stage<256, 32, 256>();  // B^T [kN = 256][32]
  check_stage<32, 128, 128>();  // B [32][128], A^T [32][128]
  check_stage<32, 256, 256>();  // B [32][256]
  check_stage<32, 128, 256>();  // A^T [32][128] in the wide block
}

}  // namespace
}  // namespace titan::ops::moe_mma
