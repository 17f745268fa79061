// Checkpoints: rank 0 writes the model (parameters and buffers), the optimizer state, every rank's random
// generators and the training position atomically in a versioned, checksummed binary file, all by name and
// shape; every rank loads and validates it, and a failure surfaces on all ranks.
#pragma once

#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddp/bucket/wire.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/train/checkpoint_agree.hpp"
#include "ddp/train/checkpoint_file.hpp"
#include "ddp/train/checkpoint_format.hpp"

namespace ddp {

// What an optimizer must offer to be checkpointed (every ddp::optim optimizer does).
template <class O, class T>
concept CheckpointableOptimizer = requires(O& o, O const& co, optim::OptimizerState<T> const& st) {
  { co.state() } -> std::same_as<optim::OptimizerState<T>>;
  o.load_state(st);
};

// What a training loop carries from step to step besides the model, the optimizer and the position, for
// save_checkpoint / load_checkpoint: the loss scale (GradScaler::state()) and this rank's gradient wire state
// (DistributedDataParallel::wire_state(): PowerSGD's round counts, Q and error feedback). basic_trainer's
// save_checkpoint / load_checkpoint fill and apply it.
template <class T>
struct RoundState {
  std::optional<optim::GradScalerState> loss_scale{};
  WireState<T> wire{};
  // After a load: whose values `wire` holds (another rank's when the file was written at another world size).
  WireStateFrom wire_from = WireStateFrom::kThisRank;
  // This rank's share of the epoch's train loss so far, when taken mid-epoch (basic_trainer's loss meter). After a
  // load at another world size, rank 0 holds the old ranks' share, rescaled, and the others none (the epoch's figures
  // come out the same, to rounding: detail::epoch_loss_for).
  std::optional<EpochLoss> epoch_loss{};
};

// Which rank restores a checkpoint, out of how many (a generator state is per rank).
struct RankOf {
  int rank = 0;
  int world_size = 1;
};

namespace detail {

// An optimizer that keeps replicas besides the model (LocalSgd, DiLoCo: parallel/local_rounds.hpp): local_state()
// gathers them (collective), check_local_state() and load_local_state() take them back.
template <class O, class T>
concept LocalRoundsOptimizer = requires(O& o, O const& co, LocalRoundsState<T> const& st) {
  { co.local_state() } -> std::same_as<LocalRoundsState<T>>;
  co.check_local_state(st);
  o.load_local_state(st);
};

template <nn::Model M>
auto distinct_parameters(M const& model) {
  auto ps = model.named_parameters();
  std::unordered_set<void const*> seen;
  std::erase_if(ps, [&](auto const& p) { return !seen.insert(&p.var.node()).second; });
  return ps;
}

template <class T, MemorySpace S>
TensorRecord<T> record_of(std::string const& name, Tensor<T, S> const& t) {
  TensorRecord<T> r{name, optim::detail::dims_of(t.shape()), std::vector<T>(static_cast<std::size_t>(t.numel()))};
  Kernels<S>::to_host(t.numel(), t.data(), r.values.data());
  return r;
}

// Finds each of the model's tensors (name, shape) among the file's records by name. Throws ArgumentError via
// `err` for one that is missing, mis-shaped, or in the file only. Returns the file index per model tensor.
template <class T, class Err>
std::vector<std::size_t> match_records(std::vector<TensorRecord<T>> const& file,
                                       std::vector<std::pair<std::string, std::vector<std::int64_t>>> const& model,
                                       char const* kind, Err const& err) {
  std::unordered_map<std::string, std::size_t> by_name;
  for (std::size_t k = 0; k < file.size(); ++k)
    if (!by_name.emplace(file[k].name, k).second) throw err("it holds ", kind, " '", file[k].name, "' twice");
  std::vector<std::size_t> match;
  for (auto const& [name, shape] : model) {
    auto const it = by_name.find(name);
    if (it == by_name.end())
      throw err("the model's ", kind, " '", name, "' ", shape_string(shape), " is not in the file (it holds ",
                file.size(), " ", kind, "s, the model has ", model.size(), ": a different --model or architecture?)");
    auto const& r = file[it->second];
    if (r.shape != shape)
      throw err(kind, " '", name, "' is ", shape_string(r.shape), " in the file but ", shape_string(shape),
                " in the model");
    match.push_back(it->second);
  }
  if (file.size() != model.size()) {
    std::unordered_set<std::string> mine;
    for (auto const& m : model) mine.insert(m.first);
    for (auto const& r : file)
      if (!mine.contains(r.name))
        throw err("it holds ", kind, " '", r.name, "' ", shape_string(r.shape),
                  ", which the model does not have (it holds ", file.size(), " ", kind, "s, the model has ",
                  model.size(), ": a different --model or architecture?)");
  }
  return match;
}

template <nn::Model M>
auto parameter_layout(M const& model) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> v;
  for (auto const& p : distinct_parameters(model)) v.emplace_back(p.name, optim::detail::dims_of(p.var.shape()));
  return v;
}
template <nn::Model M>
auto buffer_layout(M const& model) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> v;
  for (auto const& b : model.named_buffers()) v.emplace_back(b.name, optim::detail::dims_of(b.tensor.shape()));
  return v;
}

