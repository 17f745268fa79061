// The Optimizer concept, the per-parameter state every optimizer can save and restore (keyed by name, so it
// outlives any arena layout), and the walk over the arena that groups parameters into runs for one fused pass.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/shard.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::optim {

// One parameter's optimizer state, as PyTorch's state_dict()["state"][i]: its step count and its slice of
// each named state buffer. A sharded optimizer (ArenaShard, ZeRO) holds a piece of each buffer only: elements
// [begin, begin + buffers[b].size()) of the parameter. A full state has begin 0 and numel(shape) values.
template <class T>
struct ParameterState {
  std::string name;                     // the parameter's name in the model ("fc1.weight")
  std::vector<std::int64_t> shape;      // its shape; the state only loads into a parameter of this shape
  std::int64_t steps = 0;               // updates applied to it (0: its buffers are not initialised yet)
  std::vector<std::vector<T>> buffers;  // buffers[b]: buffer_names[b]'s values (numel(shape) each when full)
  std::int64_t begin = 0;               // the first element the buffers hold
  friend bool operator==(ParameterState const&, ParameterState const&) = default;
};

// Everything needed to resume an optimizer exactly, independent of how its arena is laid out: the kind,
// the learning rate, and per parameter of its arena (registration order; frozen parameters are not in an
// arena) its steps and state buffers. A state saved from one arena loads into any other arena of the same
// named parameters: another bucket plan, another world size, DDP or a plain arena.
template <class T>
struct OptimizerState {
  std::string kind;  // the optimizer's name(): "sgd", "adam", "adamw"
  double lr = 0;
  std::vector<std::string> buffer_names;  // e.g. {"exp_avg", "exp_avg_sq"}; the same for every parameter
  std::vector<ParameterState<T>> parameters;
  friend bool operator==(OptimizerState const&, OptimizerState const&) = default;
};

// Per-parameter weight decay: PyTorch's parameter groups for the one hyper-parameter that transformer recipes vary
// by parameter. Returns the decay of the parameter of this name and shape (>= 0). Unset, every parameter takes the
// options' weight_decay.
using DecayRule = std::function<double(std::string const& name, Shape const& shape)>;

// nanoGPT's groups: `decay` on parameters of two or more dimensions (weight matrices, embeddings), none on biases
// and norms' weights.
inline DecayRule decay_matrices_only(double decay) {
  return [decay](std::string const&, Shape const& shape) { return shape.rank() >= 2 ? decay : 0.0; };
}

template <class O>
concept Optimizer = requires(O& o, O const& co, OptimizerState<typename O::value_type> const& st) {
  typename O::value_type;
  o.step();
  o.zero_grad();
  { co.lr() } -> std::convertible_to<double>;
  o.set_lr(0.1);
  { co.state() } -> std::same_as<OptimizerState<typename O::value_type>>;
  o.load_state(st);
  { O::name() } -> std::convertible_to<std::string>;
};

namespace detail {
inline std::string shape_string(std::vector<std::int64_t> const& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}
inline std::vector<std::int64_t> dims_of(Shape const& s) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}
inline std::int64_t numel_of(std::vector<std::int64_t> const& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}
}  // namespace detail

