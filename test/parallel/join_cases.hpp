// Uneven inputs (ddp::join, the uneven-batch error) and non-finite gradients (DdpOptions::non_finite), written
// once over any Communicator: run inside doctest on the threads backend (join_test.cpp) and under mpirun
// (join_mpi_main.cpp). Each throws std::runtime_error on failure; expected errors are caught and their
// messages checked on every rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test/parallel/ddp_cases.hpp"

namespace ddp::test {

inline bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

// Batches per rank in the uneven scenarios: {4, 3} on two ranks, {4, 3, 2, 5} on four (rank 0 is then not the
// last to run out, so buffers and the final state come from rank 3).
inline int uneven_batches(int rank) { return 2 + (rank * 3 + 2) % 4; }

// The same values on every rank, bitwise? (one all-gather)
template <Communicator C>
bool same_on_every_rank(C& comm, std::vector<float> const& v) {
  std::vector<float> all(v.size() * static_cast<std::size_t>(comm.world_size()));
  host_all_gather(comm, std::span<float const>(v), std::span<float>(all));
  for (std::size_t j = 0; j < all.size(); ++j)
    if (std::memcmp(&all[j], &v[j % v.size()], sizeof(float)) != 0) return false;
  return true;
}

inline double rel_diff(std::vector<float> const& a, std::vector<float> const& b) {
  double diff = 0, maxw = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    maxw = std::max(maxw, double(std::abs(b[i])));
  }
  return diff / std::max(1.0, maxw);
}

// Rank r runs uneven_batches(r) steps of 2 samples inside ddp::join (SGD with momentum); a single process
// replays the same steps: step s sums the mean-loss gradients of the ranks that still have a batch and divides
// by the world size (divide_by_initial_world_size, PyTorch's default) or by their number. After the join every
// rank must hold the reference's weights, bitwise the same everywhere, and one more even step (which needs the
// momentum to have been synchronised too) must keep it so. R: the reduction policy (one whose result is the
// average, e.g. full-rank PowerSGD). Returns max|Δ| / max(1, max|w|).
template <class R = AverageAllReduce, AsyncCommunicator C>
double join_equivalence(C& comm, JoinOptions opts, R reduction = {}) {
  int const n = comm.world_size(), r = comm.rank();
  int most = 0;
  for (int k = 0; k < n; ++k) most = std::max(most, uneven_batches(k));
  std::int64_t const local = 2;
  auto data = make_data(static_cast<std::int64_t>(most + 1) * n * local, 8, 4, 21);
  auto at = [&](int rank, int step) { return (static_cast<std::int64_t>(step) * n + rank) * local; };

  auto model = make_mlp(8, 16, 4, 1 + static_cast<std::uint64_t>(r));  // rank 0's weights win (broadcast)
  DistributedDataParallel<decltype(model), C, SizeCapped, R> ddp(
      model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 64}}, .reduction = reduction});
  optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  auto step = [&](int s) {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(rows(data.x, at(r, s), local))), rows(data.y, at(r, s), local)));
    opt.step();
  };
  JoinResult const res = join(
      ddp, opt,
      [&] {
        for (int s = 0; s < uneven_batches(r); ++s) step(s);
      },
      opts);

  int last = 0;
  for (int k = n - 1; k >= 0; --k)
    if (uneven_batches(k) == most) last = k;
  expect(res.steps == uneven_batches(r) && res.rounds == most && res.uneven == (n > 1) &&
             (n == 1 || res.last_rank == last),
         detail::cat("join result on rank ", r, ": steps ", res.steps, ", rounds ", res.rounds, ", last rank ",
                     res.last_rank, ", uneven ", res.uneven));

  auto ref = make_mlp(8, 16, 4, 1);
  nn::ParameterArena<float> ref_params(ref);
  optim::SGD ref_opt(ref_params, {.lr = 0.05, .momentum = 0.9});
  auto ref_step = [&](int s, bool all_ranks) {
    int active = 0;
    for (int k = 0; k < n; ++k) active += all_ranks || s < uneven_batches(k) ? 1 : 0;
    float const div = opts.divide_by_initial_world_size ? float(n) : float(active);
    ref_opt.zero_grad();
    for (int k = 0; k < n; ++k)
      if (all_ranks || s < uneven_batches(k))
        backward(scale(mse_loss(ref(Var(rows(data.x, at(k, s), local))), rows(data.y, at(k, s), local)), 1.0f / div));
    ref_opt.step();
  };
  for (int s = 0; s < most; ++s) ref_step(s, false);
  auto w = weights(ddp.parameters());
  expect(same_on_every_rank(comm, w), "ranks left the join with different parameters");
  double const d1 = rel_diff(w, weights(ref_params));

  step(most);  // every rank, outside the join: the state (momentum included) must agree everywhere
  ref_step(most, true);
  w = weights(ddp.parameters());
  expect(same_on_every_rank(comm, w), "ranks diverged in the step after the join (optimizer state not synchronised?)");
  return std::max(d1, rel_diff(w, weights(ref_params)));
}