// A generator state as 4 int64 words (for collectives) and back.
inline void generator_to_words(GeneratorState const& g, std::int64_t* w) {
  w[0] = std::bit_cast<std::int64_t>(g.state);
  w[1] = std::bit_cast<std::int64_t>(g.inc);
  w[2] = std::bit_cast<std::int64_t>(g.spare);
  w[3] = g.has_spare ? 1 : 0;
}
inline GeneratorState generator_from_words(std::int64_t const* w) {
  return {std::bit_cast<std::uint64_t>(w[0]), std::bit_cast<std::uint64_t>(w[1]), std::bit_cast<double>(w[2]),
          w[3] != 0};
}
inline constexpr std::size_t kGeneratorWords = 4;

// Every rank's generator states, on rank 0 (collective; the other ranks get an empty list). A model type
// without generators needs no communication. Ranks with different numbers of generators are an
// ArgumentError on every rank.
template <Communicator C, nn::Model M>
std::vector<std::vector<GeneratorState>> gather_generators(C& comm, M const& model) {
  auto const gens = nn::generators_of(model);
  std::vector<GeneratorState> mine;
  for (auto const& g : gens) mine.push_back(g.generator->state());
  int const n = comm.world_size();
  if (n == 1) return {mine};
  if constexpr (!nn::HasGenerators<M>) return std::vector<std::vector<GeneratorState>>(static_cast<std::size_t>(n));
  std::vector<std::int64_t> count{static_cast<std::int64_t>(mine.size()), -static_cast<std::int64_t>(mine.size())};
  host_all_reduce(comm, std::span<std::int64_t>(count), ReduceOp::kMax, CollectiveTag{"checkpoint.generators"});
  if (count[0] != -count[1])
    throw ArgumentError(ddp::detail::cat("save_checkpoint: ranks' models have between ", -count[1], " and ", count[0],
                                         " random generators (rank ", comm.rank(), " has ", mine.size(),
                                         "); every rank must build the same model"));
  std::vector<std::int64_t> words(mine.size() * kGeneratorWords);
  for (std::size_t g = 0; g < mine.size(); ++g) generator_to_words(mine[g], words.data() + g * kGeneratorWords);
  // A few words per generator: gathered everywhere through host_all_gather, which any backend (NCCL too) runs.
  std::vector<std::int64_t> all(words.size() * static_cast<std::size_t>(n));
  if (!words.empty())
    host_all_gather(comm, std::span<std::int64_t const>(words), std::span<std::int64_t>(all),
                    CollectiveTag{"checkpoint.generators"});
  if (comm.rank() != 0) return {};
  std::vector<std::vector<GeneratorState>> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (std::size_t g = 0; g < mine.size(); ++g)
      out[static_cast<std::size_t>(r)].push_back(
          generator_from_words(all.data() + (static_cast<std::size_t>(r) * mine.size() + g) * kGeneratorWords));
  return out;
}

