// The collective front end every backend shares, written once: buffer conversion, the memory-space and
// element-type checks, argument checks, tracing and the ordering hook. A backend supplies only its transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/progress.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

// An in-place all-reduce queued for a rank's progress thread: a few words, trivially copyable, typed by dtype.
struct AllReduceRequest {
  Dtype dtype;
  ReduceOp op;
  void* data;
  std::size_t count;
  CollectiveTag tag;
};

// Runs a queued all-reduce on the progress thread with the backend's blocking transport (run_all_reduce).
template <class Backend>
struct AllReduceExecutor {
  Backend* self;
  void operator()(AllReduceRequest const& r) const {
    auto run = [&](auto* data) {
      using T = std::remove_pointer_t<decltype(data)>;
      self->run_all_reduce(SpaceSpan<T, native_space_t<Backend>>(data, r.count), r.op, r.tag);
    };
    switch (r.dtype) {
      case Dtype::kFloat32:
        return run(static_cast<float*>(r.data));
      case Dtype::kFloat64:
        return run(static_cast<double*>(r.data));
      case Dtype::kInt32:
        return run(static_cast<std::int32_t*>(r.data));
      case Dtype::kInt64:
        return run(static_cast<std::int64_t*>(r.data));
      case Dtype::kBFloat16:
        return run(static_cast<bfloat16*>(r.data));
      case Dtype::kFloat16:
        return run(static_cast<float16*>(r.data));
    }
  }
};

// The progress queue of a backend whose async all-reduce is its blocking transport run on a worker thread.
template <class Backend>
using AllReduceQueue = ProgressQueue<AllReduceRequest, AllReduceExecutor<Backend>>;

// The public collectives of a backend (CRTP: class MyBackend : public CollectiveFrontEnd<MyBackend>). Each
// call goes: convert the buffer(s) to SpaceSpans → check the memory space and element type (compile time)
// → trace → check root and sizes (ArgumentError naming the backend, operation and rank) → the backend's
// enter() hook → the backend's transport. Nothing here allocates or copies on the success path.
//
// What the backend supplies (private is fine: befriend CollectiveFrontEnd<Backend>); T is one of
// float/double/int32/int64, S the backend's native space, in = SpaceSpan<T const, S>, out/buf = SpaceSpan<T, S>:
//   static constexpr std::string_view backend_name        errors start "ddp <backend_name>: "
//   template <class Span> static constexpr void check_space()   a static_assert naming the backend and the fix
//   int rank() const, int world_size() const
//   run_all_reduce(buf, ReduceOp, CollectiveTag)           in place
//   run_broadcast(buf, root, tag)        run_all_gather(in, out, tag)      run_reduce_scatter(in, out, op, tag)
//   run_gather(in, out, root, tag)       run_scatter(in, out, root, tag)   run_barrier(tag)
//   and for all_reduce_async, one of:
//     run_all_reduce_async(buf, op, tag) -> its work handle       (its own engine, e.g. NCCL's stream), or
//     progress_queue() -> AllReduceQueue<Backend>&                 (derived: run_all_reduce on the rank's
//                                                                   progress thread, in issue order; ddp::Work)
// Optional: enter(CollectiveKind, CollectiveTag), run before each blocking collective's transport (e.g. let
// queued async work finish so collectives stay in issue order, fail fast when the group already failed).
// Argument checks run before enter(), so a rejected call leaves queued work and peers untouched.
template <class Backend>
class CollectiveFrontEnd {
 public:
  // In place; buf has the same size on every rank.
  template <BufferLike B>
  void all_reduce(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = as_space_span(buf);
    if constexpr (accepts_inout<decltype(s)>()) {
      trace({.op = CollectiveKind::kAllReduce,
             .count = s.size(),
             .dtype = dtype_of<elem_t<decltype(s)>>,
             .reduce = op,
             .tag = tag});
      run_enter_hook(CollectiveKind::kAllReduce, tag);
      self().run_all_reduce(to_transport(s), op, tag);
    }
  }

