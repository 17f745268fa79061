// The Optimizer concept, the state every optimizer can save and restore, and the walk over the arena
// that groups parameters into runs for one fused pass each.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::optim {

// Everything needed to resume an optimizer exactly: its kind, learning rate, per-parameter counters
// (steps taken / momentum initialised) and named flat buffers in arena layout (momentum, exp_avg, ...).
template <class T>
struct OptimizerState {
  std::string kind;
  double lr = 0;
  std::vector<std::int64_t> counters;  // one per parameter, registration order
  struct Buffer {
    std::string name;
    std::vector<T> data;  // arena layout, numel() elements
  };
  std::vector<Buffer> buffers;
};

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
// Calls f(first, last, offset, numel) for each maximal run of parameters (entries first..last) that are contiguous in the
// arena, have a gradient, and share the same counter value. Parameters without a gradient are skipped
// (PyTorch skips params whose .grad is None). Usually this is a single run over the whole arena.
template <class T, MemorySpace S, class F>
void for_each_run(nn::ParameterArena<T, S> const& arena, std::vector<std::int64_t> const& counters, F&& f) {
  auto const& es = arena.entries();
  std::size_t i = es.size();
  while (i > 0) {  // reverse registration order = ascending arena offset
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
    f(k, j, off, n);
    i = k;
  }
}

// A flat state buffer copied to host memory (for OptimizerState).
template <class T, MemorySpace S>
std::vector<T> host_vector(Tensor<T, S> const& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  Kernels<S>::to_host(t.numel(), t.data(), v.data());
  return v;
}

template <class T>
void check_state(OptimizerState<T> const& st, std::string const& kind, std::size_t nparams, std::int64_t numel,
                 std::vector<std::string> const& buffer_names) {
  if (st.kind != kind) throw ArgumentError(ddp::detail::cat("optimizer state is for '", st.kind, "', not '", kind, "'"));
  if (st.counters.size() != nparams)
    throw ArgumentError(ddp::detail::cat(kind, " state has ", st.counters.size(), " parameters, the model has ", nparams));
  if (st.buffers.size() != buffer_names.size())
    throw ArgumentError(ddp::detail::cat(kind, " state has ", st.buffers.size(), " buffers, expected ", buffer_names.size()));
  for (std::size_t b = 0; b < buffer_names.size(); ++b) {
    if (st.buffers[b].name != buffer_names[b])
      throw ArgumentError(ddp::detail::cat(kind, " state buffer ", b, " is '", st.buffers[b].name, "', expected '", buffer_names[b], "'"));
    if (static_cast<std::int64_t>(st.buffers[b].data.size()) != numel)
      throw ArgumentError(ddp::detail::cat(kind, " state buffer '", buffer_names[b], "' has ", st.buffers[b].data.size(),
                                      " elements, the model has ", numel));
  }
}
}  // namespace detail

}  // namespace ddp::optim
