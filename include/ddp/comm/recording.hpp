// Recording<C>: a Communicator decorator that logs every collective it forwards (rank, op, count, dtype,
// tag) so tests can prove dispatch, e.g. one all-reduce per bucket in the same order on every rank.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/trace.hpp"

namespace ddp {

// Wraps a backend by reference (it must outlive the wrapper). Satisfies Communicator, and AsyncCommunicator
// when C does. Records are appended on the issuing thread, in issue order. Not for hot paths: each record is
// a vector push_back.
template <Communicator C>
class Recording {
 public:
  using accepted_spaces = typename C::accepted_spaces;

  explicit Recording(C& inner) : inner_(&inner) {}

  int rank() const { return inner_->rank(); }
  int world_size() const { return inner_->world_size(); }
  C& inner() noexcept { return *inner_; }
  std::vector<CollectiveRecord> const& records() const noexcept { return records_; }
  void clear() noexcept { records_.clear(); }

  template <detail::BufferLike B>
  void all_reduce(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    record(CollectiveKind::kAllReduce, s, op, -1, tag, false);
    inner_->all_reduce(s, op, tag);
  }
  template <detail::BufferLike B>
  requires AsyncCommunicator<C>
  auto all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    record(CollectiveKind::kAllReduce, s, op, -1, tag, true);
    return inner_->all_reduce_async(s, op, tag);
  }
  template <detail::BufferLike B>
  void broadcast(B&& buf, int root, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(buf);
    record(CollectiveKind::kBroadcast, s, ReduceOp::kSum, root, tag, false);
    inner_->broadcast(s, root, tag);
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void all_gather(I&& in, O&& out, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(in);
    record(CollectiveKind::kAllGather, s, ReduceOp::kSum, -1, tag, false);
    inner_->all_gather(s, detail::as_space_span(out), tag);
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void reduce_scatter(I&& in, O&& out, ReduceOp op, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(in);
    record(CollectiveKind::kReduceScatter, s, op, -1, tag, false);
    inner_->reduce_scatter(s, detail::as_space_span(out), op, tag);
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void gather(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    auto s = detail::as_space_span(in);
    record(CollectiveKind::kGather, s, ReduceOp::kSum, root, tag, false);
    inner_->gather(s, detail::as_space_span(out), root, tag);
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void scatter(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    auto o = detail::as_space_span(out);
    record(CollectiveKind::kScatter, o, ReduceOp::kSum, root, tag, false);
    inner_->scatter(detail::as_space_span(in), o, root, tag);
  }
  void barrier(CollectiveTag tag = {}) {
    records_.push_back(
        CollectiveRecord{rank(), CollectiveKind::kBarrier, 0, Dtype::kInt32, ReduceOp::kSum, -1, tag, false});
    inner_->barrier(tag);
  }

 private:
  template <class S>
  void record(CollectiveKind kind, S const& s, ReduceOp op, int root, CollectiveTag tag, bool async) {
    using T = std::remove_cv_t<typename S::element_type>;
    if constexpr (CommElement<T>) {  // otherwise the inner backend's static_assert explains
      records_.push_back(CollectiveRecord{rank(), kind, s.size(), dtype_of<T>, op, root, tag, async});
    }
  }

  C* inner_;
  std::vector<CollectiveRecord> records_;
};

}  // namespace ddp
