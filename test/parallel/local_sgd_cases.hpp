// Local SGD, post-local SGD and DiLoCo (parallel/local_sgd.hpp) written once over any AsyncCommunicator: run inside
// doctest on the threads backend (local_sgd_test.cpp). Each scenario trains a small MLP data-parallel and checks it
// against replicas trained by hand on every rank (each rank computes all world-size replicas itself), the collectives
// it launched (Recording) and the bytes. Each throws std::runtime_error on failure.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/comm/recording.hpp"
#include "ddp/ddp.hpp"
#include "ddp/parallel/local_sgd.hpp"
#include "ddp/train/checkpoint.hpp"
#include "test/parallel/ddp_cases.hpp"

namespace ddp::test {

// max |a - b| / max(1, max |b|).
inline double local_rel_diff(std::vector<float> const& a, std::vector<float> const& b) {
  expect(a.size() == b.size(), "local_rel_diff: sizes differ");
  double diff = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// The world's replicas trained by hand: replica k steps SGD (momentum) on rank k's rows of each step; `sync(step)`
// says after which steps (1-based) the replicas are made one, `mix` how.
struct HandReplicas {
  std::vector<Mlp> models;
  std::vector<nn::ParameterArena<float>> arenas;
  std::vector<optim::SGD> opts;
  HandReplicas(int n, optim::SgdOptions o) {
    models.reserve(static_cast<std::size_t>(n));  // the arenas point into the models
    for (int k = 0; k < n; ++k) models.push_back(make_mlp(8, 16, 4, 5));
    for (auto& m : models) arenas.emplace_back(m);
    for (auto& a : arenas) opts.emplace_back(a, o);
  }
  // One step of every replica on its rows (mean squared error on `local` rows of `data`), or, `global`, on the whole
  // step's rows (a synchronous step: the mean gradient of every rank's rows).
  void step(Data const& data, int s, std::int64_t local, bool global = false) {
    int const n = static_cast<int>(models.size());
    for (int k = 0; k < n; ++k) {
      opts[static_cast<std::size_t>(k)].zero_grad();
      std::int64_t const from = global ? s * n * local : (s * n + k) * local, count = global ? n * local : local;
      Tensor<float> const x = rows(data.x, from, count), y = rows(data.y, from, count);
      backward(mse_loss(models[static_cast<std::size_t>(k)].forward(Var(x)), y));
      opts[static_cast<std::size_t>(k)].step();
    }
  }
  // The replicas' mean parameters, in the backend's order (rank order, then / n).
  std::vector<float> mean() const {
    std::vector<float> m(weights(arenas[0]).size(), 0.0f);
    for (auto const& a : arenas) {
      auto const w = weights(a);
      for (std::size_t i = 0; i < m.size(); ++i) m[i] += w[i];
    }
    for (auto& v : m) v /= static_cast<float>(arenas.size());
    return m;
  }
  // DiLoCo's outer step by hand (lr 0.7, Nesterov momentum 0.9; the first step's buffer is the pseudo-gradient):
  // `kept` moves by the replicas' mean change, and every replica restarts from it.
  void outer_step(std::vector<float>& kept, std::vector<float>& momentum) {
    std::vector<float> const m = mean();
    std::vector<float> delta(kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) delta[i] = kept[i] - m[i];  // the mean pseudo-gradient
    if (momentum.empty())
      momentum = delta;
    else
      for (std::size_t i = 0; i < kept.size(); ++i) momentum[i] = delta[i] + 0.9f * momentum[i];
    for (std::size_t i = 0; i < kept.size(); ++i) kept[i] -= 0.7f * (delta[i] + 0.9f * momentum[i]);
    set_all(kept);
  }
  void set_all(std::vector<float> const& w) {
    for (auto& a : arenas) {
      std::size_t at = 0;
      for (auto const& e : a.entries()) {
        std::copy(w.begin() + static_cast<std::ptrdiff_t>(at), w.begin() + static_cast<std::ptrdiff_t>(at + e.numel),
                  e.var.value().data());
        at += static_cast<std::size_t>(e.numel);
      }
    }
  }
};

inline std::int64_t labelled(std::vector<CollectiveRecord> const& recs, std::string_view label) {
  return std::count_if(recs.begin(), recs.end(), [&](CollectiveRecord const& c) { return c.tag.label == label; });
}
// The bytes this rank passed to the collectives labelled `label`, as the trace counts them (count × wire type).
inline std::int64_t labelled_bytes(std::vector<CollectiveRecord> const& recs, std::string_view label) {
  std::int64_t bytes = 0;
  for (auto const& c : recs)
    if (c.tag.label == label) bytes += static_cast<std::int64_t>(c.count * size_of(c.dtype));
  return bytes;
}

// LocalSgd with `warmup` synchronous steps, then local steps averaged every `period`: each step's weights against the
// hand-made replicas (the synchronous steps against a plain DDP's, bitwise), what each step launched, and the bytes.
template <AsyncCommunicator C>
void local_sgd_matches_replicas(C& comm, std::int64_t period, std::int64_t warmup, int steps) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  Data const data = make_data(local * n * steps, 8, 4, 23);
  optim::SgdOptions const o{.lr = 0.05, .momentum = 0.9};
  Recording<C> rec(comm);
  auto model = make_mlp(8, 16, 4, 5);
  SizeCapped const buckets{{.cap_bytes = 256, .first_cap_bytes = 128}};
  DistributedDataParallel<Mlp, Recording<C>> ddp(model, rec, {}, {.bucketer = buckets});
  LocalSgd<optim::SGD, Recording<C>> opt(ddp, {.optimizer = o, .local = {.period = period, .warmup_steps = warmup}});
  auto plain_model = make_mlp(8, 16, 4, 5);
  DistributedDataParallel<Mlp, C> plain(plain_model, comm, {}, {.bucketer = buckets});
  optim::SGD plain_opt(plain.parameters(), o);
  HandReplicas hand(n, o);
  std::int64_t traced = 0;  // the averages' bytes, from the trace
  std::int64_t const nb = static_cast<std::int64_t>(ddp.plan().buckets.size());
  expect(nb >= 2, "the plan should have several buckets");
  for (int s = 0; s < steps; ++s) {
    Tensor<float> const x = rows(data.x, (s * n + r) * local, local), y = rows(data.y, (s * n + r) * local, local);
    rec.clear();
    opt.zero_grad();
    backward(mse_loss(ddp(Var(x)), y));
    opt.step();
    bool const sync = s < warmup;
    bool const averaged = !sync && (s + 1 - warmup) % period == 0;
    auto const at = detail::cat("rank ", r, ", step ", s + 1, ": ");
    expect(labelled(rec.records(), "bucket") == (sync && n > 1 ? nb : 0),
           at + "a local step launched bucket all-reduces, or a synchronous one did not");
    expect(labelled(rec.records(), "average") == (averaged ? nb : 0), at + "wrong number of parameter averages");
    traced += labelled_bytes(rec.records(), "average");
    if (sync) {
      plain_opt.zero_grad();
      backward(mse_loss(plain(Var(x)), y));
      plain_opt.step();
      expect(weights(ddp.parameters()) == weights(plain.parameters()),
             at + "a warm-up step differs from a plain DDP step");
    }
    hand.step(data, s, local, sync);
    if (averaged) hand.set_all(hand.mean());
    auto const mine = weights(ddp.parameters());
    double const d = local_rel_diff(mine, weights(hand.arenas[static_cast<std::size_t>(r)]));
    expect(d < 1e-6, detail::cat(at, "the weights are ", d, " from the hand-made replica"));
    // Every rank the same bits after an average; different ones between (they trained on different rows).
    std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
    host_all_gather(comm, std::span<float const>(mine), std::span<float>(all));
    bool const same = std::equal(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(mine.size()),
                                 all.end() - static_cast<std::ptrdiff_t>(mine.size()));
    expect(n == 1 || same == (averaged || sync),
           at + (averaged || sync ? "ranks differ" : "ranks equal between averages"));
  }
  std::int64_t const averages = (steps - warmup) / period;
  expect(opt.syncs() == averages, "syncs()");
  std::int64_t bytes = 0;
  for (auto const& b : ddp.plan().buckets) bytes += b.numel * static_cast<std::int64_t>(sizeof(float));
  expect(opt.bytes_sent() == averages * bytes, "bytes_sent(): one parameter set per average");
  expect(traced == opt.bytes_sent(),
         detail::cat("the trace counts ", traced, " bytes of averages, bytes_sent() ", opt.bytes_sent()));
}

// With average_optimizer_state, the momentum buffers are the same on every rank after an average.
template <AsyncCommunicator C>
void local_sgd_averages_state(C& comm) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  Data const data = make_data(local * n * 4, 8, 4, 29);
  auto model = make_mlp(8, 16, 4, 5);
  DistributedDataParallel<Mlp, C> ddp(model, comm);
  LocalSgd<optim::SGD, C> opt(
      ddp, {.optimizer = {.lr = 0.05, .momentum = 0.9}, .local = {.period = 2, .average_optimizer_state = true}});
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(rows(data.x, (s * n + r) * local, local))), rows(data.y, (s * n + r) * local, local)));
    opt.step();
  }
  auto const st = opt.state();
  std::vector<float> mine;
  for (auto const& p : st.parameters)
    for (auto const& b : p.buffers) mine.insert(mine.end(), b.begin(), b.end());
  expect(!mine.empty(), "SGD with momentum has buffers");
  std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
  host_all_gather(comm, std::span<float const>(mine), std::span<float>(all));
  for (int k = 1; k < n; ++k)
    expect(std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(k * mine.size())),
           detail::cat("rank ", r, ": the momentum differs from rank ", k, "'s after an average"));
}

