// The seam between DistributedDataParallel and an optimizer that updates each bucket as its reduction lands
// (parallel/overlapped_update.hpp): DDP tells an attached hook which arena elements have their step's final
// gradients; the optimizer attaches and detaches itself through UpdateAccess.
#pragma once

#include <cstdint>

namespace ddp::detail {

// Implemented by OverlappedOptimizer: called on the rank's thread at the end of a round's backward, once per
// bucket in plan order, as soon as the gradients of arena elements [begin, end) (one bucket's whole parameters)
// are reduced and agreed on, while later buckets may still be in flight.
class UpdateHook {
 public:
  virtual void on_bucket_reduced(std::int64_t begin, std::int64_t end) = 0;

 protected:
  ~UpdateHook() = default;
};

struct UpdateAccess;  // overlapped_update.hpp's way in: attach or detach a hook
struct OwnerAccess;   // zero_redundancy.hpp's way in under OwnerReduce: attach or detach the reducing optimizer

}  // namespace ddp::detail
