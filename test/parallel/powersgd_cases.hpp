// DDP with PowerSGD buckets (the PowerSgd policy, bucket/powersgd.hpp), written once over any Communicator: run
// inside doctest on the threads backend and under mpirun (ddp_mpi_main.cpp). Each throws std::runtime_error on
// failure.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "test/parallel/compressed_cases.hpp"

namespace ddp::test {

// Every rank's own gradient of each parameter (registration order) for rows [at, at + count) of `data`, from a
// plain copy of the model, gathered over the communicator: all[q][k] is rank q's k-th gradient element.
template <AsyncCommunicator C>
std::vector<std::vector<double>> gathered_local_grads(C& comm, Mlp& plain, nn::ParameterArena<float>& plain_params,
                                                      Tensor<float> const& x, Tensor<float> const& y) {
  plain_params.zero_grad();
  backward(mse_loss(plain(Var(x)), y));
  std::vector<float> mine;
  for (auto const& e : plain_params.entries())
    mine.insert(mine.end(), plain_params.grads().data() + e.offset, plain_params.grads().data() + e.offset + e.numel);
  int const n = comm.world_size();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
  if (n > 1)
    comm.all_gather(std::span<float const>(mine), std::span<float>(all));
  else
    all = mine;
  std::vector<std::vector<double>> out(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q)
    out[static_cast<std::size_t>(q)].assign(all.begin() + static_cast<std::ptrdiff_t>(q * mine.size()),
                                            all.begin() + static_cast<std::ptrdiff_t>((q + 1) * mine.size()));
  return out;
}

// The rank PowerSGD sends a gradient of this shape at, or 0 when it travels uncompressed (the rule
// bucket/powersgd.hpp states: two or more dimensions, rows = the first, and rank-r factors at least
// min_compression_rate times smaller).
inline std::int64_t compressed_rank(Shape const& shape, std::int64_t numel, PowerSgdOptions const& o) {
  if (shape.rank() < 2 || shape[0] < 2) return 0;
  std::int64_t const rows = shape[0], cols = numel / rows, r = std::min({o.rank, rows, cols});
  return double(rows + cols) * double(r) * o.min_compression_rate < double(rows) * double(cols) ? r : 0;
}

// PowerSGD as the paper and PyTorch's hook state it, in double, written independently of the wire: for each
// compressed matrix, M_q = g_q + E_q on every rank q, P = mean_q(M_q) Q, P's columns orthonormalised in order,
// Q = mean_q(M_q)^T P, the result P Q^T, and E_q = M_q - P Q^T. Q starts from the documented draw (per bucket, a
// Generator seeded seed ^ mix64(bucket), its normals over the bucket's compressed matrices in bucket order, each
// Q^T row by row) and is kept (warm start); without warm start every compressed round draws it again the same way,
// from the generator's stream `round + 1`.
class PowerSgdReference {
 public:
  struct Matrix {
    std::size_t bucket;
    std::int64_t offset, rows, cols, r;  // offset: in the registration-order gradient vector
    std::vector<double> qt;              // r x cols
    std::vector<std::vector<double>> e;  // per rank, rows x cols
  };

  PowerSgdReference(nn::ParameterArena<float> const& params, BucketPlan const& plan, PowerSgdOptions opts, int world)
      : opts_(opts) {
    std::vector<std::int64_t> flat_offset;  // registration order, packed
    std::int64_t at = 0;
    for (auto const& e : params.entries()) flat_offset.push_back(at), at += e.numel;
    for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
      Generator g(opts.seed ^ detail::mix64(b), 0);
      for (auto const p : plan.buckets[b].params) {
        auto const& e = params.entries()[p];
        std::int64_t const r = compressed_rank(e.shape, e.numel, opts);
        if (r == 0) continue;
        std::int64_t const rows = e.shape[0], cols = e.numel / rows;
        Matrix m{b, flat_offset[p], rows, cols, r, {}, {}};
        for (std::int64_t i = 0; i < r * cols; ++i) m.qt.push_back(double(static_cast<float>(g.normal())));
        m.e.assign(static_cast<std::size_t>(world), std::vector<double>(static_cast<std::size_t>(rows * cols), 0.0));
        mats_.push_back(std::move(m));
      }
    }
  }
  std::size_t compressed() const noexcept { return mats_.size(); }