// DiLoCo with SGD inside: after each outer step the weights are those of the outer Nesterov step on the replicas'
// mean change, computed by hand; every rank holds them.
template <AsyncCommunicator C>
void diloco_matches_replicas(C& comm, std::int64_t period, int steps) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = 4;
  Data const data = make_data(local * n * steps, 8, 4, 31);
  optim::SgdOptions const o{.lr = 0.05};
  Recording<C> rec(comm);
  auto model = make_mlp(8, 16, 4, 5);
  DistributedDataParallel<Mlp, Recording<C>> ddp(model, rec);
  DiLoCo<optim::SGD, Recording<C>> opt(ddp, {.optimizer = o, .outer = {.period = period}});
  HandReplicas hand(n, o);
  std::vector<float> kept = weights(hand.arenas[0]), momentum;
  for (int s = 0; s < steps; ++s) {
    rec.clear();
    opt.zero_grad();
    backward(mse_loss(ddp(Var(rows(data.x, (s * n + r) * local, local))), rows(data.y, (s * n + r) * local, local)));
    opt.step();
    hand.step(data, s, local);
    bool const outer = (s + 1) % period == 0;
    expect(labelled(rec.records(), "bucket") == 0, "DiLoCo launched a bucket all-reduce");
    expect((labelled(rec.records(), "average") > 0) == outer, "DiLoCo averaged outside an outer step");
    if (outer) {
      hand.outer_step(kept, momentum);
    }
    double const d = local_rel_diff(weights(ddp.parameters()), weights(hand.arenas[static_cast<std::size_t>(r)]));
    expect(d < 2e-6, detail::cat("rank ", r, ", step ", s + 1, ": the weights are ", d, " from the hand-made ones"));
  }
  expect(opt.syncs() == steps / period, "syncs()");
}

