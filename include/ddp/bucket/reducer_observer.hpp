// ReducerObserver: what a BucketReducer reports while it works (bucket launched, bucket complete, waiting),
// and TimelineObserver, which turns those events and the step's phases into Timeline spans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/trace/timeline.hpp"

namespace ddp {

// Called on the rank's thread. A reducer with an observer also polls its buckets whenever a parameter
// becomes ready, so on_complete comes as soon as completion is visible; without one it never polls.
class ReducerObserver {
 public:
  virtual ~ReducerObserver() = default;
  virtual void on_launch(std::size_t /*bucket*/) {}
  // `bytes`: what this rank sent for the bucket in this round, over all of its collectives, in the wire type.
  virtual void on_complete(std::size_t /*bucket*/, std::int64_t /*bytes*/) {}
  virtual void on_wait_begin() {}  // backward is over; waiting for the buckets still in flight
  virtual void on_wait_end() {}
};

// Records "forward", "backward" (end of forward to end of backward), "wait for all-reduce" and one
// "all_reduce bucket b (N bytes)" span per bucket (launch to observed completion, on the comm lane).
class TimelineObserver final : public ReducerObserver {
 public:
  explicit TimelineObserver(Timeline& t) : t_(&t) {}
  void forward(Timeline::clock::time_point begin, Timeline::clock::time_point end) {
    t_->add("forward", "step", begin, end);
    backward_start_ = end;
  }
  void on_launch(std::size_t b) override {
    if (b >= launched_at_.size()) launched_at_.resize(b + 1);
    launched_at_[b] = Timeline::clock::now();
  }
  void on_complete(std::size_t b, std::int64_t bytes) override {
    t_->add(detail::cat("all_reduce bucket ", b, " (", bytes, " bytes)"), "comm", launched_at_[b],
            Timeline::clock::now(), Timeline::kComm);
  }
  void on_wait_begin() override {
    wait_start_ = Timeline::clock::now();
    t_->add("backward", "step", backward_start_, wait_start_);
  }
  void on_wait_end() override { t_->add("wait for all-reduce", "step", wait_start_, Timeline::clock::now()); }

 private:
  Timeline* t_;
  std::vector<Timeline::clock::time_point> launched_at_;
  Timeline::clock::time_point backward_start_{}, wait_start_{};
};

}  // namespace ddp
