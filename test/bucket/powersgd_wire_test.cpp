// PowerSGD's wire (include/ddp/bucket/powersgd.hpp) on its own, with the collectives replaced by the identity (every
// rank holding the same gradient, so an average changes nothing): what the DDP tests cannot reach directly.
//  - Without warm start, Q is drawn afresh each round, from the generator seeded by the bucket and the round: the
//    wire's result is the reference PowerSGD computed here in double with those draws.
//  - A column of P that comes out dependent (or zero) is replaced by a random direction, so P keeps its rank: after
//    a round whose gradient has rank 1 (Q's second row becomes zero under warm start), a rank-2 gradient is still
//    approximated with two directions, and its next round recovers it exactly. Zeroing the column, as PyTorch does,
//    would keep the approximation at rank 1 forever.
//  - state() / load_state(): a wire loaded with another's state continues bitwise; a state from another rank drops
//    the error feedback; one of another layout is refused, naming the fix.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/ddp.hpp"

namespace powersgd_wire_test {

using namespace ddp;
using Wire = BucketWire<float, LowRank, HostSpace>;

// One bucket of one rows x cols matrix, as the reducer lays it out.
inline std::vector<WireBucket> one_matrix(std::int64_t rows, std::int64_t cols) {
  return {WireBucket{.grads = rows * cols, .tensors = {WireTensor{.offset = 0, .rows = rows, .cols = cols}}}};
}

// One round of the wire over `g` (in place), every collective the identity, in a buffer lent as the reducer does.
inline void round(Wire& w, std::vector<float>& g) {
  std::vector<float> lent(static_cast<std::size_t>(w.buffer_numel(0)));
  w.pack(0, g.data(), Participation::kActive, HostSpan<float>(lent));
  while (w.unpack(0, g.data(), HostSpan<float>(lent))) {}
}

// PowerSGD in double for one matrix and one rank: P = M Q (Q given as r x cols), Gram-Schmidt on P's columns, then
// P P^T M.
inline std::vector<double> reference(std::vector<float> const& m, std::vector<double> const& qt, std::int64_t rows,
                                     std::int64_t cols, std::int64_t r) {
  auto at = [](std::int64_t i, std::int64_t j, std::int64_t ld) { return static_cast<std::size_t>(i * ld + j); };
  std::vector<double> p(static_cast<std::size_t>(rows * r), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < r; ++j)
      for (std::int64_t k = 0; k < cols; ++k) p[at(i, j, r)] += double(m[at(i, k, cols)]) * qt[at(j, k, cols)];
  for (std::int64_t j = 0; j < r; ++j) {
    for (std::int64_t l = 0; l < j; ++l) {
      double dot = 0;
      for (std::int64_t i = 0; i < rows; ++i) dot += p[at(i, l, r)] * p[at(i, j, r)];
      for (std::int64_t i = 0; i < rows; ++i) p[at(i, j, r)] -= dot * p[at(i, l, r)];
    }
    double norm = 0;
    for (std::int64_t i = 0; i < rows; ++i) norm += p[at(i, j, r)] * p[at(i, j, r)];
    for (std::int64_t i = 0; i < rows; ++i) p[at(i, j, r)] /= std::sqrt(norm);
  }
  std::vector<double> out(static_cast<std::size_t>(rows * cols), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < cols; ++k)
      for (std::int64_t j = 0; j < r; ++j)
        for (std::int64_t l = 0; l < rows; ++l)
          out[at(i, k, cols)] += p[at(i, j, r)] * p[at(l, j, r)] * double(m[at(l, k, cols)]);
  return out;
}

inline std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Generator g(seed);
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (auto& v : m) v = g.uniform(-1.0f, 1.0f);
  return m;
}

// u v^T + (second ? w z^T : 0), from fixed draws.
inline std::vector<float> low_rank(std::int64_t rows, std::int64_t cols, bool second) {
  auto const a = random_matrix(rows, 2, 5), b = random_matrix(2, cols, 6);
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < cols; ++k)
      m[static_cast<std::size_t>(i * cols + k)] =
          a[static_cast<std::size_t>(i * 2)] * b[static_cast<std::size_t>(k)] +
          (second ? a[static_cast<std::size_t>(i * 2 + 1)] * b[static_cast<std::size_t>(cols + k)] : 0.0f);
  return m;
}

inline double distance(std::vector<float> const& a, std::vector<float> const& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
  return std::sqrt(d);
}

}  // namespace powersgd_wire_test