// BatchNorm's running statistics: under a join, buffers come from the lowest rank that still has data, the
// finished ranks shadow those broadcasts, and every rank leaves with the last rank's buffers.
template <AsyncCommunicator C>
void join_buffers(C& comm) {
  int const r = comm.rank();
  Generator g(7);
  nn::Sequential model(nn::named("conv", nn::Conv2d(2, 2, 1, g)), nn::named("bn", nn::BatchNorm2d(2)));
  DistributedDataParallel ddp(model, comm);
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  JoinResult const res = join(ddp, opt, [&] {
    for (int s = 0; s < uneven_batches(r); ++s) {
      Tensor<float> x(Shape{2, 2, 2, 2});
      for (std::int64_t j = 0; j < x.numel(); ++j) x[j] = float((j * 7 + s * 3 + r * 5) % 11) - 5.0f;
      opt.zero_grad();
      backward(sum(ddp(Var(x))));
      opt.step();
    }
  });
  expect(
      res.rounds ==
          [&] {
            int m = 0;
            for (int k = 0; k < comm.world_size(); ++k) m = std::max(m, uneven_batches(k));
            return m;
          }(),
      "join rounds");
  std::vector<float> b;
  for (auto const& nb : model.named_buffers())
    b.insert(b.end(), nb.tensor.data(), nb.tensor.data() + nb.tensor.numel());
  expect(!b.empty(), "BatchNorm has no buffers?");
  expect(same_on_every_rank(comm, b), "ranks left the join with different buffers");
  expect(same_on_every_rank(comm, weights(ddp.parameters())), "ranks left the join with different parameters");
}

// throw_on_early_termination: the first step at which a rank has run out is the same DdpError on every rank,
// naming the ranks that ran out and their step counts.
template <AsyncCommunicator C>
void join_throw_on_early_termination(C& comm) {
  int const r = comm.rank(), n = comm.world_size();
  auto model = make_mlp(8, 16, 4, 1);
  DistributedDataParallel ddp(model, comm);
  auto data = make_data(4, 8, 4, 1);
  int fewest = uneven_batches(0);
  for (int k = 0; k < n; ++k) fewest = std::min(fewest, uneven_batches(k));
  std::string out;
  for (int k = 0; k < n; ++k)
    if (uneven_batches(k) == fewest)
      out += detail::cat(out.empty() ? "" : ", ", "rank ", k, " after ", fewest, " steps");
  try {
    join(ddp,
         [&] {
           for (int s = 0; s < uneven_batches(r); ++s) {
             ddp.parameters().zero_grad();
             backward(mse_loss(ddp(Var(data.x)), data.y));
           }
         },
         {.throw_on_early_termination = true});
  } catch (DdpError const& e) {
    std::string const m = e.what();
    expect(contains(m, "uneven inputs: " + out + " ran out of data") && contains(m, "throw_on_early_termination") &&
               contains(m, detail::cat("(step ", fewest, ")")),
           "early-termination message on rank " + std::to_string(r) + ": " + m);
    return;
  }
  throw std::runtime_error("rank " + std::to_string(r) +
                           ": no DdpError for uneven inputs with throw_on_early_termination");
}

// Without a join: require_even_batches raises the same DdpError on every rank, naming every rank's count and
// the ranks that run out first, and pointing at ddp::join.
template <Communicator C>
void uneven_without_join(C& comm) {
  int const n = comm.world_size();
  std::string list;
  for (int k = 0; k < n; ++k) list += detail::cat(k ? ", " : "", "rank ", k, ": ", uneven_batches(k));
  try {
    require_even_batches(comm, uneven_batches(comm.rank()));
  } catch (DdpError const& e) {
    std::string const m = e.what();
    expect(contains(m, "(" + list + ")") && contains(m, "ddp::join") && contains(m, "would run out after"),
           "uneven-batches message on rank " + std::to_string(comm.rank()) + ": " + m);
    return;
  }
  throw std::runtime_error("rank " + std::to_string(comm.rank()) + ": uneven batch counts were not reported");
}

