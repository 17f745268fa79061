// PowerSGD (Vogels, Karimireddy and Jaggi, 2019) as a bucket wire: BucketWire<T, LowRank, S>, which the PowerSgd
// reduction policy (parallel/policies.hpp) puts under BucketReducer. It does what PyTorch's powerSGD_hook does:
//  - the first `warmup_steps` rounds of each bucket are plain averaging all-reduces;
//  - then each gradient M of two or more dimensions, viewed as rows x cols (rows = its first dimension), whose rank-r
//    factors are at least `min_compression_rate` times smaller than it, travels as two thin matrices:
//      M += E (error feedback), P = M Q, all-reduce P, orthonormalise P's columns (Gram-Schmidt, two passes),
//      Q = M^T P, all-reduce Q, M = P Q^T, E = (the M that went in) - M;
//    Q is drawn once from a standard normal generator seeded alike on every rank and, with warm_start, the averaged
//    Q of one step starts the next;
//  - every other gradient (vectors, biases, small matrices) travels uncompressed, in one contiguous piece of the
//    bucket's first all-reduce, before the P matrices (so a bucket costs two collectives: "bucket", then
//    "powersgd-q"); the first all-reduce is packed into the buffer the reducer lends (bucket/transport.hpp).
// What it differs in from PyTorch: the error is kept for the compressed gradients only (PyTorch also stores
// local - average for the uncompressed ones, which adds nothing to the next average). A rank that joined
// (Participation::kShadow) is a rank whose gradient is zero: it adds its error and keeps the new one like the
// others, so the errors of all ranks still sum to what the approximation missed (at full rank nothing, and a
// joined run equals plain averaging). On one rank nothing is exchanged, so nothing is compressed (the transport
// launches nothing there), as for the 16-bit wires.
// Not world-size-invariant, not bitwise reproducible across world sizes (the sums of P and Q are not), so
// deterministic mode cannot use it. Its state (each bucket's round count, whether Q was drawn, Q and E) is part of
// a checkpoint (state(), load_state()): a run resumed at the same world size continues bitwise; at another world
// size it keeps the round counts and Q (the same on every rank) and starts with E = 0 (E is per rank).
// All arithmetic goes through Kernels<S> (GEMM, norm, axpby), so it runs on host and device tensors alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/bucket/wire.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

// PowerSGD's options: PyTorch's PowerSGDState, with its defaults.
struct PowerSgdOptions {
  std::int64_t rank = 1;              // matrix_approximation_rank: r
  std::int64_t warmup_steps = 1000;   // start_powerSGD_iter: plain all-reduces per bucket before compressing
  double min_compression_rate = 2.0;  // a matrix is compressed only when (rows + cols) r * this < rows cols
  bool error_feedback = true;         // use_error_feedback
  bool warm_start = true;             // warm_start: reuse the last averaged Q instead of drawing a new one
  std::uint64_t seed = 0;             // Q's draws (the same on every rank)
};

// The wire format tag of PowerSGD (BucketReducer<T, S, C, LowRank>); the PowerSgd policy's name for logs.
struct LowRank {
  static std::string policy_name(PowerSgdOptions const& o) {
    return detail::cat("PowerSgd{rank=", o.rank, ", warmup=", o.warmup_steps,
                       o.error_feedback ? "" : ", no error feedback", o.warm_start ? "" : ", no warm start", "}");
  }
};

template <class T, MemorySpace S>
class BucketWire<T, LowRank, S> {
  using K = Kernels<S>;
  using i64 = std::int64_t;

 public:
  using value_type = T;
  using config = PowerSgdOptions;
  static constexpr bool single_collective = false;  // P, then Q

