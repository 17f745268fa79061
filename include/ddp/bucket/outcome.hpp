// What a reduction stage reports at the end of a round, and the options every reduction stage takes: the
// vocabulary shared by the reducers (reducer.hpp, exact_reducer.hpp) and the round stage that reads it (round.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/bucket/reducer_observer.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// What DDP does when the reduced gradients of a step hold a NaN or Inf. Every rank sees the same reduced result,
// so every rank decides alike.
enum class NonFinite {
  kIgnore,    // no check (the default, and PyTorch's): NaN/Inf reach the optimizer. A reduction that cannot carry
              // them (the exact sum of deterministic mode) raises instead.
  kRaise,     // DdpError on every rank naming the parameter(s) and, where the reduction can tell, the rank(s)
  kSkipStep,  // every rank drops the step's gradients (has_grad() false, so optimizer.step() changes nothing:
              // no parameter, momentum or step count moves); counted by skipped_steps()
};

// How this rank takes part in a round: with its gradients, or (it has joined: no data left, see
// parallel/join.hpp) with zeros and flags that say "nothing here", shadowing the others' collectives.
enum class Participation { kActive, kShadow };

// What a finished round says about each parameter (registration index), the same on every rank.
struct ReduceOutcome {
  std::vector<char> missing_somewhere;  // some rank had no gradient for it
  std::vector<char> present_somewhere;  // some rank had one (else it is unused on every rank)
  std::vector<char> non_finite;         // its reduced gradient holds NaN/Inf (checked unless NonFinite::kIgnore)
  std::vector<int> non_finite_ranks;    // ranks whose own gradients held NaN/Inf, where the reduction can tell
  bool reduced = true;                  // false: the gradients could not be reduced (non-finite values in an
                                        // exact sum) and must not be used
};

// What a reduction stage does besides reducing.
struct ReducerOptions {
  ReducerObserver* observer = nullptr;  // told of launches, completions and waits (e.g. a timeline)
  // Whether to look for NaN/Inf: each rank flags its own gradients before the reduction (so the outcome can
  // name the ranks) and the reduced ones after it (ReduceOutcome::non_finite).
  NonFinite non_finite = NonFinite::kIgnore;
  // Whether every step gives gradients to the same parameters as the first (PyTorch's static_graph). The stage
  // may then stop reading the round's bookkeeping on the host after the first step (BucketReducer: the status
  // words, which cost a copy each way per bucket on device tensors) and check it where the data lives instead.
  bool static_graph = false;
  // Under static_graph on device tensors: every this many rounds whose words stay on the device, the host waits for
  // the round once (a copy of one status word) and so reads the device's check: a desync or a changed graph is then
  // reported at most this many rounds late, even when nothing else reads the device (TrainerOptions::loss_every).
  std::int64_t static_graph_check_every = 16;
};

// What a reduction stage's finish(landed) calls as each bucket's gradients become final: landed(b) in plan order,
// while later buckets may still be in flight, until it returns false. The default lands nothing.
struct NoLanding {
  constexpr bool operator()(std::size_t) const noexcept { return true; }
};

// The wire options of a reduction stage that has none (a stage's last constructor argument; bucket/wire.hpp).
struct NoWireConfig {};

}  // namespace ddp
