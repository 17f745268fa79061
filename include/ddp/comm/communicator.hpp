// The Communicator and AsyncCommunicator concepts, ReduceOp, element types, collective tags and the
// compile-time memory-space check every backend shares.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/tensor/half.hpp"
#include "ddp/tensor/memory_space.hpp"
#include "ddp/tensor/space_span.hpp"

namespace ddp {

// Reductions every backend implements. kAvg is the sum divided by the world size (integer division for
// integer types); backends that can fold the scale into the reduction pass do (ThreadsBackend, NCCL).
enum class ReduceOp { kSum, kAvg, kMax, kMin };

constexpr std::string_view name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

// Element types collectives move: float, double, int32 and int64 (what MPI and NCCL share), and the 16-bit floats
// bfloat16 and float16 (tensor/half.hpp) that compressed gradient buckets travel in. How a backend adds 16-bit
// floats: the threads backend and MPI's shared-memory all-reduce sum every rank's values in float and round once;
// MPI_Allreduce (across nodes, or with NodeAllReduce::kMpi) and NCCL add pairwise, rounding after each addition.
enum class Dtype { kFloat32, kFloat64, kInt32, kInt64, kBFloat16, kFloat16 };

template <class T>
concept CommElement = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || HalfFloat<T>;

template <CommElement T>
inline constexpr Dtype dtype_of = std::same_as<T, float>          ? Dtype::kFloat32
                                  : std::same_as<T, double>       ? Dtype::kFloat64
                                  : std::same_as<T, std::int32_t> ? Dtype::kInt32
                                  : std::same_as<T, std::int64_t> ? Dtype::kInt64
                                  : std::same_as<T, bfloat16>     ? Dtype::kBFloat16
                                                                  : Dtype::kFloat16;

constexpr std::string_view name(Dtype t) noexcept {
  switch (t) {
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kFloat64:
      return "float64";
    case Dtype::kInt32:
      return "int32";
    case Dtype::kInt64:
      return "int64";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat16:
      return "float16";
  }
  return "?";
}

// Bytes of one element of type t.
constexpr std::size_t size_of(Dtype t) noexcept {
  switch (t) {
    case Dtype::kFloat64:
    case Dtype::kInt64:
      return 8;
    case Dtype::kBFloat16:
    case Dtype::kFloat16:
      return 2;
    default:
      return 4;
  }
}

// The collectives, for errors and traces.
enum class CollectiveKind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kGather, kScatter, kBarrier };