  // The averaged gradient of a round from every rank's own: `round` < warmup_steps averages plainly.
  std::vector<double> round(std::vector<std::vector<double>> const& g, std::int64_t round) {
    std::size_t const n = g.size(), len = g[0].size();
    std::vector<double> out(len, 0.0);
    for (auto const& gq : g)
      for (std::size_t k = 0; k < len; ++k) out[k] += gq[k] / double(n);
    if (round < opts_.warmup_steps) return out;
    if (!opts_.warm_start) {  // a fresh Q per bucket, its normals over the bucket's matrices in order
      std::size_t b = mats_.empty() ? 0 : mats_.front().bucket;
      Generator draw(opts_.seed ^ detail::mix64(b), static_cast<std::uint64_t>(round) + 1);
      for (auto& m : mats_) {
        if (m.bucket != b)
          b = m.bucket, draw = Generator(opts_.seed ^ detail::mix64(b), static_cast<std::uint64_t>(round) + 1);
        for (auto& v : m.qt) v = double(static_cast<float>(draw.normal()));
      }
    }
    for (auto& m : mats_) {
      std::size_t const R = static_cast<std::size_t>(m.rows), Cc = static_cast<std::size_t>(m.cols),
                        r = static_cast<std::size_t>(m.r);
      std::vector<double> mean(R * Cc, 0.0);
      std::vector<std::vector<double>> M(n, std::vector<double>(R * Cc));
      for (std::size_t q = 0; q < n; ++q)
        for (std::size_t k = 0; k < R * Cc; ++k) {
          M[q][k] = g[q][static_cast<std::size_t>(m.offset) + k] + m.e[q][k];
          mean[k] += M[q][k] / double(n);
        }
      std::vector<double> p(R * r, 0.0);  // rows x r
      for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < r; ++j)
          for (std::size_t k = 0; k < Cc; ++k) p[i * r + j] += mean[i * Cc + k] * m.qt[j * Cc + k];
      for (std::size_t j = 0; j < r; ++j) {  // Gram-Schmidt on the columns
        double norm = 0;
        for (std::size_t i = 0; i < R; ++i) norm += p[i * r + j] * p[i * r + j];
        norm = std::sqrt(norm);
        if (norm == 0) continue;
        for (std::size_t i = 0; i < R; ++i) p[i * r + j] /= norm;
        for (std::size_t l = j + 1; l < r; ++l) {
          double dot = 0;
          for (std::size_t i = 0; i < R; ++i) dot += p[i * r + j] * p[i * r + l];
          for (std::size_t i = 0; i < R; ++i) p[i * r + l] -= dot * p[i * r + j];
        }
      }
      std::fill(m.qt.begin(), m.qt.end(), 0.0);  // Q^T = P^T mean
      for (std::size_t j = 0; j < r; ++j)
        for (std::size_t k = 0; k < Cc; ++k)
          for (std::size_t i = 0; i < R; ++i) m.qt[j * Cc + k] += p[i * r + j] * mean[i * Cc + k];
      for (std::size_t i = 0; i < R; ++i)
        for (std::size_t k = 0; k < Cc; ++k) {
          double a = 0;
          for (std::size_t j = 0; j < r; ++j) a += p[i * r + j] * m.qt[j * Cc + k];
          out[static_cast<std::size_t>(m.offset) + i * Cc + k] = a;
          if (opts_.error_feedback)
            for (std::size_t q = 0; q < n; ++q) m.e[q][i * Cc + k] = M[q][i * Cc + k] - a;
        }
    }
    return out;
  }

 private:
  PowerSgdOptions opts_;
  std::vector<Matrix> mats_;
};