// Every rank's wire values, on rank 0 (collective; other ranks get an empty record). The wire is the same
// composition on every rank (DistributedDataParallel checks the bucket plan), so every rank holds as many values.
template <Communicator C, class T>
WireRecords<T> gather_wire(C& comm, WireState<T> const& mine) {
  WireRecords<T> out{.kind = mine.kind, .layout = mine.layout, .counters = mine.counters};
  if (mine.kind.empty()) return out;
  int const n = comm.world_size();
  if (n == 1) {
    out.ranks.push_back(mine.values);
    return out;
  }
  std::vector<T> all(mine.values.size() * static_cast<std::size_t>(n));
  if (!mine.values.empty())
    host_all_gather(comm, std::span<T const>(mine.values), std::span<T>(all), CollectiveTag{"checkpoint.wire"});
  if (comm.rank() != 0) return {};
  for (int r = 0; r < n; ++r) {
    auto const first = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * mine.values.size());
    out.ranks.emplace_back(first, first + static_cast<std::ptrdiff_t>(mine.values.size()));
  }
  return out;
}

// Every rank's EpochLoss, on rank 0 (collective; empty on the others, and everywhere when `mine` is empty: the
// ranks agree on that, as they take checkpoints at the same step).
template <Communicator C>
std::vector<EpochLoss> gather_epoch_loss(C& comm, std::optional<EpochLoss> const& mine) {
  if (!mine) return {};
  auto words = [](EpochLoss const& l) {
    return std::array<std::int64_t, 5>{l.train.correct, l.train.total, std::bit_cast<std::int64_t>(l.train.loss_sum),
                                       std::bit_cast<std::int64_t>(l.exact_total), l.exact_count};
  };
  int const n = comm.world_size();
  auto const w = words(*mine);
  std::vector<std::int64_t> all(w.size() * static_cast<std::size_t>(n));
  if (n == 1)
    std::copy(w.begin(), w.end(), all.begin());
  else
    host_all_gather(comm, std::span<std::int64_t const>(w), std::span<std::int64_t>(all),
                    CollectiveTag{"checkpoint.loss"});
  if (comm.rank() != 0) return {};
  std::vector<EpochLoss> out;
  for (int r = 0; r < n; ++r) {
    std::int64_t const* x = all.data() + static_cast<std::size_t>(r) * w.size();
    out.push_back({.train = {.correct = x[0], .total = x[1], .loss_sum = std::bit_cast<double>(x[2])},
                   .exact_total = std::bit_cast<double>(x[3]),
                   .exact_count = x[4]});
  }
  return out;
}

// This rank's share of a file's epoch loss: its own at the world size that wrote it. At another, rank 0 takes the
// per-sample counts summed and the others nothing; the exact total, the same on every rank, stays everywhere.
inline std::optional<EpochLoss> epoch_loss_for(std::vector<EpochLoss> const& file, RankOf at) {
  if (file.empty()) return std::nullopt;
  if (file.size() == static_cast<std::size_t>(at.world_size)) return file[static_cast<std::size_t>(at.rank)];
  EpochLoss mine{.exact_total = file[0].exact_total, .exact_count = file[0].exact_count};
  if (at.rank != 0) return mine;
  for (auto const& l : file) mine.train += l.train;
  return mine;
}

// A file's wire state against this run's (`mine`: kind and layout). The same kind with another layout is an
// ArgumentError (via `err`); another kind (a run that changed its comm hook) is not: that state is not loaded.
template <class T, class Err>
void check_wire_fits(WireRecords<T> const& file, WireState<T> const& mine, Err const& err) {
  if (file.kind.empty() || file.kind != mine.kind) return;
  if (file.layout != mine.layout || file.counters.size() != mine.counters.size() ||
      (!file.ranks.empty() && file.ranks[0].size() != mine.values.size()))
    throw err("its ", file.kind, " state was written for another bucket layout (", file.layout.size(),
              " layout entries and ", file.ranks.empty() ? 0 : file.ranks[0].size(), " values per rank; this run has ",
              mine.layout.size(), " and ", mine.values.size(),
              "): resume with the same bucket cap, parameters and compression rank");
}

}  // namespace detail