constexpr std::string_view name(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

// An optional label carried by a collective into traces and error messages, e.g. {"bucket", 3}. Trivially
// copyable and allocation-free; `label` must outlive the collective (string literals do).
struct CollectiveTag {
  std::string_view label{};
  std::int64_t id = -1;
  constexpr bool empty() const noexcept { return label.empty() && id < 0; }
};

// A handle to asynchronous work: wait() blocks until done and rethrows its error; test() polls.
template <class W>
concept WorkHandle = requires(W& w, W const& cw) {
  w.wait();
  { cw.test() } -> std::convertible_to<bool>;
};

namespace detail {
template <class L>
struct FrontSpace;
template <MemorySpace S, MemorySpace... Rest>
struct FrontSpace<SpaceList<S, Rest...>> {
  using type = S;
};
template <>
struct FrontSpace<HostAccessibleSpaces> {
  using type = HostSpace;
};
}  // namespace detail

// The memory space a backend's buffers naturally live in: the first of its accepted_spaces.
template <class C>
using native_space_t = typename detail::FrontSpace<typename C::accepted_spaces>::type;

namespace detail {

// Checks one collective signature for element type T in the backend's native space.
template <class C, class T>
concept CollectivesFor = requires(C& c, SpaceSpan<T, native_space_t<C>> buf, SpaceSpan<T const, native_space_t<C>> in,
                                  ReduceOp op, int root, CollectiveTag tag) {
  c.all_reduce(buf, op);
  c.all_reduce(buf, op, tag);
  c.broadcast(buf, root);
  c.broadcast(buf, root, tag);
  c.all_gather(in, buf);
  c.all_gather(in, buf, tag);
  c.reduce_scatter(in, buf, op);
  c.reduce_scatter(in, buf, op, tag);
  c.gather(in, buf, root);
  c.gather(in, buf, root, tag);
  c.scatter(in, buf, root);
  c.scatter(in, buf, root, tag);
};

template <class C, class T>
concept AsyncCollectivesFor = requires(C& c, SpaceSpan<T, native_space_t<C>> buf, ReduceOp op, CollectiveTag tag) {
  { c.all_reduce_async(buf, op) } -> WorkHandle;
  { c.all_reduce_async(buf, op, tag) } -> WorkHandle;
};

}  // namespace detail

// A backend: rank()/world_size() plus the collectives below for float, double, int32 and int64 spans of its
// accepted memory space (ddp's backends also take bfloat16 and float16: HalfCommunicator). Collective calls are
// blocking and must be issued in the same order, with the same counts and roots, on every rank.
//   all_reduce(buf, op)          in place; buf has the same size on every rank
//   broadcast(buf, root)         in place; root's contents to every rank
//   all_gather(in, out)          out.size() == world_size * in.size(); rank r's block at offset r * in.size()
//   reduce_scatter(in, out, op)  in.size() == world_size * out.size(); rank r gets the reduced block r
//   gather(in, out, root)        like all_gather, only root's out is written (other ranks may pass empty)
//   scatter(in, out, root)       root's in holds world_size blocks of out.size(); others may pass empty in
//   barrier()
template <class C>
concept Communicator = requires(C& c, C const& cc) {
  typename C::accepted_spaces;
  { cc.rank() } -> std::same_as<int>;
  { cc.world_size() } -> std::same_as<int>;
  c.barrier();
}
&&detail::CollectivesFor<C, float>&& detail::CollectivesFor<C, double>&& detail::CollectivesFor<C, std::int32_t>&&
    detail::CollectivesFor<C, std::int64_t>;

// A Communicator whose all-reduce can also run asynchronously: all_reduce_async returns a WorkHandle at
// once; the work runs in issue order on the rank's progress engine (thread or stream), so ranks issuing
// the same sequence never cross. The buffer must stay alive and untouched until wait() returns.
template <class C>
concept AsyncCommunicator =
    Communicator<C> && detail::AsyncCollectivesFor<C, float> && detail::AsyncCollectivesFor<C, double> &&
    detail::AsyncCollectivesFor<C, std::int32_t> && detail::AsyncCollectivesFor<C, std::int64_t>;

// An AsyncCommunicator that also moves the 16-bit floats (compressed gradient buckets): every ddp backend, through
// the shared front end (comm/detail/front_end.hpp).
template <class C>
concept HalfCommunicator =
    AsyncCommunicator<C> && detail::CollectivesFor<C, bfloat16> && detail::CollectivesFor<C, float16> &&
    detail::AsyncCollectivesFor<C, bfloat16> && detail::AsyncCollectivesFor<C, float16>;

// A Communicator whose ranks come in nodes, that all-reduces among the ranks of one node only: node_all_reduce(buf,
// op, tag), host memory; ranks_per_node() (this rank's node). MpiBackend (MPI_COMM_TYPE_SHARED, or
// MpiNodeOptions::ranks_per_node) and ThreadsBackend (one node, or ThreadsOptions::ranks_per_node) are; hierarchical
// averaging needs it (LocalSgdOptions::node_period). Every rank calls node_all_reduce at once, each with its node.
template <class C>
concept NodeCommunicator = Communicator<C> && requires(C& c, std::span<float> f, std::span<double> d) {
  { c.ranks_per_node() } -> std::convertible_to<int>;
  c.node_all_reduce(f, ReduceOp::kAvg, CollectiveTag{});
  c.node_all_reduce(d, ReduceOp::kAvg, CollectiveTag{});
};

// A Communicator whose ranks share one address space (ThreadsBackend: threads of one process), so a rank may read
// and write another rank's buffers directly once it has their addresses (OwnerReduce, parallel/policies.hpp). The
// collectives still order those accesses: what a rank wrote before a collective, its peers see after it.
template <class C>
concept SharedAddressSpace = Communicator<C> && requires {
  requires C::shares_address_space;
};

namespace detail {

template <class T>
struct IsSpaceSpan : std::false_type {};
template <class T, class S>
struct IsSpaceSpan<SpaceSpan<T, S>> : std::true_type {};

// What a collective accepts as a buffer: a SpaceSpan of any space (checked later, with a message), or a
// contiguous host range (std::span, std::vector, std::array), which is host memory.
template <class R>
concept BufferLike = IsSpaceSpan<std::remove_cvref_t<R>>::value ||
    (std::ranges::contiguous_range<R>&& std::ranges::sized_range<R>);

template <class R>
constexpr auto as_space_span(R&& r) noexcept {
  if constexpr (IsSpaceSpan<std::remove_cvref_t<R>>::value) {
    return std::remove_cvref_t<R>(r);
  } else {
    using T = std::remove_reference_t<std::ranges::range_reference_t<R>>;
    return HostSpan<T>(std::ranges::data(r), std::ranges::size(r));
  }
}

template <class R>
using span_of_t = decltype(as_space_span(std::declval<R>()));

template <class R>
using element_of_t = std::remove_cv_t<typename span_of_t<R>::element_type>;

// The element check every backend shares (each backend checks the memory space itself, in a message that
// names it).
template <class S>
constexpr void check_element() {
  static_assert(CommElement<std::remove_cv_t<typename S::element_type>>,
                "ddp collectives move float, double, std::int32_t or std::int64_t elements only; convert the "
                "buffer to one of these");
}

// The (in, out) buffers of a two-buffer collective as spans of out's space: in read-only, out writable, one
// element type. Backends check both spaces before calling this.
template <class I, class O>
auto span_pair(I&& in, O&& out) {
  auto src = as_space_span(in);
  auto dst = as_space_span(out);
  check_element<decltype(src)>();
  check_element<decltype(dst)>();
  using T = std::remove_cv_t<typename decltype(dst)::element_type>;
  using Space = typename decltype(dst)::space;
  static_assert(std::same_as<std::remove_cv_t<typename decltype(src)::element_type>, T>,
                "in and out of a collective must have the same element type");
  static_assert(!std::is_const_v<typename decltype(dst)::element_type>, "the out buffer must be writable");
  return std::pair{SpaceSpan<T const, Space>(src.data(), src.size()), SpaceSpan<T, Space>(dst.data(), dst.size())};
}

// all_reduce and broadcast write their buffer in place.
template <class S>
constexpr void check_writable() {
  static_assert(!std::is_const_v<typename S::element_type>,
                "all_reduce and broadcast work in place: pass a writable buffer, not a span of const elements");
}

}  // namespace detail

}  // namespace ddp
