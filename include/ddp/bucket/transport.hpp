// BucketTransport: how BucketReducer's buckets travel. For bucket b it asks the wire (bucket/wire.hpp) for its
// collectives, appends the bucket's status words (bucket/status_words.hpp) to the first one and brings them back
// before the wire unpacks, launches the collectives on the communicator and waits for them in bucket order. So a
// wire sees gradients only, and the reducer (reducer.hpp) only says which bucket goes when.
//
// The status words sit in the arena right after each bucket's gradients, in T. A wire that reduces the gradients in
// place (value_type T, the piece over the gradients themselves) carries them in the same span; any other wire packs
// into a buffer the transport lends it (buffer_numel(b) elements of value_type, plus room for the words after them),
// and the words are copied (or cast to value_type, exact: they are small integers) after what it packed. A first
// collective summed with kSum brings them back scaled by 1 / world, so that they read as after kAvg.
// On one rank nothing travels: launch() leaves the bucket as it is and tells no observer.
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/reducer_observer.hpp"
#include "ddp/bucket/wire.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::detail {

// Where bucket b lives in the arena: `numel` gradients at `grads`, then `status` status words.
template <class T>
struct BucketSlot {
  T* grads = nullptr;
  std::int64_t numel = 0, status = 0;
  T* tail() const noexcept { return grads + numel; }
};

template <class T, MemorySpace S, AsyncCommunicator C, class Wire>
class BucketTransport {
  using V = typename Wire::value_type;
  using piece_t = WirePiece<V, S>;
  using work_t =
      decltype(std::declval<C&>().all_reduce_async(std::declval<SpaceSpan<V, S>>(), ReduceOp::kAvg, CollectiveTag{}));