// Virtual replicas (parallel/local_rounds.hpp): R = 4 replicas of the MLP in deterministic mode, whatever the world
// size (1, 2 or 4): each step's 16 rows are 8 micro-batches of 2, and replica g takes rows [4g, 4g + 4) (two
// micro-batches). LocalSgd (2 warm-up steps, then an average every 3 steps, with the optimizer state when
// `average_state`) or DiLoCo (an outer step every 3), over steps [from, to) of one fixed data stream; it resumes from
// `resume` and saves to `save` (save_checkpoint, collective) when they are given. Returns every replica's parameters
// and optimizer buffers and DiLoCo's kept copy (LocalRoundsState, gathered: the same on every rank), flattened, then
// rank 0's parameters at rest.
inline constexpr std::int64_t kVirtualReplicas = 4;
inline constexpr int kVirtualSteps = 7;

template <AsyncCommunicator C>
std::vector<float> virtual_replicas_run(C& comm, bool diloco, bool average_state, int from, int to,
                                        std::filesystem::path const& resume = {},
                                        std::filesystem::path const& save = {}) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const step_rows = 16, mine = step_rows / n;
  Data const data = make_data(step_rows * kVirtualSteps, 8, 4, 53);
  auto model = make_mlp(8, 16, 4, 5);
  DeterministicDataParallel<Mlp, C> ddp(
      model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 128}}, .batching = {.count = 8}});
  optim::SgdOptions const o{.lr = 0.05, .momentum = 0.9};
  std::vector<float> out;
  auto train = [&](auto& opt) {
    if (!resume.empty()) {
      TrainPosition const pos = load_checkpoint(resume, comm, model, opt);
      expect(pos.global_step == from, "the checkpoint's step");
    }
    for (int s = from; s < to; ++s) {
      Tensor<float> const x = rows(data.x, s * step_rows + r * mine, mine);
      Tensor<float> const y = rows(data.y, s * step_rows + r * mine, mine);
      opt.zero_grad();
      for (auto const& mb : ddp.micro_batches(x, y, {.step = static_cast<std::uint64_t>(s)}))
        backward(mse_loss(ddp(mb), mb.y));
      opt.step();
    }
    if (!save.empty()) save_checkpoint(save, comm, model, opt, TrainPosition{.global_step = to, .world_size = n});
    auto const st = opt.local_state();
    expect(st.replicas == kVirtualReplicas && st.values.size() == static_cast<std::size_t>(kVirtualReplicas),
           "local_state() holds every virtual replica");
    for (auto const& replica : st.values)
      for (auto const& v : replica) out.insert(out.end(), v.begin(), v.end());
    for (auto const& os : st.states)
      for (auto const& p : os.parameters)
        for (auto const& b : p.buffers) out.insert(out.end(), b.begin(), b.end());
    for (auto const& v : st.kept) out.insert(out.end(), v.begin(), v.end());
    if (r == 0) {
      auto const w = weights(ddp.parameters());
      out.insert(out.end(), w.begin(), w.end());
    }
  };
  if (diloco) {
    DiLoCo<optim::SGD, C> opt(ddp, {.optimizer = o, .outer = {.period = 3, .replicas = kVirtualReplicas}});
    train(opt);
  } else {
    LocalSgd<optim::SGD, C> opt(
        ddp,
        {.optimizer = o,
         .local = {
             .period = 3, .warmup_steps = 2, .average_optimizer_state = average_state, .replicas = kVirtualReplicas}});
    train(opt);
  }
  return out;
}