// Matches a saved state to an optimizer's own (`mine`: kind, buffer names, parameter names and shapes; its
// values are not read): returns, for each of mine's parameters, the index of the saved parameter of that
// name. Order does not matter. Throws ArgumentError naming the first difference: another kind or buffer
// set, a parameter missing from `saved` or present only there, another shape, or buffers of the wrong size.
template <class T>
std::vector<std::size_t> match_state(OptimizerState<T> const& saved, OptimizerState<T> const& mine) {
  using ddp::detail::cat;
  auto const& kind = mine.kind;
  if (saved.kind != kind) throw ArgumentError(cat("the optimizer state is for '", saved.kind, "', not '", kind, "'"));
  if (saved.buffer_names != mine.buffer_names) {
    auto list = [](std::vector<std::string> const& v) {
      std::string s = "{";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
      return s + "}";
    };
    throw ArgumentError(cat(kind, " state has buffers ", list(saved.buffer_names), ", this optimizer keeps ",
                            list(mine.buffer_names), " (other options, e.g. momentum on or off?)"));
  }
  std::unordered_map<std::string, std::size_t> by_name;
  for (std::size_t k = 0; k < saved.parameters.size(); ++k) {
    auto const& p = saved.parameters[k];
    if (!by_name.emplace(p.name, k).second)
      throw ArgumentError(cat(kind, " state holds parameter '", p.name, "' twice"));
    if (p.buffers.size() != saved.buffer_names.size())
      throw ArgumentError(cat(kind, " state of parameter '", p.name, "' has ", p.buffers.size(), " buffers, expected ",
                              saved.buffer_names.size()));
    for (std::size_t b = 0; b < p.buffers.size(); ++b)
      if (p.begin != 0 || static_cast<std::int64_t>(p.buffers[b].size()) != detail::numel_of(p.shape))
        throw ArgumentError(cat(kind, " state buffer '", saved.buffer_names[b], "' of parameter '", p.name, "' has ",
                                p.buffers[b].size(), " values from element ", p.begin, " for shape ",
                                detail::shape_string(p.shape),
                                p.begin != 0 || !p.buffers[b].empty()
                                    ? " (one rank's shard of a ZeRO optimizer? Load its consolidated_state())"
                                    : ""));
  }
  std::vector<std::size_t> match;
  match.reserve(mine.parameters.size());
  for (auto const& p : mine.parameters) {
    auto const it = by_name.find(p.name);
    if (it == by_name.end())
      throw ArgumentError(cat(kind, " state has no entry for parameter '", p.name, "' ", detail::shape_string(p.shape),
                              " (it holds ", saved.parameters.size(), " parameters, the optimizer has ",
                              mine.parameters.size(), ": another model?)"));
    auto const& s = saved.parameters[it->second];
    if (s.shape != p.shape)
      throw ArgumentError(cat(kind, " state of parameter '", p.name, "' is for shape ", detail::shape_string(s.shape),
                              ", the parameter has shape ", detail::shape_string(p.shape)));
    match.push_back(it->second);
  }
  if (saved.parameters.size() != mine.parameters.size()) {
    std::unordered_map<std::string, int> mine_names;
    for (auto const& p : mine.parameters) mine_names.emplace(p.name, 0);
    for (auto const& s : saved.parameters)
      if (!mine_names.contains(s.name))
        throw ArgumentError(cat(kind, " state holds parameter '", s.name, "' ", detail::shape_string(s.shape),
                                ", which this optimizer does not have (frozen, or another model?)"));
  }
  return match;
}