// The model (parameters, frozen ones included, and buffers), the optimizer's per-parameter state, this
// process's generators (as the only rank) and the position as a CheckpointData: host copies, by name.
template <nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> CheckpointData<T> capture_checkpoint(M const& model, O const& opt,
                                                                            TrainPosition const& pos,
                                                                            std::string_view extra = {}) {
  return capture_checkpoint(model, opt.state(), pos, extra);
}
// The same with the optimizer's state already taken (a sharded optimizer's consolidated_state()).
template <nn::Model M, class T = typename M::value_type>
CheckpointData<T> capture_checkpoint(M const& model, optim::OptimizerState<T> state, TrainPosition const& pos,
                                     std::string_view extra = {}) {
  CheckpointData<T> c{.position = pos, .optimizer = std::move(state), .extra = std::string(extra)};
  for (auto const& p : detail::distinct_parameters(model))
    c.parameters.push_back(detail::record_of(p.name, p.var.value()));
  for (auto const& b : model.named_buffers()) c.buffers.push_back(detail::record_of(b.name, b.tensor));
  c.generators.ranks.emplace_back();
  for (auto const& g : nn::generators_of(model)) {
    c.generators.names.push_back(g.name);
    c.generators.ranks[0].push_back(g.generator->state());
  }
  return c;
}

// Checks that `c` fits this model and optimizer, matching everything by name: the same parameters and
// buffers (names and shapes; order does not matter), optimizer state for the same kind, buffers and
// parameters, the same generator names. Throws ArgumentError naming the file and the difference.
template <nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void check_checkpoint_fits(CheckpointData<T> const& c, M const& model, O const& opt, std::string const& file) {
  auto err = [&](auto const&... what) {
    return ArgumentError(ddp::detail::cat("checkpoint ", file, " does not fit this model/optimizer: ", what...));
  };
  detail::match_records(c.parameters, detail::parameter_layout(model), "parameter", err);
  detail::match_records(c.buffers, detail::buffer_layout(model), "buffer", err);
  try {
    optim::match_state(c.optimizer, opt.state());
  } catch (ArgumentError const& e) {
    throw err("its optimizer state does not fit: ", e.what());
  }
  std::unordered_set<std::string> mine, theirs(c.generators.names.begin(), c.generators.names.end());
  for (auto const& g : nn::generators_of(model)) {
    mine.insert(g.name);
    if (!theirs.contains(g.name))
      throw err("the model's random generator '", g.name, "' is not in the file (a model with other Dropout layers?)");
  }
  for (auto const& name : c.generators.names)
    if (!mine.contains(name)) throw err("it holds random generator '", name, "', which the model does not have");
}

// Copies a fitting checkpoint (check_checkpoint_fits) into the model's parameters and buffers and the
// optimizer. Generators get rank `at.rank`'s states when the file was written by `at.world_size` ranks;
// written by another number of ranks, they keep their current states: per-rank random streams cannot be
// mapped onto another set of ranks (every other part of the checkpoint loads into any world size).
template <nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void restore_checkpoint(CheckpointData<T> const& c, M& model, O& opt, RankOf at = {}) {
  using S = typename M::space;
  auto const params = detail::distinct_parameters(model);
  auto const pm = detail::match_records(c.parameters, detail::parameter_layout(model), "parameter",
                                        [](auto const&... what) { return ArgumentError(ddp::detail::cat(what...)); });
  for (std::size_t i = 0; i < params.size(); ++i)
    Kernels<S>::from_host(params[i].var.numel(), c.parameters[pm[i]].values.data(), params[i].var.value().data());
  auto const buffers = model.named_buffers();
  auto const bm = detail::match_records(c.buffers, detail::buffer_layout(model), "buffer",
                                        [](auto const&... what) { return ArgumentError(ddp::detail::cat(what...)); });
  for (std::size_t i = 0; i < buffers.size(); ++i)
    Kernels<S>::from_host(buffers[i].tensor.numel(), c.buffers[bm[i]].values.data(), buffers[i].tensor.data());
  opt.load_state(c.optimizer);
  if (c.generators.ranks.size() == static_cast<std::size_t>(at.world_size)) {
    auto const& states = c.generators.ranks[static_cast<std::size_t>(at.rank)];
    for (auto const& g : nn::generators_of(model))
      for (std::size_t k = 0; k < c.generators.names.size(); ++k)
        if (c.generators.names[k] == g.name) g.generator->set_state(states[k]);
  }
}