// The virtual replicas against R replicas trained by hand (each on its 4 rows, one forward; the averages in float):
// within float reordering, at any world size; and every rank's gathered replicas are the same bits.
template <AsyncCommunicator C>
void virtual_replicas_match_hand(C& comm, bool diloco) {
  int const n = comm.world_size();
  std::vector<float> const got = virtual_replicas_run(comm, diloco, false, 0, kVirtualSteps);
  optim::SgdOptions const o{.lr = 0.05, .momentum = 0.9};
  Data const data = make_data(16 * kVirtualSteps, 8, 4, 53);
  HandReplicas hand(static_cast<int>(kVirtualReplicas), o);
  std::vector<float> kept = weights(hand.arenas[0]), momentum;
  for (int s = 0; s < kVirtualSteps; ++s) {
    bool const sync = !diloco && s < 2;
    hand.step(data, s, 4, sync);
    bool const averaged = diloco ? (s + 1) % 3 == 0 : !sync && (s + 1 - 2) % 3 == 0;
    if (!averaged) continue;
    if (!diloco) {
      hand.set_all(hand.mean());
      continue;
    }
    hand.outer_step(kept, momentum);
  }
  std::vector<float> want;
  for (auto const& a : hand.arenas) {
    auto const w = weights(a);
    want.insert(want.end(), w.begin(), w.end());
  }
  std::vector<float> const replicas(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size()));
  double const d = local_rel_diff(replicas, want);
  expect(d < 1e-5, detail::cat(diloco ? "DiLoCo" : "LocalSgd", " with ", kVirtualReplicas, " virtual replicas at ", n,
                               " ranks: ", d, " from the replicas trained by hand"));
  std::vector<float> all(replicas.size() * static_cast<std::size_t>(n));
  host_all_gather(comm, std::span<float const>(replicas), std::span<float>(all));
  for (int k = 1; k < n; ++k)
    expect(std::equal(replicas.begin(), replicas.end(), all.begin() + static_cast<std::ptrdiff_t>(k * replicas.size())),
           detail::cat("rank ", comm.rank(), "'s gathered replicas differ from rank ", k, "'s"));
}