 public:
  BucketTransport(C& comm, std::vector<WireBucket> layout, std::vector<BucketSlot<T>> slots, typename Wire::config cfg,
                  ReducerObserver* observer)
      : comm_(&comm),
        world_(comm.world_size()),
        slots_(std::move(slots)),
        wire_(std::move(layout), world_, cfg),
        observer_(observer) {
    std::size_t const nb = slots_.size();
    std::int64_t total = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      buffer_at_.push_back(total);
      total += static_cast<std::int64_t>(wire_.buffer_numel(b)) + slots_[b].status;
    }
    buffer_at_.push_back(total);
    if (world_ > 1) buffers_ = SpaceAllocator<S>::template allocate<V>(static_cast<std::size_t>(total));
    works_.resize(nb);
    first_.resize(nb);
    sent_.assign(nb, 0);
    completed_.assign(nb, 1);
  }
  BucketTransport(BucketTransport const&) = delete;
  BucketTransport& operator=(BucketTransport const&) = delete;
  ~BucketTransport() { abandon(); }

  Wire& wire() noexcept { return wire_; }
  Wire const& wire() const noexcept { return wire_; }
  // Bytes one rank sends per round: the wire's, and the status words in its value_type (none on one rank).
  std::int64_t bytes() const noexcept {
    if (world_ == 1) return 0;
    std::int64_t words = 0;
    for (auto const& s : slots_) words += s.status;
    return wire_.bytes() + words * static_cast<std::int64_t>(sizeof(V));
  }

  // Launches bucket b's first collective, whose status words are written. `here`: on this thread, after every
  // bucket launched before it (the round's last bucket, when nothing is left to overlap with).
  void launch(std::size_t b, Participation part, bool here) {
    if (world_ == 1) return;
    completed_[b] = 0;
    if (observer_) observer_->on_launch(b);
    piece_t const piece = with_status(b, wire_.pack(b, slots_[b].grads, part, buffer(b)));
    sent_[b] = bytes_of(piece);
    if (!here) {
      works_[b].emplace(comm_->all_reduce_async(piece.span, piece.op, tag(piece, b)));
      return;
    }
    wait_all();
    for (std::optional next = piece; next;) {
      comm_->all_reduce(next->span, next->op, tag(*next, b));
      if ((next = unpack(b))) sent_[b] += bytes_of(*next);
    }
    note_complete(b);
  }

  // Waits for every launched bucket in order, launching the next collective of a bucket whose wire needs another
  // (in bucket order on every rank, so ranks stay matched), until none is in flight; rethrows the first failure
  // after all have finished.
  void wait_all() {
    std::exception_ptr err;
    for (bool again = true; again;) {
      again = false;
      for (std::size_t b = 0; b < works_.size(); ++b) {
        if (!works_[b]) continue;
        if (advance(b, err))
          again = true;
        else
          note_complete(b);
      }
    }
    if (err) std::rethrow_exception(err);
  }

  // Waits for bucket b alone, with the rest of its wire's collectives (launched and waited one at a time); the
  // first failure is kept in `err` and the bucket counts as finished.
  void wait_one(std::size_t b, std::exception_ptr& err) {
    while (works_[b] && advance(b, err)) {}
    note_complete(b);
  }

  // Observer only: buckets [0, launched) whose completion is now visible count as complete.
  void poll(std::size_t launched) {
    if constexpr (Wire::single_collective)
      if (observer_)
        for (std::size_t b = 0; b < launched; ++b)
          if (works_[b] && !completed_[b] && works_[b]->test()) note_complete(b);
  }
  // Backward is over; waiting for the buckets still in flight (the observer's span), and its end.
  void wait_begins() {
    if (observer_ && world_ > 1) observer_->on_wait_begin();
  }
  void wait_ends() {
    if (observer_ && world_ > 1) observer_->on_wait_end();
  }

  // Lets anything in flight complete, swallowing errors (a round that is being dropped). No-throw.
  void abandon() noexcept {
    for (auto& w : works_) {
      if (!w) continue;
      try {
        w->wait();
      } catch (...) {}
      w.reset();
    }
  }

 private:
  // How bucket b's first collective went: its operation, and where its status words travelled (nullptr: in place).
  struct First {
    ReduceOp op = ReduceOp::kAvg;
    V* words = nullptr;
    bool back = true;  // the words are back in the arena
  };

  SpaceSpan<V, S> buffer(std::size_t b) const noexcept {
    return {buffers_.get() + buffer_at_[b],
            static_cast<std::size_t>(buffer_at_[b + 1] - buffer_at_[b] - slots_[b].status)};
  }
  static CollectiveTag tag(piece_t const& p, std::size_t b) noexcept {
    return CollectiveTag{p.label, static_cast<std::int64_t>(b)};
  }
  static std::int64_t bytes_of(piece_t const& p) noexcept {
    return static_cast<std::int64_t>(p.span.size() * sizeof(V));
  }

  // The wire's first piece of bucket b with the status words after it.
  piece_t with_status(std::size_t b, piece_t p) {
    auto const& s = slots_[b];
    if (p.op != ReduceOp::kAvg && p.op != ReduceOp::kSum)
      throw ArgumentError(cat("BucketReducer: the wire's first collective of bucket ", b, " is ", name(p.op),
                              "; it must be kAvg or kSum (the status words ride in it)"));
    SpaceSpan<V, S> const lent = buffer(b);
    First& f = first_[b];
    f = First{.op = p.op, .words = nullptr, .back = false};
    if (p.span.data() == lent.data() && p.span.size() <= lent.size()) {
      f.words = lent.data() + p.span.size();
      if constexpr (std::same_as<V, T>)
        Kernels<S>::copy(s.status, s.tail(), f.words);
      else
        Kernels<S>::cast(s.status, 1.0f, s.tail(), f.words);
      return {SpaceSpan<V, S>(lent.data(), p.span.size() + static_cast<std::size_t>(s.status)), p.op, p.label};
    }
    if constexpr (std::same_as<V, T>)
      if (p.span.data() == s.grads && p.span.size() == static_cast<std::size_t>(s.numel))
        return {SpaceSpan<V, S>(s.grads, static_cast<std::size_t>(s.numel + s.status)), p.op, p.label};
    throw ArgumentError(cat("BucketReducer: the wire's first collective of bucket ", b, " (", p.span.size(),
                            " elements) is neither the bucket's ", s.numel, " gradients in place nor within the ",
                            lent.size(), " elements of the buffer lent to pack()"));
  }

  // The status words back in the arena (as after kAvg), then the wire's unpack of what arrived.
  std::optional<piece_t> unpack(std::size_t b) {
    auto const& s = slots_[b];
    First& f = first_[b];
    if (!f.back) {
      f.back = true;
      float const scale = f.op == ReduceOp::kSum ? 1.0f / static_cast<float>(world_) : 1.0f;
      if constexpr (std::same_as<V, T>) {
        T const* const from = f.words ? f.words : s.tail();
        if (scale != 1.0f)
          Kernels<S>::axpby(s.status, T(scale), from, T(0), s.tail());
        else
          Kernels<S>::copy(s.status, from, s.tail());
      } else {
        Kernels<S>::cast(s.status, scale, f.words, s.tail());
      }
    }
    return wire_.unpack(b, s.grads, buffer(b));
  }

  // Waits for bucket b's collective in flight and, unless a failure was seen (kept in `err`, first one only),
  // launches the next one its wire asks for. Returns whether one was launched.
  bool advance(std::size_t b, std::exception_ptr& err) {
    auto& w = works_[b];
    try {
      w->wait();
      w.reset();
      if (!err)
        if (auto const next = unpack(b)) {
          sent_[b] += bytes_of(*next);
          w.emplace(comm_->all_reduce_async(next->span, next->op, tag(*next, b)));
          return true;
        }
    } catch (...) {
      if (!err) err = std::current_exception();
      w.reset();
    }
    return false;
  }

  // A bucket counts as complete when its completion is first seen (a wire with more than one collective per bucket
  // is complete only once its last is).
  void note_complete(std::size_t b) {
    if (completed_[b]) return;
    completed_[b] = 1;
    if (observer_) observer_->on_complete(b, sent_[b]);
  }

  C* comm_;
  int world_;
  std::vector<BucketSlot<T>> slots_;
  Wire wire_;
  ReducerObserver* observer_;
  std::vector<std::int64_t> buffer_at_;  // bucket b's lent buffer (and room for its words) in buffers_
  std::shared_ptr<V[]> buffers_;
  std::vector<std::optional<work_t>> works_;
  std::vector<First> first_;
  std::vector<std::int64_t> sent_;  // bytes launched per bucket this round
  std::vector<char> completed_;
};

}  // namespace ddp::detail