  BucketWire(std::vector<WireBucket> layout, int /*world*/, config cfg) : cfg_(cfg) {
    if (cfg_.rank < 1) throw ArgumentError(detail::cat("PowerSgdOptions: rank must be at least 1, got ", cfg_.rank));
    if (cfg_.warmup_steps < 0)
      throw ArgumentError(detail::cat("PowerSgdOptions: warmup_steps must be >= 0, got ", cfg_.warmup_steps));
    if (!(cfg_.min_compression_rate > 0))
      throw ArgumentError(
          detail::cat("PowerSgdOptions: min_compression_rate must be positive, got ", cfg_.min_compression_rate));
    i64 total = 0, widest_rank = 1;
    for (auto& wb : layout) {
      Bucket k;
      k.grads = wb.grads;
      for (auto const& t : wb.tensors) {
        i64 const r = std::min({cfg_.rank, t.rows, t.cols});
        if (t.rows >= 2 && t.cols >= 1 &&
            double(t.rows + t.cols) * double(r) * cfg_.min_compression_rate < double(t.rows) * double(t.cols)) {
          k.mats.push_back({.offset = t.offset,
                            .rows = t.rows,
                            .cols = t.cols,
                            .r = r,
                            .p_at = 0,
                            .q_at = k.q_numel,
                            .err_at = k.err_numel});
          k.q_numel += r * t.cols;
          k.err_numel += t.rows * t.cols;
          widest_rank = std::max(widest_rank, r);
        } else {
          k.plain.push_back(t);
          k.plain_numel += t.rows * t.cols;
        }
      }
      i64 p = k.plain_numel;  // the P matrices follow the uncompressed gradients
      for (auto& m : k.mats) m.p_at = p, p += m.r * m.rows;
      k.first_numel = p;
      k.q_at = total, total += k.q_numel;
      k.err_at = total, total += k.err_numel;
      buckets_.push_back(std::move(k));
    }
    scratch_at_ = total, total += widest_rank;
    owner_ = SpaceAllocator<S>::template allocate<T>(static_cast<std::size_t>(total));
    K::fill(total, T(0), owner_.get());
  }

  // The first piece of bucket b: its uncompressed gradients, then its P matrices.
  std::int64_t buffer_numel(std::size_t b) const noexcept { return buckets_[b].first_numel; }

  WirePiece<T, S> pack(std::size_t b, T* slice, Participation /*part*/, SpaceSpan<T, S> buffer) {
    Bucket& k = buckets_[b];
    if (k.rounds++ < cfg_.warmup_steps) {  // warm-up: the gradients themselves, averaged in place
      k.stage = Stage::kPlain;
      return {SpaceSpan<T, S>(slice, static_cast<std::size_t>(k.grads)), ReduceOp::kAvg, "bucket"};
    }
    T* const w = buffer.data();
    i64 pos = 0;
    for (auto const& t : k.plain) K::copy(t.rows * t.cols, slice + t.offset, w + pos), pos += t.rows * t.cols;
    if (!k.mats.empty() && (!k.q_drawn || !cfg_.warm_start)) draw_q(b, k);
    for (auto const& m : k.mats) {
      T* const M = slice + m.offset;
      if (feedback(k)) K::axpby(m.rows * m.cols, T(1), at(k.err_at + m.err_at), T(1), M);
      // P (stored transposed, r x rows) = Q^T M^T
      K::gemm(Trans::kNo, Trans::kYes, m.r, m.rows, m.cols, T(1), at(k.q_at + m.q_at), M, T(0), w + m.p_at);
    }
    k.stage = Stage::kP;
    return {buffer.first(static_cast<std::size_t>(k.first_numel)), ReduceOp::kAvg, "bucket"};
  }