// Collective (every rank calls it): every rank's generator states are gathered, then rank 0 captures the
// model (ddp.module() under DDP), the optimizer and the position and writes `path` atomically; the outcome
// is agreed on, so a failed write throws the same IoError on every rank. `extra` (rank 0's) is stored as it
// is and handed back by load_checkpoint. Other ranks' parameters, buffers and optimizer state are not read:
// under DDP they equal rank 0's (bitwise, for the threads and MPI backends; buffers are broadcast from rank 0).
// A sharded optimizer (consolidated_state(): ZeroRedundancyOptimizer) first puts its pieces together on every
// rank, so the file holds the whole state, by parameter name, and resumes at any world size, sharded or not.
// `round`: this rank's RoundState (loss scale, wire state), kept too; every rank's wire values are gathered.
namespace detail {

// save_checkpoint with what rank 0 does with the captured checkpoint given: write(c) writes it (one file, or a
// CheckpointSeries' next one). Collective; the outcome is agreed on.
template <Communicator C, nn::Model M, class O, class W, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void save_checkpoint_with(W const& write, C& comm, M const& model, O const& opt, TrainPosition const& pos,
                          std::string_view extra, RoundState<T> const& round) {
  auto generators = detail::gather_generators(comm, model);
  auto wire = detail::gather_wire(comm, round.wire);
  auto epoch_loss = detail::gather_epoch_loss(comm, round.epoch_loss);
  std::optional<optim::OptimizerState<T>> full;  // a sharded optimizer's pieces, put together (collective)
  if constexpr (requires { opt.consolidated_state(); }) full = opt.consolidated_state();
  std::optional<LocalRoundsState<T>> local;  // every replica's, gathered (collective)
  if constexpr (detail::LocalRoundsOptimizer<O, T>) local = opt.local_state();
  std::string message;
  auto const kind = comm.rank() != 0 ? detail::Failure::kNone
                                     : detail::run_classified(
                                           [&] {
                                             auto c = full ? capture_checkpoint(model, std::move(*full), pos, extra)
                                                           : capture_checkpoint(model, opt, pos, extra);
                                             c.generators.ranks = std::move(generators);
                                             c.loss_scale = round.loss_scale;
                                             c.wire = std::move(wire);
                                             c.epoch_loss = std::move(epoch_loss);
                                             c.local = std::move(local);
                                             write(c);
                                           },
                                           message);
  detail::agree_or_throw(comm, kind, message);
}

}  // namespace detail

template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void save_checkpoint(std::filesystem::path const& path, C& comm, M const& model, O const& opt, TrainPosition const& pos,
                     std::string_view extra, RoundState<T> const& round) {
  detail::save_checkpoint_with([&](CheckpointData<T> const& c) { write_checkpoint_file(path, c); }, comm, model, opt,
                               pos, extra, round);
}
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T>
void save_checkpoint(std::filesystem::path const& path, C& comm, M const& model, O const& opt, TrainPosition const& pos,
                     std::string_view extra = {}) {
  save_checkpoint(path, comm, model, opt, pos, extra, RoundState<T>{});
}

