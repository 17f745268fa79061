// The small products of one causal attention head, in register tiles on Eigen's packets (AVX-512, AVX, SSE, NEON):
// scores S = A·Bᵀ over the causal part only, and the two products with a lower-triangular (T, T) matrix L — L·B and
// Lᵀ·B — that read L only where it can be non-zero. The host's fused attention (attention_fwd/bwd in
// host_transformer_kernels.hpp) runs on them where the head fits (fits()); elsewhere it calls the BLAS per head.
// Why not the BLAS: a head is a 64 × 64 × 32 product, where a library call's dispatch, packing and
// beta handling cost as much as the arithmetic (measured in bench/RESULTS.md, "Attention's products in register
// tiles"), and where the causal mask can only be skipped in coarse blocks. Here a tile of R rows keeps its
// products in registers, and a tile's columns stop at the last key its last row can see.
// Every sum runs in a fixed order (index ascending): same inputs, bitwise the same outputs.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

namespace ddp::detail {

template <class T>
struct AttentionTiles {
  using i64 = std::int64_t;
  using P = typename Eigen::internal::packet_traits<T>::type;
  static constexpr i64 W = Eigen::internal::unpacket_traits<P>::size;
#ifdef EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS
  static constexpr int kRegisters = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS;
#else
  static constexpr int kRegisters = 16;
#endif
  // Accumulators per tile: half the vector registers (16 of AVX-512's 32, 8 of AVX's 16), the rest for operands.
  // A tile is R rows by N packets with R·N = kAcc: N up to kMaxN, R = kAcc / N (at least 4) rows.
  static constexpr int kAcc = kRegisters / 2;
  static constexpr int kMaxN = kAcc / 4;
  static constexpr i64 kRowBlock = kAcc;  // scores: rows per block, whose columns end at its last row's diagonal

  // Whether a head of Tn queries and D dimensions runs here: whole packets along keys and along D, and rows in
  // whole tiles of 4 (the smallest tile).
  static constexpr bool fits(i64 Tn, i64 D) { return Tn > 0 && D > 0 && Tn % W == 0 && Tn % 4 == 0 && D % W == 0; }

  // Bt (D, Tn) = Bᵀ of B's Tn rows of D entries, rows ldb apart: W × W blocks, each transposed in registers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // PacketBlock<__m256, 8>: the vector type's alignment attribute
  static void pack_t(i64 Tn, i64 D, T const* B, i64 ldb, T* Bt) {
    using namespace Eigen::internal;
    for (i64 j = 0; j < Tn; j += W)
      for (i64 d = 0; d < D; d += W) {
        PacketBlock<P, W> blk;
        for (i64 r = 0; r < W; ++r) blk.packet[r] = ploadu<P>(B + (j + r) * ldb + d);
        if constexpr (W > 1) ptranspose(blk);
        for (i64 r = 0; r < W; ++r) pstoreu(Bt + (d + r) * Tn + j, blk.packet[r]);
      }
  }
#pragma GCC diagnostic pop

  // S[i, j] = Σ_d A[i, d]·Bt[d, j] over blocks of kRowBlock rows i0.., for keys j < round_up(i0 + kRowBlock, W):
  // every key the block's rows can see, and some past each row's diagonal (which the softmax then masks). S is
  // (Tn, Tn); the rest of it is not written.
  static void scores(i64 Tn, i64 D, T const* A, i64 lda, T const* Bt, T* S) {
    for (i64 i0 = 0; i0 < Tn; i0 += kRowBlock) {
      i64 const rows = std::min(kRowBlock, Tn - i0), cols = std::min(Tn, (i0 + rows + W - 1) / W * W);
      for (i64 c0 = 0; c0 < cols; c0 += kMaxN * W)
        with_width((cols - c0) / W, [&]<int N>() {
          for_tiles<N>(i0, i0 + rows,
                       [&]<int R>(i64 r0) { scores_tile<R, N>(D, Tn, A + r0 * lda, lda, Bt + c0, S + r0 * Tn + c0); });
        });
    }
  }

  // O[i, :D] = beta·O[i, :D] + Σ_j L[i, j]·B[j, :D], L (Tn, Tn) lower-triangular (its entries past the diagonal
  // exactly 0: a tile sums up to its last row's diagonal, and no further), B's and O's rows ldb and ldo apart.
  static void lower_times(i64 Tn, i64 D, T const* L, T const* B, i64 ldb, T beta, T* O, i64 ldo) {
    for (i64 d0 = 0; d0 < D; d0 += kMaxN * W)
      with_width((D - d0) / W, [&]<int N>() {
        for_tiles<N>(0, Tn, [&]<int R>(i64 i0) {
          rows_tile<R, N>(0, i0 + R, L + i0 * Tn, Tn, 1, B + d0, ldb, beta, O + i0 * ldo + d0, ldo);
        });
      });
  }

