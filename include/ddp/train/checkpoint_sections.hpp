// The checkpoint sections that hold an optimizer's state (OPTM, and each replica's state in LOCL) and LocalSgd's or
// DiLoCo's replicas (LOCL): their encoding and their bounds-checked decoding, with the limits on what a checkpoint
// may declare (counters, ranks, learning rate, state buffers). train/checkpoint_format.hpp documents the whole
// layout and puts these sections in a file.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/local_state.hpp"
#include "ddp/train/checkpoint_bytes.hpp"

namespace ddp {

// Limits on what a checkpoint may declare: larger values are corrupt (or from no run ddp can resume).
inline constexpr std::int64_t kCheckpointMaxCounter = std::int64_t{1} << 53;  // steps, epochs: exact in a double
inline constexpr std::int64_t kCheckpointMaxRanks = std::int64_t{1} << 20;
inline constexpr double kCheckpointMaxLr = 1e6;
inline constexpr std::uint32_t kCheckpointMaxStateBuffers = 16;  // per parameter (ddp's optimizers keep 0 to 2)

namespace detail {

using optim::detail::shape_string;

// A counter read from section `r` must lie in [0, kCheckpointMaxCounter] (or [0, max]).
inline std::int64_t checked_count(ByteReader const& r, std::string_view field, std::int64_t v,
                                  std::int64_t max = kCheckpointMaxCounter) {
  if (v < 0 || v > max) r.fail(field, " = ", v, " is out of range (must be in [0, ", max, "])");
  return v;
}

// OPTM's body, and each replica's state in LOCL: string kind, f64 lr, u32 b, b × string buffer name, u32 n,
// n × (string name, shape, i64 steps, b × numel elements).
template <class T>
void put_optimizer_state(ByteWriter& s, optim::OptimizerState<T> const& o) {
  s.put_string(o.kind);
  s.put(o.lr);
  s.put(static_cast<std::uint32_t>(o.buffer_names.size()));
  for (auto const& n : o.buffer_names) s.put_string(n);
  s.put(static_cast<std::uint32_t>(o.parameters.size()));
  for (auto const& ps : o.parameters) {
    s.put_string(ps.name);
    put_shape(s, ps.shape);
    s.put(ps.steps);
    if (ps.buffers.size() != o.buffer_names.size())
      throw ArgumentError(ddp::detail::cat("checkpoint: optimizer state of '", ps.name, "' has ", ps.buffers.size(),
                                           " buffers for ", o.buffer_names.size(), " buffer names"));
    for (auto const& b : ps.buffers) {
      if (static_cast<std::int64_t>(b.size()) != optim::detail::numel_of(ps.shape))
        throw ArgumentError(ddp::detail::cat("checkpoint: optimizer state of '", ps.name, "' has a buffer of ",
                                             b.size(), " values for shape ", shape_string(ps.shape)));
      s.put_array(std::span<T const>(b));
    }
  }
}

// LOCL's body (LocalRoundsState): string kind, i64 replicas, i64 steps, i64 syncs, i64 bytes, u32 p, p × (string name,
// i64 numel), u32 r, r × (the p parameters' values, optimizer state as in OPTM), u32 k (0 or p) and the kept copy's
// p value arrays, u32 m (0 or p) and the outer momentum's.
template <class T>
void put_local_state(ByteWriter& s, LocalRoundsState<T> const& l) {
  s.put_string(l.kind);
  s.put(l.replicas);
  s.put(l.steps);
  s.put(l.syncs);
  s.put(l.bytes);
  s.put(static_cast<std::uint32_t>(l.names.size()));
  for (std::size_t i = 0; i < l.names.size(); ++i) {
    s.put_string(l.names[i]);
    s.put(l.numels[i]);
  }
  if (l.values.size() != l.states.size())
    throw ArgumentError(ddp::detail::cat("checkpoint: ", l.values.size(), " replicas' parameters for ", l.states.size(),
                                         " optimizer states"));
  auto put_arrays = [&](std::vector<std::vector<T>> const& arrays, char const* what) {
    if (!arrays.empty() && arrays.size() != l.names.size())
      throw ArgumentError(
          ddp::detail::cat("checkpoint: ", what, " has ", arrays.size(), " parameters for ", l.names.size()));
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      if (static_cast<std::int64_t>(arrays[i].size()) != l.numels[i])
        throw ArgumentError(ddp::detail::cat("checkpoint: ", what, "'s '", l.names[i], "' has ", arrays[i].size(),
                                             " values for ", l.numels[i]));
      s.put_array(std::span<T const>(arrays[i]));
    }
  };
  s.put(static_cast<std::uint32_t>(l.values.size()));
  for (std::size_t r = 0; r < l.values.size(); ++r) {
    if (l.values[r].size() != l.names.size())
      throw ArgumentError(
          ddp::detail::cat("checkpoint: replica ", r, " has ", l.values[r].size(), " parameters for ", l.names.size()));
    put_arrays(l.values[r], "a replica");
    put_optimizer_state(s, l.states[r]);
  }
  for (auto const* arrays : {&l.kept, &l.momentum}) {
    s.put(static_cast<std::uint32_t>(arrays->size()));
    put_arrays(*arrays, arrays == &l.kept ? "the kept copy" : "the outer momentum");
  }
}

// OPTM's body (put_optimizer_state), every count and length checked.
template <class T>
optim::OptimizerState<T> get_optimizer_state(ByteReader& s) {
  optim::OptimizerState<T> o;
  o.kind = s.get_string();
  o.lr = s.get<double>();
  if (!std::isfinite(o.lr) || o.lr < 0 || o.lr > kCheckpointMaxLr)
    s.fail("lr = ", o.lr, " is not a learning rate (must be finite, >= 0 and <= ", kCheckpointMaxLr, ")");
  auto const nb = s.get<std::uint32_t>();
  if (nb > kCheckpointMaxStateBuffers)
    s.fail(nb, " state buffers per parameter (at most ", kCheckpointMaxStateBuffers, " accepted)");
  for (std::uint32_t b = 0; b < nb; ++b) o.buffer_names.push_back(s.get_string());
  auto const np = s.get<std::uint32_t>();
  s.need_elements(np, 16, "parameter count");  // each entry: a name length, a rank and its steps
  o.parameters.reserve(np);
  for (std::uint32_t i = 0; i < np; ++i) {
    optim::ParameterState<T> ps;
    ps.name = s.get_string();
    auto const what = ddp::detail::cat("optimizer state of '", ps.name, "'");
    auto const numel = get_shape(s, ps.shape, what);
    ps.steps = checked_count(s, ddp::detail::cat("steps of ", what), s.get<std::int64_t>());
    ps.buffers.resize(nb);
    for (std::uint32_t b = 0; b < nb; ++b)
      get_values(s, ps.buffers[b], numel,
                 ddp::detail::cat(what, " ", shape_string(ps.shape), " buffer '", o.buffer_names[b], "' values"));
    o.parameters.push_back(std::move(ps));
  }
  return o;
}

// LOCL's body (put_local_state), every count and length checked.
template <class T>
LocalRoundsState<T> get_local_state(ByteReader& s) {
  LocalRoundsState<T> l;
  l.kind = s.get_string();
  l.replicas = checked_count(s, "replicas", s.get<std::int64_t>(), kCheckpointMaxRanks);
  l.steps = checked_count(s, "steps", s.get<std::int64_t>());
  l.syncs = checked_count(s, "syncs", s.get<std::int64_t>());
  l.bytes = checked_count(s, "bytes", s.get<std::int64_t>());
  auto const np = s.get<std::uint32_t>();
  s.need_elements(np, 12, "the local rounds' parameter count");  // a name length and a numel each
  for (std::uint32_t i = 0; i < np; ++i) {
    l.names.push_back(s.get_string());
    l.numels.push_back(checked_count(s, ddp::detail::cat("the size of '", l.names.back(), "'"), s.get<std::int64_t>()));
  }
  auto get_arrays = [&](std::vector<std::vector<T>>& arrays, std::string const& what) {
    arrays.resize(np);
    for (std::uint32_t i = 0; i < np; ++i)
      get_values(s, arrays[i], l.numels[i], ddp::detail::cat(what, "'s '", l.names[i], "' values"));
  };
  auto const nr = checked_count(s, "the number of replicas", s.get<std::uint32_t>(), kCheckpointMaxRanks);
  if (nr == 0) s.fail("the local rounds hold no replica");
  for (std::int64_t r = 0; r < nr; ++r) {
    get_arrays(l.values.emplace_back(), ddp::detail::cat("replica ", r));
    l.states.push_back(get_optimizer_state<T>(s));
  }
  for (auto [arrays, what] : {std::pair{&l.kept, "the kept copy"}, std::pair{&l.momentum, "the outer momentum"}}) {
    auto const n = s.get<std::uint32_t>();
    if (n != 0 && n != np) s.fail(what, " has ", n, " parameters for ", np);
    if (n != 0) get_arrays(*arrays, what);
  }
  return l;
}

}  // namespace detail

}  // namespace ddp