TEST_CASE("PowerSGD wire: without warm start, each round draws Q afresh from the bucket's and the round's generator") {
  using namespace powersgd_wire_test;
  std::int64_t const rows = 12, cols = 7, r = 2;
  PowerSgdOptions const opts{
      .rank = r, .warmup_steps = 0, .min_compression_rate = 1.0, .error_feedback = false, .warm_start = false};
  Wire w(one_matrix(rows, cols), 2, opts);
  for (std::uint64_t s = 0; s < 3; ++s) {
    CAPTURE(s);
    auto const m = random_matrix(rows, cols, 100 + s);
    // Round s draws Q^T (r x cols) from Generator(seed ^ mix64(bucket), round count after this round's start).
    Generator g(opts.seed ^ detail::mix64(0), s + 1);
    std::vector<double> qt(static_cast<std::size_t>(r * cols));
    for (auto& v : qt) v = double(static_cast<float>(g.normal()));
    auto const want = reference(m, qt, rows, cols, r);
    auto got = m;
    round(w, got);
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("PowerSGD wire: a dependent column of P is replaced, so a rank lost under warm start comes back") {
  using namespace powersgd_wire_test;
  std::int64_t const rows = 12, cols = 7;
  PowerSgdOptions const opts{.rank = 2, .warmup_steps = 0, .min_compression_rate = 1.0, .error_feedback = false};
  Wire w(one_matrix(rows, cols), 2, opts);
  // Round 1: a rank-1 gradient. P's first column spans it, so the round returns it exactly; Q's second row becomes
  // P2^T M = 0 (P2 is orthogonal to M's columns).
  auto const m1 = low_rank(rows, cols, false);
  auto g1 = m1;
  round(w, g1);
  CHECK(distance(g1, m1) < 1e-5);
  // Round 2: a rank-2 gradient. P = M Q has a zero second column (Q's second row is zero): replaced by a random
  // direction orthogonal to the first, the approximation keeps two directions, closer to M than the first alone.
  auto const m2 = low_rank(rows, cols, true);
  auto g2 = m2;
  round(w, g2);
  std::vector<double> first_only_q(static_cast<std::size_t>(2 * cols), 0.0);  // what zeroing would give: P1 P1^T M
  Wire probe(one_matrix(rows, cols), 2, opts);
  auto p1 = m1;
  round(probe, p1);
  auto const st = probe.state();  // Q after round 1 (r x cols): its first row alone
  for (std::int64_t k = 0; k < cols; ++k)
    first_only_q[static_cast<std::size_t>(k)] = double(st.values[static_cast<std::size_t>(k)]);
  auto const rank1 = reference(m2, first_only_q, rows, cols, 1);
  std::vector<float> rank1f(rank1.begin(), rank1.end());
  CAPTURE(distance(g2, m2));
  CAPTURE(distance(rank1f, m2));
  CHECK(distance(g2, m2) < 0.999 * distance(rank1f, m2));
  // Round 3: the same rank-2 gradient. Q now has two nonzero rows, P spans M's columns: M comes back exactly.
  auto g3 = m2;
  round(w, g3);
  CHECK(distance(g3, m2) < 1e-4);
}

TEST_CASE("PowerSGD wire: state() and load_state() continue a wire bitwise; another rank's state drops E") {
  using namespace powersgd_wire_test;
  std::int64_t const rows = 10, cols = 6;
  PowerSgdOptions const opts{.rank = 1, .warmup_steps = 1, .min_compression_rate = 1.0};
  Wire a(one_matrix(rows, cols), 2, opts);
  for (std::uint64_t s = 0; s < 3; ++s) {
    auto g = random_matrix(rows, cols, 200 + s);
    round(a, g);
  }
  Wire b(one_matrix(rows, cols), 2, opts), c(one_matrix(rows, cols), 2, opts);
  b.load_state(a.state(), WireStateFrom::kThisRank);
  c.load_state(a.state(), WireStateFrom::kOtherRank);
  CHECK(b.state() == a.state());
  auto const sc = c.state();
  CHECK(sc.counters == a.state().counters);
  for (std::size_t k = static_cast<std::size_t>(opts.rank * cols); k < sc.values.size(); ++k)
    CHECK(sc.values[k] == 0.0f);  // E
  auto ga = random_matrix(rows, cols, 300), gb = ga;
  round(a, ga);
  round(b, gb);
  CHECK(ga == gb);
  Wire other(one_matrix(rows + 1, cols), 2, opts);
  CHECK_THROWS_WITH_AS(other.load_state(a.state(), WireStateFrom::kThisRank),
                       doctest::Contains("resume with the same bucket cap"), ArgumentError);
}