  // O[j, :D] = beta·O[j, :D] + Σ_i L[i, j]·B[i, :D] (Lᵀ·B), L as above: a tile of rows j0.. sums from i = j0 on.
  static void lower_t_times(i64 Tn, i64 D, T const* L, T const* B, i64 ldb, T beta, T* O, i64 ldo) {
    for (i64 d0 = 0; d0 < D; d0 += kMaxN * W)
      with_width((D - d0) / W, [&]<int N>() {
        for_tiles<N>(0, Tn, [&]<int R>(i64 j0) {
          rows_tile<R, N>(j0, Tn, L + j0, 1, Tn, B + d0, ldb, beta, O + j0 * ldo + d0, ldo);
        });
      });
  }

 private:
  // f.template operator()<N>() for N = min(n, kMaxN) packets.
  template <class F>
  static void with_width(i64 n, F&& f) {
    [&]<int... N>(std::integer_sequence<int, N...>) {
      ((n == N + 1 || (N + 1 == kMaxN && n > kMaxN) ? (f.template operator()<N + 1>(), 0) : 0), ...);
    }
    (std::make_integer_sequence<int, kMaxN>{});
  }
  // Rows r0 .. r1 (r1 - r0 a multiple of 4) in tiles of R rows, R the largest power of 2 with R·N <= kAcc (at
  // least 4), the rest in tiles of 4: f<R>(first row).
  template <int N, class F>
  static void for_tiles(i64 r0, i64 r1, F&& f) {
    constexpr int R = std::max(4, int(std::bit_floor(unsigned(kAcc / N))));
    for (; r0 + R <= r1; r0 += R) f.template operator()<R>(r0);
    if constexpr (R > 4)
      for (; r0 < r1; r0 += 4) f.template operator()<4>(r0);
  }

  // R rows of S (ld apart) = R rows of A · Bt's N packets of columns (Bt's rows ld apart).
  template <int R, int N>
  static void scores_tile(i64 D, i64 ld, T const* A, i64 lda, T const* Bt, T* S) {
    using namespace Eigen::internal;
    P acc[R][N];
    for (auto& row : acc)
      for (auto& a : row) a = pset1<P>(T(0));
    for (i64 d = 0; d < D; ++d) {
      P b[N];
      for (int c = 0; c < N; ++c) {
        b[c] = ploadu<P>(Bt + d * ld + c * W);
        EIGEN_OPTIMIZATION_BARRIER(b[c]);  // one load per packet, not one per use
      }
      for (int r = 0; r < R; ++r) {
        P const a = pset1<P>(A[r * lda + d]);
        for (int c = 0; c < N; ++c) acc[r][c] = pmadd(a, b[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < N; ++c) pstoreu(S + r * ld + c * W, acc[r][c]);
  }

  // R output rows, N packets wide: O[r, :] = beta·O[r, :] + Σ_{k = k0}^{k1 - 1} L(r, k)·B[k, :], where L(r, k) is
  // L[r·rs + k·ks] (rs, ks: L's row and key strides, which give L·B or Lᵀ·B).
  template <int R, int N>
  static void rows_tile(i64 k0, i64 k1, T const* L, i64 rs, i64 ks, T const* B, i64 ldb, T beta, T* O, i64 ldo) {
    using namespace Eigen::internal;
    P acc[R][N];
    for (auto& row : acc)
      for (auto& a : row) a = pset1<P>(T(0));
    for (i64 k = k0; k < k1; ++k) {
      P b[N];
      for (int c = 0; c < N; ++c) {
        b[c] = ploadu<P>(B + k * ldb + c * W);
        EIGEN_OPTIMIZATION_BARRIER(b[c]);
      }
      for (int r = 0; r < R; ++r) {
        P const a = pset1<P>(L[r * rs + k * ks]);
        for (int c = 0; c < N; ++c) acc[r][c] = pmadd(a, b[c], acc[r][c]);
      }
    }
    P const pb = pset1<P>(beta);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < N; ++c) {
        T* o = O + r * ldo + c * W;
        pstoreu(o, beta == T(0) ? acc[r][c] : pmadd(pb, ploadu<P>(o), acc[r][c]));
      }
  }
};

}  // namespace ddp::detail