// The trainer, on a dataset that does not divide among the ranks: EpochSplit::kJoin visits every sample once
// and leaves every rank in the same state, epoch after epoch; with EpochSplit::kPad, datasets of different
// sizes on different ranks are the uneven-inputs error on every rank.
template <AsyncCommunicator C>
void trainer_uneven(C& comm) {
  int const n = comm.world_size(), r = comm.rank();
  auto make = [](std::int64_t size, std::uint64_t seed) {
    Generator g(seed);
    Tensor<float> x(Shape{size, 4});
    Tensor<std::int32_t> y(Shape{size});
    for (std::int64_t i = 0; i < size; ++i) {
      y[i] = static_cast<std::int32_t>(g.below(3));
      for (int j = 0; j < 4; ++j) x[i * 4 + j] = g.uniform(-0.5f, 0.5f) + (j == y[i] ? 1.5f : 0.0f);
    }
    return TensorDataset<std::int32_t>(x, y);
  };
  auto ce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
  std::int64_t const size = 12 * n + 1;  // batch 4: rank 0 has 13 samples (4 batches), the others 12 (3)
  auto data = make(size, 5);
  {
    Generator g(3);
    nn::Sequential model(nn::Linear(4, 8, g), nn::ReLU(), nn::Linear(8, 3, g));
    trainer<decltype(model), C> t(model, comm, {.lr = 0.1, .momentum = 0.9},
                                  {.batch_size = 4, .drop_last = false, .split = EpochSplit::kJoin});
    std::int64_t const mine = (size - r + n - 1) / n, batches = (mine + 3) / 4, most = ((size + n - 1) / n + 3) / 4;
    std::int64_t seen = 0;
    for (int e = 0; e < 2; ++e) {
      EpochResult const res = t.fit_epoch(data, {.epoch = e}, ce);
      expect(res.steps == batches && res.steps_in_epoch == most && res.end_step == most && res.global_step == most &&
                 res.complete(),
             detail::cat("trainer epoch ", e, " on rank ", r, ": steps ", res.steps, " (expected ", batches,
                         "), steps_in_epoch ", res.steps_in_epoch, ", end_step ", res.end_step, ", global_step ",
                         res.global_step));
      expect(res.train.total == size, detail::cat("trainer: ", res.train.total, " samples seen, not ", size));
      expect(std::isfinite(res.train.mean_loss()), "trainer: mean loss not finite");
      seen += res.train.total;
      expect(same_on_every_rank(comm, weights(t.ddp().parameters())), "trainer: ranks differ after an uneven epoch");
    }
    expect(seen == 2 * size, "trainer: samples over two epochs");
  }
  // Datasets of different sizes (rank 0 one batch more per rank): the uneven-inputs error on every rank.
  auto mine = make(r == 0 && n > 1 ? 16 * n : 12 * n, 6);
  Generator g(3);
  nn::Sequential model(nn::Linear(4, 8, g), nn::ReLU(), nn::Linear(8, 3, g));
  trainer<decltype(model), C> t(model, comm, {.lr = 0.1}, {.batch_size = 4});
  if (n == 1) return;
  try {
    t.fit_epoch(mine, {.epoch = 0}, ce);
  } catch (DdpError const& e) {
    std::string const m = e.what();
    expect(contains(m, "rank 0: 4, rank 1: 3") && contains(m, "EpochSplit::kJoin"),
           "trainer uneven message on rank " + std::to_string(r) + ": " + m);
    return;
  }
  throw std::runtime_error("rank " + std::to_string(r) + ": the trainer ran an epoch with uneven batch counts");
}

// The collectives of a join in which ranks run out at different steps, recorded on each rank: the joined
// ranks' shadow rounds must issue exactly the active ranks' sequence (op, count, root, tag), status words
// included, or a backend would pair different buffers.
template <AsyncCommunicator C>
std::vector<CollectiveRecord> join_collective_order(C& inner) {
  Recording<C> comm(inner);
  int const r = comm.rank();
  Generator g(7);
  nn::Sequential model(nn::named("conv", nn::Conv2d(2, 2, 1, g)), nn::named("bn", nn::BatchNorm2d(2)));
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 16, .first_cap_bytes = 8}}});
  optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.5});
  Tensor<float> x(Shape{2, 2, 2, 2});
  for (std::int64_t j = 0; j < x.numel(); ++j) x[j] = float(j % 5) - 2.0f;
  comm.clear();
  join(ddp, opt, [&] {
    for (int s = 0; s < uneven_batches(r); ++s) {
      opt.zero_grad();
      backward(sum(ddp(Var(x))));
      opt.step();
    }
  });
  return comm.records();
}

// A gradient hook that puts a NaN into fc2.bias's gradient on rank `bad` (before the reduction).
inline void poison_fc2_bias(Mlp& model, int rank, int bad, bool const& on) {
  auto params = model.named_parameters();
  params[3].var.set_grad_hook([rank, bad, &on](Node<float, HostSpace>& nd) {
    if (on && rank == bad) nd.grad[0] = std::nanf("");
  });
}

