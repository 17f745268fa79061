// DdpOptions: DistributedDataParallel's options (distributed_data_parallel.hpp), kept apart so that code that only
// configures a DDP (trainers, main jobs) reads them without the class.
#pragma once

#include <cstdint>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/reducer_observer.hpp"
#include "ddp/error.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

struct DdpOptions {
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0 before each step's forward, as PyTorch.
  bool broadcast_buffers = true;
  // Missing gradients: an error on every rank, or (true, PyTorch's find_unused_parameters) zeros (RoundOptions).
  bool find_unused_parameters = false;
  // When set, forward, backward and each bucket's reduction (launch to observed completion) are recorded.
  Timeline* timeline = nullptr;
  // NaN/Inf in the reduced gradients: ignored, an error on every rank, or the step skipped on every rank.
  NonFinite non_finite = NonFinite::kIgnore;
  // Every step gives gradients to the same parameters (PyTorch's static_graph). On device tensors, after the
  // first step the round's bookkeeping (each bucket's status words) no longer crosses to the host: a DDP step then
  // makes no synchronous copy, and a desync or a changed graph is reported at the next host read (a loss read,
  // an evaluation) on every rank instead of at once. A non-finite check keeps the host read. Host tensors and
  // deterministic mode (ExactSum) read their bookkeeping on the host regardless.
  bool static_graph = false;
  // With static_graph on device tensors: the host reads the device's check at least every this many steps (one
  // word copied back), so a desync is reported at most this many steps late even when nothing else reads the
  // device (TrainerOptions::loss_every). At least 1.
  std::int64_t static_graph_check_every = 16;
};

namespace detail {
// The reducer's options from DDP's.
inline ReducerOptions reducer_options(DdpOptions const& o, ReducerObserver* observer) {
  return {.observer = observer,
          .non_finite = o.non_finite,
          .static_graph = o.static_graph,
          .static_graph_check_every = o.static_graph_check_every};
}

// ArgumentError naming the option that is out of range.
inline void check_options(DdpOptions const& o) {
  if (o.static_graph_check_every < 1)
    throw ArgumentError(cat("DistributedDataParallel: DdpOptions::static_graph_check_every must be at least 1, got ",
                            o.static_graph_check_every));
}
}  // namespace detail

}  // namespace ddp
