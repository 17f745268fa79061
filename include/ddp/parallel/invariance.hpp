// What a world-size-invariant composition (ExactSum: deterministic mode) needs of the model and of every step,
// checked collectively so that a misuse is the same clear error on every rank instead of results that silently
// depend on the world size:
//  - the dropout generators: rank 0's state is broadcast at construction (a layer seeded with the rank, as plain
//    data parallelism often is, is made the same everywhere), and every step checks they are still equal;
//  - every step: each rank's share of the global batch has the same rows, a whole number of micro-batches, and
//    every rank passes the same step;
//  - the model's buffers do not change in a step's forward passes (BatchNorm's running statistics in training
//    mode would be updated by each rank from its own micro-batches).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/shape.hpp"

namespace ddp::detail {

inline std::uint64_t fnv(std::uint64_t h, std::uint64_t v) noexcept {
  for (int k = 0; k < 8; ++k) h = (h ^ ((v >> (8 * k)) & 0xff)) * 1099511628211ULL;
  return h;
}
// 62 bits, so that a value and its negation both fit in an int64 max-reduction.
inline std::int64_t fingerprint_of(GeneratorState const& s) noexcept {
  std::uint64_t h = fnv(fnv(1469598103934665603ULL, s.state), s.inc);
  return static_cast<std::int64_t>(h >> 2);
}

// Rank `root`'s generator states on every rank.
template <Communicator C>
void broadcast_generators(C& comm, std::vector<nn::NamedGenerator> const& gens, int root) {
  if (gens.empty() || comm.world_size() == 1) return;
  std::vector<std::int64_t> words;
  for (auto const& g : gens) {
    GeneratorState const s = g.generator->state();
    words.insert(words.end(), {std::bit_cast<std::int64_t>(s.state), std::bit_cast<std::int64_t>(s.inc),
                               std::bit_cast<std::int64_t>(s.spare), s.has_spare ? 1 : 0});
  }
  host_broadcast(comm, std::span<std::int64_t>(words), root, CollectiveTag{"ddp.generators"});
  for (std::size_t i = 0; i < gens.size(); ++i)
    gens[i].generator->set_state({.state = std::bit_cast<std::uint64_t>(words[4 * i]),
                                  .inc = std::bit_cast<std::uint64_t>(words[4 * i + 1]),
                                  .spare = std::bit_cast<double>(words[4 * i + 2]),
                                  .has_spare = words[4 * i + 3] != 0});
}

// One step's preconditions, checked on every rank with one all-reduce (max) of 7 words: the same rows on every
// rank, a whole number of `per_rank` micro-batches in them, the same step, the same generator states. A
// mismatch is gathered in detail (one all-gather) and raised on every rank.
template <Communicator C>
void check_invariant_step(C& comm, std::vector<nn::NamedGenerator> const& gens, Shape const& batch,
                          std::int64_t per_rank, std::uint64_t step) {
  std::int64_t const rows = batch.rank() == 0 ? 0 : batch[0];
  std::int64_t const s = static_cast<std::int64_t>(step & (~0ULL >> 2));
  std::vector<std::int64_t> gen_fp;
  std::int64_t all_fp = 0;
  for (auto const& g : gens) {
    gen_fp.push_back(fingerprint_of(g.generator->state()));
    all_fp = static_cast<std::int64_t>(
        fnv(static_cast<std::uint64_t>(all_fp), static_cast<std::uint64_t>(gen_fp.back())) >> 2);
  }
  bool const whole = rows > 0 && rows % per_rank == 0;
  std::vector<std::int64_t> w{rows, -rows, s, -s, all_fp, -all_fp, whole ? 0 : 1};
  int const n = comm.world_size();
  if (n > 1) host_all_reduce(comm, std::span<std::int64_t>(w), ReduceOp::kMax, CollectiveTag{"ddp.step_check"});
  bool const same_rows = w[0] == -w[1], same_step = w[2] == -w[3], same_gens = w[4] == -w[5];
  if (same_rows && same_step && same_gens && w[6] == 0) return;
  // Every rank takes this path (the reduced words are the same everywhere): gather who holds what.
  std::size_t const k = 2 + gen_fp.size();
  std::vector<std::int64_t> mine{rows, s};
  mine.insert(mine.end(), gen_fp.begin(), gen_fp.end());
  std::vector<std::int64_t> all(k * static_cast<std::size_t>(n));
  if (n > 1)
    host_all_gather(comm, std::span<std::int64_t const>(mine), std::span<std::int64_t>(all),
                    CollectiveTag{"ddp.step_check.detail"});
  else
    all = mine;
  auto at = [&](int r, std::size_t i) { return all[static_cast<std::size_t>(r) * k + i]; };
  auto per_rank_list = [&](std::size_t i, char const* what) {
    std::string out;
    for (int r = 0; r < n; ++r) out += cat(r ? ", " : "", "rank ", r, " ", what, " ", at(r, i));
    return out;
  };
  if (!same_rows)
    throw ShapeError(cat("DistributedDataParallel (deterministic mode): the ranks' batches differ in rows (",
                         per_rank_list(0, "has"),
                         "); every rank must hold an equal share of the global batch, or the micro-batches of a "
                         "step depend on the world size. Use GlobalBatchSampler (equal shares, whole global batches "
                         "only)."));
  if (w[6] != 0)
    throw ShapeError(cat("DistributedDataParallel: rank ", comm.rank(), "'s batch has ", rows, " rows (shape ", batch,
                         "), which is not ", per_rank, " equal micro-batches (the micro-batch count / world size ", n,
                         "); give each rank a multiple of ", per_rank, " rows"));
  if (!same_step)
    throw DdpError(cat("DistributedDataParallel (deterministic mode): the ranks passed different steps (",
                       per_rank_list(1, "step"),
                       "); dropout masks are keyed by the step, so every rank must pass the same global step to "
                       "micro_batches(x, y, {.step = ...})."));
  std::string which;
  for (std::size_t g = 0; g < gen_fp.size(); ++g)
    for (int r = 1; r < n; ++r)
      if (at(r, 2 + g) != at(0, 2 + g)) {
        which = cat("'", gens[g].name, "' differs between rank 0 and rank ", r);
        break;
      }
  throw DdpError(
      cat("DistributedDataParallel (deterministic mode): the model's random generators differ across "
          "ranks (",
          which.empty() ? std::string("their number differs") : which,
          "). Dropout masks are keyed by each sample's place in the global batch and the layer's "
          "generator, so every rank's layers must be seeded alike: do not add the rank to a dropout "
          "seed (DistributedDataParallel makes them equal at construction; reseeding them later must "
          "do the same on every rank)."));
}

// The model's buffers, as one fingerprint (host copies for device buffers), and their names.
template <nn::Model M>
std::uint64_t buffers_fingerprint(M const& model) {
  using T = typename M::value_type;
  std::uint64_t h = 1469598103934665603ULL;
  std::vector<T> host;
  for (auto const& b : model.named_buffers()) {
    host.resize(static_cast<std::size_t>(b.tensor.numel()));
    Kernels<typename M::space>::to_host(b.tensor.numel(), b.tensor.data(), host.data());
    for (T v : host) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &v, sizeof(T));
      h = fnv(h, bits);
    }
  }
  return h;
}

// After a step's forward passes: whether the buffers changed on any rank (one all-reduce of a word); if so, the
// same error on every rank.
template <Communicator C, nn::Model M>
void check_buffers_unchanged(C& comm, M const& model, bool changed_here) {
  std::vector<std::int64_t> w{changed_here ? 1 : 0};
  if (comm.world_size() > 1)
    host_all_reduce(comm, std::span<std::int64_t>(w), ReduceOp::kMax, CollectiveTag{"ddp.buffer_check"});
  if (w[0] == 0) return;
  std::string names;
  for (auto const& b : model.named_buffers()) names += cat(names.empty() ? "'" : ", '", b.name, "'");
  throw DdpError(cat("DistributedDataParallel (deterministic mode): the model's buffers (", names,
                     ") changed during the step's forward passes (BatchNorm in training mode updates its running "
                     "statistics), on some rank. Each rank would update them from its own micro-batches, so they "
                     "would depend on the world size. Put those layers in evaluation mode (set_mode(Mode::kEval)), "
                     "or train them without deterministic mode."));
}

}  // namespace ddp::detail
