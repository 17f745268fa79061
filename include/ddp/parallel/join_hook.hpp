// The seam between DistributedDataParallel and ddp::join (join.hpp): DDP asks a hook, when one is attached, what
// each round is to be; join.hpp reaches DDP's join-only members through JoinAccess.
#pragma once

namespace ddp::detail {

// What one synchronised round under ddp::join was agreed to be: where buffers come from (the lowest rank that
// still has data) and the factor on the reduced gradients.
struct JoinRound {
  int buffer_root = 0;
  double grad_scale = 1.0;
};

// Implemented by ddp::join: called by a round's first forward on a rank that still has data, before any of the
// round's collectives, to agree with the other ranks on the round.
class JoinHook {
 public:
  virtual JoinRound on_round() = 0;

 protected:
  ~JoinHook() = default;
};

struct JoinAccess;  // join.hpp's way in: attach a hook, shadow a round, broadcast the state

}  // namespace ddp::detail