// NonFinite::kRaise: a NaN produced on the last rank is the same DdpError on every rank, naming the parameter
// and the rank; the next finite step trains normally.
template <AsyncCommunicator C>
void non_finite_raise(C& comm) {
  int const r = comm.rank(), bad = comm.world_size() - 1;
  auto model = make_mlp(8, 16, 4, 1);
  bool on = true;
  poison_fc2_bias(model, r, bad, on);
  DistributedDataParallel ddp(model, comm, {.non_finite = NonFinite::kRaise});
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  auto data = make_data(4, 8, 4, 3 + static_cast<std::uint64_t>(r));
  bool threw = false;
  try {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(data.x)), data.y));
  } catch (DdpError const& e) {
    std::string const m = e.what();
    threw = true;
    expect(contains(m, "non-finite gradient") && contains(m, "parameter(s) 'fc2.bias'") && !contains(m, "fc1.weight") &&
               contains(m, detail::cat("rank(s) ", bad, " had NaN")) && contains(m, "NonFinite::kSkipStep"),
           "non-finite message on rank " + std::to_string(r) + ": " + m);
  }
  expect(threw, "rank " + std::to_string(r) + ": a NaN gradient was not reported");
  for (auto const& e : ddp.parameters().entries())
    expect(!e.var.has_grad(), "a gradient survived the non-finite error: " + e.name);
  on = false;
  opt.zero_grad();
  backward(mse_loss(ddp(Var(data.x)), data.y));
  expect(ddp.parameters().all_grads_defined() && ddp.non_finite_parameters().empty(), "the next step is not normal");
}

// NonFinite::kSkipStep: every rank skips the step alike: parameters and optimizer state (momentum, step
// counts) unchanged, the skip counted; the steps around it train normally.
template <AsyncCommunicator C>
void non_finite_skip(C& comm) {
  int const r = comm.rank(), bad = comm.world_size() - 1;
  auto model = make_mlp(8, 16, 4, 1);
  bool on = false;
  poison_fc2_bias(model, r, bad, on);
  DistributedDataParallel ddp(model, comm, {.non_finite = NonFinite::kSkipStep});
  optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto data = make_data(4, 8, 4, 3 + static_cast<std::uint64_t>(r));
  auto step = [&] {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(data.x)), data.y));
    opt.step();
  };
  step();
  expect(!ddp.step_skipped() && ddp.skipped_steps() == 0, "a finite step was skipped");
  auto const w0 = weights(ddp.parameters());
  auto const s0 = opt.state();
  on = true;
  step();
  expect(ddp.step_skipped() && ddp.skipped_steps() == 1, "rank " + std::to_string(r) + " did not skip the NaN step");
  expect(ddp.non_finite_parameters() == std::vector<std::string>{"fc2.bias"},
         "non_finite_parameters() does not name fc2.bias alone");
  expect(weights(ddp.parameters()) == w0, "a skipped step moved the parameters");
  expect(opt.state() == s0, "a skipped step changed the optimizer state");
  on = false;
  step();
  expect(!ddp.step_skipped() && ddp.skipped_steps() == 1, "the step after a skip was skipped");
  expect(weights(ddp.parameters()) != w0, "the step after a skip did not train");
  expect(same_on_every_rank(comm, weights(ddp.parameters())), "ranks differ after a skipped step");
}

// The trainer counts skipped steps and leaves their losses out.
template <AsyncCommunicator C>
void trainer_skips_non_finite(C& comm) {
  int const n = comm.world_size();
  Generator dg(9);
  Tensor<float> x(Shape{16 * n, 4});
  Tensor<std::int32_t> y(Shape{16 * n});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = dg.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = static_cast<std::int32_t>(i % 3);
  TensorDataset<std::int32_t> data(x, y);
  Generator g(3);
  nn::Sequential model(nn::Linear(4, 8, g), nn::ReLU(), nn::Linear(8, 3, g));
  trainer<decltype(model), C> t(model, comm, {.lr = 0.1},
                                {.batch_size = 4, .ddp = {.non_finite = NonFinite::kSkipStep}});
  // The loss of step 1 on the last rank is NaN: its gradients are too, on every rank after the reduction.
  int step = 0;
  auto loss = [&](Var const& out, auto const& batch) {
    Var l = cross_entropy(out, batch.y);
    bool const poison = step++ == 1 && comm.rank() == n - 1;
    return poison ? scale(l, std::nanf("")) : l;
  };
  EpochResult const res = t.fit_epoch(data, {.epoch = 0}, loss);
  expect(res.skipped_steps == 1 && res.steps == 4 && res.global_step == 4,
         detail::cat("trainer: skipped ", res.skipped_steps, " of ", res.steps, " steps"));
  expect(std::isfinite(res.train.mean_loss()) && res.train.total == 12 * n,
         "trainer: a skipped step's loss was counted");
  expect(same_on_every_rank(comm, weights(t.ddp().parameters())), "trainer: ranks differ after a skipped step");
}

}  // namespace ddp::test