  // Starts an in-place all-reduce and returns its handle at once (no allocation); see AsyncCommunicator.
  template <BufferLike B>
  auto all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = as_space_span(buf);
    if constexpr (accepts_inout<decltype(s)>()) {
      using T = elem_t<decltype(s)>;
      trace({.op = CollectiveKind::kAllReduce,
             .count = s.size(),
             .dtype = dtype_of<T>,
             .reduce = op,
             .tag = tag,
             .async = true});
      Backend& b = self();
      if constexpr (requires { b.run_all_reduce_async(to_transport(s), op, tag); }) {
        return b.run_all_reduce_async(to_transport(s), op, tag);
      } else {
        return b.progress_queue().submit(AllReduceRequest{dtype_of<T>, op, s.data(), s.size(), tag});
      }
    }
  }

  // In place; root's contents to every rank.
  template <BufferLike B>
  void broadcast(B&& buf, int root, CollectiveTag tag = {}) {
    auto s = as_space_span(buf);
    if constexpr (accepts_inout<decltype(s)>()) {
      trace({.op = CollectiveKind::kBroadcast,
             .count = s.size(),
             .dtype = dtype_of<elem_t<decltype(s)>>,
             .root = root,
             .tag = tag});
      check_root(root, CollectiveKind::kBroadcast);
      run_enter_hook(CollectiveKind::kBroadcast, tag);
      self().run_broadcast(to_transport(s), root, tag);
    }
  }

  // out.size() == world_size * in.size(); rank r's block at offset r * in.size().
  template <BufferLike I, BufferLike O>
  void all_gather(I&& in, O&& out, CollectiveTag tag = {}) {
    if constexpr (accepts_pair<I, O>()) {
      auto [src, dst] = span_pair(in, out);
      trace({.op = CollectiveKind::kAllGather,
             .count = src.size(),
             .dtype = dtype_of<elem_t<decltype(dst)>>,
             .tag = tag});
      check_size(dst.size(), src.size() * world(), CollectiveKind::kAllGather, "out", "world_size * in.size()");
      run_enter_hook(CollectiveKind::kAllGather, tag);
      self().run_all_gather(to_transport(src), to_transport(dst), tag);
    }
  }

  // in.size() == world_size * out.size(); rank r gets the reduced block r.
  template <BufferLike I, BufferLike O>
  void reduce_scatter(I&& in, O&& out, ReduceOp op, CollectiveTag tag = {}) {
    if constexpr (accepts_pair<I, O>()) {
      auto [src, dst] = span_pair(in, out);
      trace({.op = CollectiveKind::kReduceScatter,
             .count = src.size(),
             .dtype = dtype_of<elem_t<decltype(dst)>>,
             .reduce = op,
             .tag = tag});
      check_size(src.size(), dst.size() * world(), CollectiveKind::kReduceScatter, "in", "world_size * out.size()");
      run_enter_hook(CollectiveKind::kReduceScatter, tag);
      self().run_reduce_scatter(to_transport(src), to_transport(dst), op, tag);
    }
  }

  // Root's out receives rank r's in at offset r * in.size(); other ranks' out is not touched (may be empty).
  template <BufferLike I, BufferLike O>
  void gather(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    if constexpr (accepts_pair<I, O>()) {
      auto [src, dst] = span_pair(in, out);
      trace({.op = CollectiveKind::kGather,
             .count = src.size(),
             .dtype = dtype_of<elem_t<decltype(dst)>>,
             .root = root,
             .tag = tag});
      check_root(root, CollectiveKind::kGather);
      if (self().rank() == root) {
        check_size(dst.size(), src.size() * world(), CollectiveKind::kGather, "out", "world_size * in.size()");
      }
      run_enter_hook(CollectiveKind::kGather, tag);
      self().run_gather(to_transport(src), to_transport(dst), root, tag);
    }
  }

  // Rank r's out receives root's in at offset r * out.size(); other ranks' in is not read (may be empty).
  template <BufferLike I, BufferLike O>
  void scatter(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    if constexpr (accepts_pair<I, O>()) {
      auto [src, dst] = span_pair(in, out);
      trace({.op = CollectiveKind::kScatter,
             .count = dst.size(),
             .dtype = dtype_of<elem_t<decltype(dst)>>,
             .root = root,
             .tag = tag});
      check_root(root, CollectiveKind::kScatter);
      if (self().rank() == root) {
        check_size(src.size(), dst.size() * world(), CollectiveKind::kScatter, "in", "world_size * out.size()");
      }
      run_enter_hook(CollectiveKind::kScatter, tag);
      self().run_scatter(to_transport(src), to_transport(dst), root, tag);
    }
  }

  void barrier(CollectiveTag tag = {}) {
    trace({.op = CollectiveKind::kBarrier, .count = 0, .dtype = Dtype::kInt32, .tag = tag});
    run_enter_hook(CollectiveKind::kBarrier, tag);
    self().run_barrier(tag);
  }

 protected:
  explicit CollectiveFrontEnd(TraceOptions const& trace) noexcept : tracer_(trace) {}
  ~CollectiveFrontEnd() = default;
  CollectiveFrontEnd(CollectiveFrontEnd const&) = delete;
  CollectiveFrontEnd& operator=(CollectiveFrontEnd const&) = delete;

 private:
  template <class S>
  using elem_t = std::remove_cv_t<typename S::element_type>;

  // A buffer of a host-accessible space other than the backend's native one (DeviceSpace on Thrust's CPU
  // systems, for ThreadsBackend) reaches the transport as host memory; every other buffer as it is.
  // (Nested so that a backend's own space never asks HostAccessible: nccl.hpp may come before device.hpp.)
  template <class T, class Space>
  static constexpr auto to_transport(SpaceSpan<T, Space> s) noexcept {
    if constexpr (std::same_as<Space, native_space_t<Backend>>) {
      return s;
    } else if constexpr (host_accessible_v<Space>) {
      return SpaceSpan<T, HostSpace>(s.data(), s.size());
    } else {
      return s;
    }
  }

  Backend& self() noexcept { return static_cast<Backend&>(*this); }
  Backend const& self() const noexcept { return static_cast<Backend const&>(*this); }
  std::size_t world() const noexcept { return static_cast<std::size_t>(self().world_size()); }

  // The compile-time checks (each a static_assert with its own message); true when the transport may be
  // instantiated, so a rejected buffer yields its message and not a cascade of errors from the transport.
  template <class S>
  static constexpr bool accepts() {
    Backend::template check_space<S>();
    check_element<S>();
    return Backend::accepted_spaces::template contains<typename S::space> && CommElement<elem_t<S>>;
  }
  template <class S>
  static constexpr bool accepts_inout() {
    constexpr bool ok = accepts<S>();
    check_writable<S>();
    return ok && !std::is_const_v<typename S::element_type>;
  }
  template <class I, class O>
  static constexpr bool accepts_pair() {
    return accepts<span_of_t<I>>() && accepts<span_of_t<O>>();
  }

  // The backend's enter(), when it has one. Named apart from it: were this called enter() too, the
  // requires-expression below would find this very function in a backend without its own hook, and every
  // blocking collective would recurse forever (NcclBackend did, compiled to a `jmp .`).
  void run_enter_hook(CollectiveKind kind, CollectiveTag tag) {
    Backend& b = self();
    if constexpr (requires { b.enter(kind, tag); }) b.enter(kind, tag);
  }

  // Hands `r` (its rank filled in) to the tracer, when tracing is on.
  void trace(CollectiveRecord r) const noexcept {
    if (!tracer_.enabled()) return;
    r.rank = self().rank();
    tracer_(r);
  }

  void check_root(int root, CollectiveKind kind) const {
    int const n = self().world_size();
    if (root < 0 || root >= n) {
      throw ArgumentError(cat("ddp ", Backend::backend_name, ": ", name(kind), " on rank ", self().rank(), ": root ",
                              root, " is outside [0, ", n, ")"));
    }
  }
  void check_size(std::size_t got, std::size_t want, CollectiveKind kind, char const* what, char const* rule) const {
    if (got != want) {
      throw ArgumentError(cat("ddp ", Backend::backend_name, ": ", name(kind), " on rank ", self().rank(), ": ", what,
                              ".size() is ", got, " but must be ", rule, " = ", want));
    }
  }

  Tracer tracer_;
};

}  // namespace ddp::detail