namespace detail {

// The second half of load_checkpoint, once every rank holds the file's bytes (`text`, whose container rank 0 has
// checked): decode, check the fit on every rank, agree, restore. `file` names the file in errors.
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> TrainPosition load_checkpoint_bytes(std::string const& text,
                                                                           std::string const& file, C& comm, M& model,
                                                                           O& opt, std::string* extra,
                                                                           RoundState<T>* round) {
  CheckpointData<T> c;
  std::string message;
  auto kind = detail::run_classified(
      [&] {
        c = decode_checkpoint<T>(text, file);
        check_checkpoint_fits(c, model, opt, file);
        if constexpr (detail::LocalRoundsOptimizer<O, T>) {
          auto const err = [&](auto const&... what) {
            return ArgumentError(
                ddp::detail::cat("checkpoint ", file, " does not fit this run's local rounds: ", what...));
          };
          if (!c.local) throw err("it holds no local rounds (written without LocalSgd or DiLoCo)");
          try {
            opt.check_local_state(*c.local);
          } catch (ArgumentError const& e) {
            throw err(e.what());
          }
        }
        if (round)
          detail::check_wire_fits(c.wire, round->wire, [&](auto const&... what) {
            return ArgumentError(ddp::detail::cat("checkpoint ", file, " does not fit this run: ", what...));
          });
      },
      message);
  detail::agree_or_throw(comm, kind, message);
  restore_checkpoint(c, model, opt, RankOf{comm.rank(), comm.world_size()});
  if constexpr (detail::LocalRoundsOptimizer<O, T>) opt.load_local_state(*c.local);
  if (extra) *extra = std::move(c.extra);
  if (round) {
    round->loss_scale = c.loss_scale;
    round->epoch_loss = detail::epoch_loss_for(c.epoch_loss, RankOf{comm.rank(), comm.world_size()});
    bool const mine = c.wire.kind == round->wire.kind && !c.wire.kind.empty();
    bool const same_world = c.wire.ranks.size() == static_cast<std::size_t>(comm.world_size());
    round->wire_from = same_world ? WireStateFrom::kThisRank : WireStateFrom::kOtherRank;
    round->wire = mine ? WireState<T>{.kind = std::move(c.wire.kind),
                                      .layout = std::move(c.wire.layout),
                                      .counters = std::move(c.wire.counters),
                                      .values = std::move(c.wire.ranks[same_world ? comm.rank() : 0])}
                       : WireState<T>{};
  }
  return c.position;
}

}  // namespace detail

// Collective (every rank calls it): rank 0 reads `path` and checks its container (truncation, magic,
// version, checksums); the bytes or the error are broadcast; every rank then decodes them and checks that
// they fit its model and optimizer (by name and shape, so any bucket plan and any world size); only when all
// ranks agree are parameters, buffers, optimizer state and generators restored (generators only when the
// world size is the one that wrote the file; see restore_checkpoint). Any failure throws the same error on
// every rank (IoError for a bad file, ArgumentError for a model or optimizer mismatch), never a hang.
// Returns the training position stored in the file; `extra`, when given, receives the bytes save_checkpoint
// stored (empty if none).
// `round`, when given: on entry this run's RoundState (its wire's kind and layout are checked against the file's:
// the same kind in another layout is refused like a model mismatch); on return the file's loss scale (none if it
// kept none) and wire state: this rank's values when the file was written at this world size, rank 0's otherwise
// (round->wire_from says which), or an empty state when the file kept none for this run's kind of wire.
template <Communicator C, nn::Model M, class O, class T = typename M::value_type>
requires CheckpointableOptimizer<O, T> TrainPosition load_checkpoint(std::filesystem::path const& path, C& comm,
                                                                     M& model, O& opt, std::string* extra = nullptr,
                                                                     RoundState<T>* round = nullptr) {
  std::string const file = path.string();
  std::string text;
  auto kind = detail::Failure::kNone;
  if (comm.rank() == 0) {
    kind = detail::run_classified(
        [&] {
          text = detail::read_checkpoint_bytes(path);
          (void)decode_checkpoint<T>(text, file);  // container checks once, before shipping the bytes
        },
        text);
  }
  if (comm.world_size() > 1) {
    auto status = static_cast<std::int64_t>(kind);
    detail::broadcast_outcome(comm, 0, status, text);
    kind = static_cast<detail::Failure>(status);
  }
  if (kind != detail::Failure::kNone)
    detail::throw_failure(
        kind, comm.rank() == 0 ? text : ddp::detail::cat(text, " (read by rank 0; this is rank ", comm.rank(), ")"));
  return detail::load_checkpoint_bytes(text, file, comm, model, opt, extra, round);
}

}  // namespace ddp