namespace detail {

// Arena elements [begin, end) whose parameters all take weight decay `decay`, in ascending order.
struct DecaySpan {
  std::int64_t begin = 0, end = 0;
  double decay = 0;
};
// The arena cut where the decay changes: one span when `rule` is unset (every parameter takes `fallback`).
// ArgumentError naming the parameter when the rule gives a negative or NaN decay.
template <class T, MemorySpace S>
std::vector<DecaySpan> decay_spans(std::string const& who, nn::ParameterArena<T, S> const& arena, DecayRule const& rule,
                                   double fallback) {
  if (!rule) return {{0, arena.numel(), fallback}};
  std::vector<DecaySpan> spans;
  auto const& es = arena.entries();
  for (std::size_t i = es.size(); i-- > 0;) {  // reverse registration order = ascending arena offset
    double const d = rule(es[i].name, es[i].shape);
    if (!(d >= 0))
      throw ArgumentError(
          ddp::detail::cat(who, ": the weight-decay rule gives parameter '", es[i].name, "' ", d, "; it must be >= 0"));
    if (!spans.empty() && spans.back().decay == d && spans.back().end == es[i].offset)
      spans.back().end = es[i].offset + es[i].numel;
    else
      spans.push_back({es[i].offset, es[i].offset + es[i].numel, d});
  }
  return spans;
}
// f(o, k, decay) over the pieces of arena elements [at, at + n) that take one decay each, in order.
template <class F>
void for_each_decay(std::vector<DecaySpan> const& spans, std::int64_t at, std::int64_t n, F&& f) {
  auto it =
      std::upper_bound(spans.begin(), spans.end(), at, [](std::int64_t v, DecaySpan const& s) { return v < s.end; });
  for (std::int64_t o = at; o < at + n && it != spans.end(); ++it) {
    std::int64_t const hi = std::min(at + n, it->end);
    if (hi > o) f(o, hi - o, it->decay);
    o = hi;
  }
}

// Where each parameter's piece of a sharded state lives: elements [begin, begin + numel) of the parameter, at
// `state` in the optimizer's state buffers (numel 0: none of it).
struct StatePiece {
  std::int64_t begin = 0, numel = 0, state = 0;
};

// The pieces of `ranges` (ArenaShard::resolve) per arena entry. A parameter meets at most one range.
template <class T, MemorySpace S>
std::vector<StatePiece> state_pieces(nn::ParameterArena<T, S> const& arena,
                                     std::vector<ArenaShard::Range> const& ranges) {
  std::vector<StatePiece> pieces(arena.count());
  std::int64_t state = 0;
  for (auto const& r : ranges) {
    for (std::size_t i = 0; i < arena.count(); ++i) {
      auto const& e = arena.entries()[i];
      std::int64_t const lo = std::max(r.begin, e.offset), hi = std::min(r.end, e.offset + e.numel);
      if (lo >= hi) continue;
      if (pieces[i].numel != 0)
        throw ArgumentError(
            ddp::detail::cat("ArenaShard: parameter '", e.name, "' meets two ranges; give each parameter at most one"));
      pieces[i] = {lo - e.offset, hi - lo, state + (lo - r.begin)};
    }
    state += r.end - r.begin;
  }
  return pieces;
}

// Calls f(counter, offset, state_offset, numel) for each maximal stretch of `ranges` whose parameters are
// contiguous in the arena, have a gradient, and share the same counter value: arena elements [offset, offset +
// numel), state elements [state_offset, state_offset + numel). Parameters without a gradient are skipped
// (PyTorch skips params whose .grad is None). Unsharded, usually one stretch over the whole arena.
template <class T, MemorySpace S, class F>
void for_each_run(nn::ParameterArena<T, S> const& arena, std::vector<std::int64_t> const& counters,
                  std::vector<ArenaShard::Range> const& ranges, F&& f) {
  auto const& es = arena.entries();
  std::size_t i = es.size();
  std::size_t r = 0;
  std::int64_t state = 0;  // where ranges[r] starts in the state
  while (i > 0) {          // reverse registration order = ascending arena offset
    std::size_t j = i - 1;
    if (!es[j].var.node().grad_defined) {
      --i;
      continue;
    }
    std::int64_t const off = es[j].offset, c = counters[j];
    std::int64_t n = es[j].numel;
    std::size_t k = j;
    while (k > 0 && es[k - 1].var.node().grad_defined && counters[k - 1] == c && es[k - 1].offset == off + n) {
      --k;
      n += es[k].numel;
    }
    for (; r < ranges.size() && ranges[r].end <= off; ++r) state += ranges[r].end - ranges[r].begin;
    for (std::size_t q = r; q < ranges.size() && ranges[q].begin < off + n; ++q) {
      std::int64_t const lo = std::max(off, ranges[q].begin), hi = std::min(off + n, ranges[q].end);
      std::int64_t const at = state + (lo - ranges[q].begin);
      f(c, lo, at, hi - lo);
      if (ranges[q].end > off + n) break;
      state += ranges[q].end - ranges[q].begin;
      r = q + 1;
    }
    i = k;
  }
}

// How an optimizer's update runs its kernel over one stretch of the arena (elements [off, off + n), whose
// gradients are at `g`): `run(o, k, gk)` applies the kernel to elements [o, o + k) of the stretch with the gradients
// at `gk`, element by element, so any partition of the stretch gives the same bits. WholeRun runs it once on the
// arena's gradients; ZeroRedundancyOptimizer under OwnerReduce runs it a chunk at a time on gradients it has just
// averaged from every rank's, and sends each chunk's parameters on right after.
struct WholeRun {
  template <class T, class Run>
  void operator()(std::int64_t off, std::int64_t n, T const* g, Run&& run) const {
    run(off, n, g);
  }
};

// for_each_run cut to the arena elements of `window`: the stretches' parts inside it, with their state offsets.
// One step of an optimizer is its kernel over every stretch; over the windows of a partition of the arena (the
// buckets, as they are reduced) it is the same step, element by element.
template <class T, MemorySpace S, class F>
void for_each_run_within(nn::ParameterArena<T, S> const& arena, std::vector<std::int64_t> const& counters,
                         std::vector<ArenaShard::Range> const& ranges, ArenaShard::Range window, F&& f) {
  for (auto const& e : arena.entries())  // a parameter cut in two would take its step count twice
    if ((e.offset < window.begin && window.begin < e.offset + e.numel) ||
        (e.offset < window.end && window.end < e.offset + e.numel))
      throw ArgumentError(ddp::detail::cat("optimizer update: the window [", window.begin, ", ", window.end,
                                           ") of the arena cuts parameter '", e.name, "' (elements [", e.offset, ", ",
                                           e.offset + e.numel, ")); give whole parameters (a bucket)"));
  for_each_run(arena, counters, ranges, [&](std::int64_t c, std::int64_t off, std::int64_t at, std::int64_t n) {
    std::int64_t const lo = std::max(off, window.begin), hi = std::min(off + n, window.end);
    if (lo < hi) f(c, lo, at + (lo - off), hi - lo);
  });
}

// One step taken by every parameter that has a gradient and whose first element lies in `window` (what
// for_each_run_within updated, on every rank alike).
template <class T, MemorySpace S>
void count_step(nn::ParameterArena<T, S> const& arena, std::vector<std::int64_t>& counters,
                ArenaShard::Range window) noexcept {
  for (std::size_t k = 0; k < arena.count(); ++k) {
    std::int64_t const at = arena.entries()[k].offset;
    if (arena.has_grad(k) && at >= window.begin && at < window.end) ++counters[k];
  }
}
// The whole arena as one window.
template <class T, MemorySpace S>
ArenaShard::Range whole_arena(nn::ParameterArena<T, S> const& arena) noexcept {
  return {0, arena.numel()};
}

// What gather_state copies: the values too, or only the layout (names, shapes, buffer names) for match_state.
enum class Gather { kValues, kLayout };

// The per-parameter view of state buffers laid out by `pieces` (state_pieces): what state() returns. Sharded,
// each parameter's buffers hold its piece only (ParameterState::begin).
template <class T, MemorySpace S>
OptimizerState<T> gather_state(std::string kind, double lr, nn::ParameterArena<T, S> const& arena,
                               std::vector<std::int64_t> const& counters, std::vector<StatePiece> const& pieces,
                               std::vector<std::pair<std::string, Tensor<T, S> const*>> const& buffers,
                               Gather what = Gather::kValues) {
  OptimizerState<T> st{std::move(kind), lr, {}, {}};
  for (auto const& b : buffers) st.buffer_names.push_back(b.first);
  auto const& es = arena.entries();
  for (std::size_t i = 0; i < es.size(); ++i) {
    ParameterState<T> p{es[i].name, dims_of(es[i].shape), counters[i], {}, pieces[i].begin};
    if (what == Gather::kValues)
      for (auto const& b : buffers) {
        std::vector<T> v(static_cast<std::size_t>(pieces[i].numel));
        Kernels<S>::to_host(pieces[i].numel, b.second->data() + pieces[i].state, v.data());
        p.buffers.push_back(std::move(v));
      }
    st.parameters.push_back(std::move(p));
  }
  return st;
}

// The inverse of gather_state: checks `saved` (a full state) against the arena (match_state) and, only if it
// fits, writes each parameter's steps and its piece of each buffer into place. Throws ArgumentError (nothing
// changed) otherwise.
template <class T, MemorySpace S>
void scatter_state(OptimizerState<T> const& saved, std::string const& kind, nn::ParameterArena<T, S> const& arena,
                   std::vector<std::int64_t>& counters, std::vector<StatePiece> const& pieces,
                   std::vector<std::pair<std::string, Tensor<T, S>*>> const& buffers) {
  std::vector<std::pair<std::string, Tensor<T, S> const*>> layout;
  for (auto const& b : buffers) layout.emplace_back(b.first, b.second);
  auto const match = match_state(saved, gather_state(kind, 0.0, arena, counters, pieces, layout, Gather::kLayout));
  auto const& es = arena.entries();
  for (std::size_t i = 0; i < es.size(); ++i) {
    auto const& p = saved.parameters[match[i]];
    counters[i] = p.steps;
    for (std::size_t b = 0; b < buffers.size(); ++b)
      Kernels<S>::from_host(pieces[i].numel, p.buffers[b].data() + pieces[i].begin,
                            buffers[b].second->data() + pieces[i].state);
  }
}
}  // namespace detail

}  // namespace ddp::optim