// Hierarchical local SGD (LocalSgdOptions::node_period) over a communicator with node groups: every 2 steps the
// replicas are averaged within each node, every 6 over all ranks. Against replicas trained by hand (each averaged
// with its node's, in rank order); after a node average the ranks of a node hold the same bits, and the nodes
// (when there are several) differ until the next average over all ranks.
template <NodeCommunicator C>
void local_sgd_hierarchical(C& comm) {
  int const n = comm.world_size(), r = comm.rank(), per_node = comm.ranks_per_node();
  expect(n % per_node == 0, "the nodes should be equal");
  std::int64_t const local = 4;
  int const steps = 8;
  Data const data = make_data(local * n * steps, 8, 4, 67);
  optim::SgdOptions const o{.lr = 0.05, .momentum = 0.9};
  auto model = make_mlp(8, 16, 4, 5);
  DistributedDataParallel<Mlp, C> ddp(model, comm, {},
                                      {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 128}}});
  LocalSgd<optim::SGD, C> opt(ddp, {.optimizer = o, .local = {.period = 6, .node_period = 2}});
  HandReplicas hand(n, o);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(rows(data.x, (s * n + r) * local, local))), rows(data.y, (s * n + r) * local, local)));
    opt.step();
    hand.step(data, s, local);
    bool const global = (s + 1) % 6 == 0, node = !global && (s + 1) % 2 == 0;
    if (global) hand.set_all(hand.mean());
    if (node)
      for (int first = 0; first < n; first += per_node) {
        std::vector<float> m(weights(hand.arenas[0]).size(), 0.0f);
        for (int k = first; k < first + per_node; ++k) {
          auto const w = weights(hand.arenas[static_cast<std::size_t>(k)]);
          for (std::size_t i = 0; i < m.size(); ++i) m[i] += w[i];
        }
        for (auto& v : m) v /= static_cast<float>(per_node);
        for (int k = first; k < first + per_node; ++k) {
          std::size_t at = 0;
          for (auto const& e : hand.arenas[static_cast<std::size_t>(k)].entries()) {
            std::copy(m.begin() + static_cast<std::ptrdiff_t>(at),
                      m.begin() + static_cast<std::ptrdiff_t>(at + e.numel), e.var.value().data());
            at += static_cast<std::size_t>(e.numel);
          }
        }
      }
    auto const mine = weights(ddp.parameters());
    auto const at = detail::cat("rank ", r, " of ", n, " (", per_node, " a node), step ", s + 1, ": ");
    double const d = local_rel_diff(mine, weights(hand.arenas[static_cast<std::size_t>(r)]));
    expect(d < 1e-6, detail::cat(at, "the weights are ", d, " from the hand-made replica"));
    std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
    host_all_gather(comm, std::span<float const>(mine), std::span<float>(all));
    auto const of = [&](int k) { return all.begin() + static_cast<std::ptrdiff_t>(k * mine.size()); };
    int const first = r / per_node * per_node;
    if (node || global)
      for (int k = first; k < first + per_node; ++k)
        expect(std::equal(mine.begin(), mine.end(), of(k)), at + "a rank of this node differs after an average");
    if (node && per_node < n)
      expect(!std::equal(mine.begin(), mine.end(), of((first + per_node) % n)),
             at + "another node holds this node's average");
  }
  std::int64_t bytes = 0;
  for (auto const& b : ddp.plan().buckets) bytes += b.numel * static_cast<std::int64_t>(sizeof(float));
  expect(opt.syncs() == 1 && opt.node_syncs() == 3, "one average over all ranks (step 6), node averages at 2, 4, 8");
  expect(opt.node_bytes_sent() == 3 * bytes && opt.bytes_sent() == bytes, "bytes of each level");
}

}  // namespace ddp::test