  std::optional<WirePiece<T, S>> unpack(std::size_t b, T* slice, SpaceSpan<T, S> buffer) {
    Bucket& k = buckets_[b];
    Stage const stage = k.stage;
    k.stage = Stage::kDone;
    T* const w = buffer.data();
    if (stage == Stage::kP) {
      i64 pos = 0;
      for (auto const& t : k.plain) K::copy(t.rows * t.cols, w + pos, slice + t.offset), pos += t.rows * t.cols;
      if (k.mats.empty()) return std::nullopt;
      Generator fresh(cfg_.seed ^ detail::mix64(b), static_cast<std::uint64_t>(k.rounds) + 1);
      for (auto const& m : k.mats) {
        orthogonalize(w + m.p_at, m.r, m.rows, fresh);
        // Q (stored transposed, r x cols) = P^T M
        K::gemm(Trans::kNo, Trans::kNo, m.r, m.cols, m.rows, T(1), w + m.p_at, slice + m.offset, T(0),
                at(k.q_at + m.q_at));
      }
      k.stage = Stage::kQ;
      return WirePiece<T, S>{SpaceSpan<T, S>(at(k.q_at), static_cast<std::size_t>(k.q_numel)), ReduceOp::kAvg,
                             "powersgd-q"};
    }
    if (stage == Stage::kQ) {
      if (!detail::all_finite<T, S>(k.q_numel, at(k.q_at))) {
        // A NaN or Inf reached Q (some rank's gradients held one; NonFinite reports it): it would stay there under
        // warm start, and in E. Start over: a new Q next round, no error carried.
        k.q_drawn = false;
        K::fill(k.err_numel, T(0), at(k.err_at));
      }
      for (auto const& m : k.mats) {
        T* const M = slice + m.offset;
        T* const e = at(k.err_at + m.err_at);
        i64 const n = m.rows * m.cols;
        if (feedback(k)) K::copy(n, M, e);
        K::gemm(Trans::kYes, Trans::kNo, m.rows, m.cols, m.r, T(1), w + m.p_at, at(k.q_at + m.q_at), T(0), M);
        if (feedback(k)) K::axpby(n, T(-1), M, T(1), e);  // what this rank's gradient lost
      }
    }
    return std::nullopt;
  }