// `steps` rounds of the MLP 8-32-4 (no optimizer: the weights stay, the rows change) with PowerSgd{opts}: each
// round every rank's gradients equal the reference's within `tol` relative to the largest, and the same bits on
// every rank. The collectives: warm-up rounds one plain "bucket" all-reduce per bucket (gradients and status
// words); after them, a "bucket" piece of the uncompressed gradients, P and the status words, then "powersgd-q" with Q,
// exactly where the bucket has a compressed matrix. describe() states the bytes of a compressed round, and the
// timeline's span of each bucket the bytes it sent that round.
template <AsyncCommunicator C>
void powersgd_matches_reference(C& inner, PowerSgdOptions opts, BucketConfig buckets, int steps, double tol) {
  Recording<C> comm(inner);
  int const n = comm.world_size(), rank = comm.rank();
  auto data = make_data(4 * n * steps, 8, 4, 17);
  auto model = make_mlp(8, 32, 4, 1);
  auto plain = make_mlp(8, 32, 4, 1);
  nn::ParameterArena<float> plain_params(plain);
  Timeline timeline;
  DistributedDataParallel<decltype(model), Recording<C>, SizeCapped, PowerSgd> ddp(
      model, comm, {.timeline = &timeline}, {.bucketer = SizeCapped{buckets}, .reduction = {opts}});
  PowerSgdReference ref(ddp.parameters(), ddp.plan(), opts, n);
  expect(n == 1 || ref.compressed() > 0, "the reference compresses nothing: the test would check nothing");
  for (int s = 0; s < steps; ++s) {
    Tensor<float> const x = rows(data.x, (s * n + rank) * 4, 4), y = rows(data.y, (s * n + rank) * 4, 4);
    comm.clear();
    std::size_t const spans_before = timeline.spans().size();
    ddp.parameters().zero_grad();
    backward(mse_loss(ddp(Var(x)), y));
    auto const all = gathered_local_grads(inner, plain, plain_params, x, y);
    std::vector<double> const want = n == 1 ? all[0] : ref.round(all, s);
    std::vector<float> got;
    for (auto const& e : ddp.parameters().entries())
      got.insert(got.end(), ddp.parameters().grads().data() + e.offset,
                 ddp.parameters().grads().data() + e.offset + e.numel);
    std::size_t k = 0;
    for (auto const& e : ddp.parameters().entries()) {
      double big = 0;
      for (std::int64_t i = 0; i < e.numel; ++i) big = std::max(big, std::abs(want[k + static_cast<std::size_t>(i)]));
      for (std::int64_t i = 0; i < e.numel; ++i, ++k)
        if (std::abs(double(got[k]) - want[k]) > tol * std::max(big, 1e-3))
          throw std::runtime_error(detail::cat("rank ", rank, " of ", n, ", round ", s, ": PowerSGD gradient of '",
                                               e.name, "'[", i, "] is ", got[k], ", the reference's ", want[k]));
    }
    std::vector<float> every(got.size() * static_cast<std::size_t>(n));
    if (n > 1) inner.all_gather(std::span<float const>(got), std::span<float>(every));
    for (int q = 1; q < n; ++q)
      expect(std::equal(got.begin(), got.end(), every.begin() + static_cast<std::ptrdiff_t>(q * got.size())),
             detail::cat("round ", s, ": rank ", q, "'s gradients differ from rank 0's"));
    // The collectives of this round.
    std::map<std::pair<std::string, std::int64_t>, std::size_t> counts;
    for (auto const& rec : comm.records())
      if (rec.op == CollectiveKind::kAllReduce) counts[{std::string(rec.tag.label), rec.tag.id}] += rec.count;
    std::size_t expected = 0;
    for (std::size_t b = 0; n > 1 && b < ddp.plan().buckets.size(); ++b) {
      auto const& bucket = ddp.plan().buckets[b];
      std::int64_t const status = 2 * static_cast<std::int64_t>(bucket.params.size()) + n;
      std::int64_t first = status, q = 0;
      for (auto const p : bucket.params) {
        auto const& e = ddp.parameters().entries()[p];
        std::int64_t const r = compressed_rank(e.shape, e.numel, opts);
        if (r > 0 && s >= opts.warmup_steps)
          first += r * e.shape[0], q += r * (e.numel / e.shape[0]);
        else
          first += e.numel;
      }
      std::int64_t const id = static_cast<std::int64_t>(b);
      expect(counts[{"bucket", id}] == static_cast<std::size_t>(first),
             detail::cat("round ", s, ": bucket ", b, " sent ", counts[{"bucket", id}], " elements, not ", first));
      expect(counts[{"powersgd-q", id}] == static_cast<std::size_t>(q),
             detail::cat("round ", s, ": bucket ", b, "'s Q sent ", counts[{"powersgd-q", id}], " elements, not ", q));
      expected += (first > 0) + (q > 0);
      if (s >= opts.warmup_steps && s + 1 == steps && b + 1 == ddp.plan().buckets.size()) {
        std::int64_t bytes = 0;  // a compressed round's bytes, over every bucket
        for (auto const& [key, c] : counts) bytes += static_cast<std::int64_t>(c) * 4;
        expect(ddp.describe().find(detail::cat(", ", bytes, " bytes a step")) != std::string::npos,
               detail::cat("describe() does not state the ", bytes, " bytes of a round: ", ddp.describe()));
      }
    }
    std::size_t bucket_spans = 0;
    auto const spans = timeline.spans();
    for (std::size_t i = spans_before; i < spans.size(); ++i) {
      std::string const& name = spans[i].name;
      if (name.rfind("all_reduce bucket ", 0) != 0) continue;
      std::int64_t const id = std::stoll(name.substr(18));
      std::size_t const bytes = 4 * (counts[{"bucket", id}] + counts[{"powersgd-q", id}]);
      expect(name == detail::cat("all_reduce bucket ", id, " (", bytes, " bytes)"),
             detail::cat("round ", s, ": the timeline says '", name, "', the wire sent ", bytes, " bytes"));
      ++bucket_spans;
    }
    expect(bucket_spans == (n > 1 ? ddp.plan().buckets.size() : 0),
           detail::cat("round ", s, ": ", bucket_spans, " bucket spans on the timeline"));
    std::size_t reduces = 0;
    for (auto const& rec : comm.records()) reduces += rec.op == CollectiveKind::kAllReduce;
    expect(reduces == expected, detail::cat("round ", s, ": ", reduces, " all-reduces, not ", expected));
  }
}

}  // namespace ddp::test