  // Bytes one rank sends of the gradients per round once compressing: the first piece of every bucket, and Q where
  // it has one.
  std::int64_t bytes() const noexcept {
    i64 n = 0;
    for (auto const& k : buckets_) n += k.first_numel + k.q_numel;
    return n * static_cast<i64>(sizeof(T));
  }
  // What carries over between rounds: per bucket its round count and whether Q was drawn (counters), then its Q and
  // E (values; Q is the same on every rank, E is this rank's). The layout is each bucket's Q and E sizes.
  WireState<T> state() const {
    WireState<T> st{.kind = "powersgd"};
    for (auto const& k : buckets_) {
      st.layout.insert(st.layout.end(), {k.q_numel, k.err_numel});
      st.counters.insert(st.counters.end(), {k.rounds, k.q_drawn ? 1 : 0});
    }
    for (auto const& k : buckets_) {
      std::size_t const at = st.values.size();
      st.values.resize(at + static_cast<std::size_t>(k.q_numel + k.err_numel));
      K::to_host(k.q_numel, this->at(k.q_at), st.values.data() + at);
      K::to_host(k.err_numel, this->at(k.err_at), st.values.data() + at + k.q_numel);
    }
    return st;
  }
  // Loads what state() returned (ArgumentError, naming the difference, when it was another wire or another bucket
  // layout). From another rank (another world size), E starts at zero.
  void load_state(WireState<T> const& st, WireStateFrom from) {
    WireState<T> const mine = state();
    if (st.kind != mine.kind || st.layout != mine.layout || st.counters.size() != mine.counters.size() ||
        st.values.size() != mine.values.size())
      throw ArgumentError(
          detail::cat("PowerSGD: the saved state (", st.kind.empty() ? "no wire" : st.kind, ", ", st.layout.size() / 2,
                      " buckets, ", st.values.size(), " values) does not fit this run's (", buckets_.size(),
                      " buckets, ", mine.values.size(),
                      " values of Q and E): resume with the same bucket cap, parameters and PowerSgdOptions::rank"));
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (st.counters[2 * b] < 0 || st.counters[2 * b + 1] < 0 || st.counters[2 * b + 1] > 1)
        throw ArgumentError(detail::cat("PowerSGD: the saved state of bucket ", b, " has round count ",
                                        st.counters[2 * b], " and Q-drawn flag ", st.counters[2 * b + 1]));
    std::size_t at = 0;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& k = buckets_[b];
      k.rounds = st.counters[2 * b];
      k.q_drawn = st.counters[2 * b + 1] == 1;
      k.stage = Stage::kDone;
      K::from_host(k.q_numel, st.values.data() + at, this->at(k.q_at));
      if (from == WireStateFrom::kThisRank)
        K::from_host(k.err_numel, st.values.data() + at + k.q_numel, this->at(k.err_at));
      else
        K::fill(k.err_numel, T(0), this->at(k.err_at));
      at += static_cast<std::size_t>(k.q_numel + k.err_numel);
    }
  }

  // Gradient elements that travel as rank-r factors (the rest go uncompressed).
  std::int64_t compressed_numel() const noexcept {
    i64 n = 0;
    for (auto const& k : buckets_) n += k.err_numel;
    return n;
  }

 private:
  enum class Stage { kDone, kPlain, kP, kQ };
  struct Matrix {
    i64 offset, rows, cols, r, p_at, q_at, err_at;  // p_at: in the first piece; q_at, err_at: in Q and E
  };
  struct Bucket {
    i64 grads = 0;
    std::vector<WireTensor> plain;
    std::vector<Matrix> mats;
    i64 plain_numel = 0, q_numel = 0, err_numel = 0, first_numel = 0;
    i64 q_at = 0, err_at = 0;  // in owner_
    i64 rounds = 0;
    Stage stage = Stage::kDone;
    bool q_drawn = false;
  };

  T* at(i64 offset) const noexcept { return owner_.get() + offset; }
  bool feedback(Bucket const& k) const noexcept { return cfg_.error_feedback && k.q_drawn; }

  // Q from a standard normal generator, the same on every rank: seeded by the bucket, and by the round unless
  // warm_start keeps the first draw going.
  void draw_q(std::size_t b, Bucket& k) {
    Generator g(cfg_.seed ^ detail::mix64(b), cfg_.warm_start ? 0 : static_cast<std::uint64_t>(k.rounds));
    std::vector<T> q(static_cast<std::size_t>(k.q_numel));
    for (auto& v : q) v = static_cast<T>(g.normal());
    K::from_host(k.q_numel, q.data(), at(k.q_at));
    k.q_drawn = true;
  }

  // Gram-Schmidt on the r rows of P (r x rows, one column of P per row), each row projected off the ones before it
  // twice ("twice is enough": one pass loses orthogonality when P is nearly rank-deficient, which it is whenever
  // the averaged gradient has rank below r, e.g. a layer's gradient over fewer samples than r), then normalised.
  // A row left with under sqrt(epsilon) of its norm (zero, or dependent on the rows before) is replaced by a
  // random direction from `fresh` (the same draws on every rank: P is the same bits everywhere), projected and
  // normalised the same way. Zeroing it instead, as PyTorch's epsilon = 0 does, would zero that row of Q too, and
  // under warm start P's rank would never come back.
  void orthogonalize(T* p, i64 r, i64 rows, Generator& fresh) {
    T* const c = at(scratch_at_);
    T const dependent = std::sqrt(std::numeric_limits<T>::epsilon());
    std::vector<T> draw;
    for (i64 i = 0; i < r; ++i) {
      T* const x = p + i * rows;
      T norm{};
      for (int attempt = 0;; ++attempt) {
        T const before = K::norm(rows, x, T(2));
        for (int pass = 0; pass < 2 && i > 0; ++pass) {
          K::gemm(Trans::kNo, Trans::kNo, i, 1, rows, T(1), p, x, T(0), c);    // c = P[0:i] x
          K::gemm(Trans::kYes, Trans::kNo, rows, 1, i, T(-1), p, c, T(1), x);  // x -= P[0:i]^T c
        }
        norm = K::norm(rows, x, T(2));
        // Independent (NaN propagates, for NonFinite to report); a random row is independent unless i >= rows,
        // which r <= rows rules out.
        if (norm > dependent * before || std::isnan(norm) || attempt == 1) break;
        draw.resize(static_cast<std::size_t>(rows));
        for (auto& v : draw) v = static_cast<T>(fresh.normal());
        K::from_host(rows, draw.data(), x);
      }
      K::axpby(rows, T(1) / norm, x, T(0), x);
    }
  }

  config cfg_;
  std::vector<Bucket> buckets_;
  i64 scratch_at_ = 0;
  std::shared_ptr<T[]> owner_;  // every bucket's Q and E, then a scratch of r elements
};

}  // namespace ddp
