// HostStaging<C>: lets a backend that takes host memory only (MpiBackend) carry device buffers, by copying each
// one through host memory around the collective. A policy the user names, so the copies are never a surprise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// A host copy of one device buffer for the duration of a collective (blocks from the host block cache).
template <class T>
class HostStage {
 public:
  HostStage() = default;
  explicit HostStage(std::size_t n)
      : n_(n), p_(static_cast<T*>(HostBlockCache::allocate(n * sizeof(T))), [n](T* p) {
          HostBlockCache::deallocate(p, n * sizeof(T));
        }) {}
  T* data() const noexcept { return p_.get(); }
  std::size_t size() const noexcept { return n_; }

 private:
  std::size_t n_ = 0;
  std::shared_ptr<T> p_;
};
}  // namespace detail

// The handle of a staged async all-reduce: the inner backend's handle plus the host copy; wait() copies the
// result back into the device buffer (once).
template <class W, class T, MemorySpace Space = DeviceSpace>
class StagedWork {
 public:
  StagedWork(W inner, detail::HostStage<T> stage, T* device)
      : inner_(std::move(inner)), stage_(std::move(stage)), device_(device) {}
  void wait() {
    inner_.wait();
    if (device_ != nullptr) {
      Kernels<Space>::from_host(static_cast<std::int64_t>(stage_.size()), stage_.data(), device_);
      device_ = nullptr;
    }
  }
  bool test() const { return inner_.test(); }

 private:
  W inner_;
  detail::HostStage<T> stage_;
  T* device_;
};

// Wraps a host-memory backend by reference (it must outlive the wrapper) and accepts device buffers too:
//   MpiBackend mpi(session);
//   HostStaging<MpiBackend> staged(mpi);
//   DistributedDataParallel ddp(device_model, staged);
// A device buffer is copied to host memory, reduced/broadcast/gathered by the inner backend, and copied back
// (two synchronous copies per collective, on top of the inner backend's cost). Where device memory is
// host-accessible (Thrust's CPU systems) nothing is copied: the inner backend works on it in place. Host
// buffers are forwarded unchanged. Results are the inner backend's, bitwise (copies do not round).
// Thread safety and ordering: the inner backend's; the async all-reduce stages on the issuing thread.
// `Device` is the space staged (DeviceSpace; another space with Kernels<Device>::to_host/from_host works too).
template <Communicator C, MemorySpace Device = DeviceSpace>
class HostStaging {
 public:
  using accepted_spaces = SpaceList<Device, HostSpace>;
  static constexpr std::string_view backend_name = "host-staging";

  explicit HostStaging(C& inner) : inner_(&inner) {}

  int rank() const { return inner_->rank(); }
  int world_size() const { return inner_->world_size(); }
  C& inner() noexcept { return *inner_; }
  std::string name() const { return std::string("host-staging over ") + std::string(C::backend_name); }

  template <detail::BufferLike B>
  void all_reduce(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = checked(detail::as_space_span(buf));
    with_host(s, Staging::kWriteBack, [&](auto h) { inner_->all_reduce(h, op, tag); });
  }
  template <detail::BufferLike B>
  requires AsyncCommunicator<C>
  auto all_reduce_async(B&& buf, ReduceOp op, CollectiveTag tag = {}) {
    auto s = checked(detail::as_space_span(buf));
    using T = std::remove_cv_t<typename decltype(s)::element_type>;
    using Space = typename decltype(s)::space;
    using W = decltype(inner_->all_reduce_async(HostSpan<T>(), op, tag));
    if constexpr (!needs_copy<Space>) {
      return StagedWork<W, T, Space>(inner_->all_reduce_async(HostSpan<T>(s.data(), s.size()), op, tag), {}, nullptr);
    } else {
      detail::HostStage<T> stage(s.size());
      Kernels<Space>::to_host(static_cast<std::int64_t>(s.size()), s.data(), stage.data());
      auto w = inner_->all_reduce_async(HostSpan<T>(stage.data(), stage.size()), op, tag);
      return StagedWork<W, T, Space>(std::move(w), std::move(stage), s.data());
    }
  }
  template <detail::BufferLike B>
  void broadcast(B&& buf, int root, CollectiveTag tag = {}) {
    auto s = checked(detail::as_space_span(buf));
    with_host(s, Staging::kWriteBack, [&](auto h) { inner_->broadcast(h, root, tag); });
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void all_gather(I&& in, O&& out, CollectiveTag tag = {}) {
    pair(in, out, [&](auto i, auto o) { inner_->all_gather(i, o, tag); });
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void reduce_scatter(I&& in, O&& out, ReduceOp op, CollectiveTag tag = {}) {
    pair(in, out, [&](auto i, auto o) { inner_->reduce_scatter(i, o, op, tag); });
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void gather(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    pair(in, out, [&](auto i, auto o) { inner_->gather(i, o, root, tag); });
  }
  template <detail::BufferLike I, detail::BufferLike O>
  void scatter(I&& in, O&& out, int root, CollectiveTag tag = {}) {
    pair(in, out, [&](auto i, auto o) { inner_->scatter(i, o, root, tag); });
  }
  void barrier(CollectiveTag tag = {}) { inner_->barrier(tag); }

 private:
  template <class Space>
  static constexpr bool needs_copy = !host_accessible_v<Space>;

  template <class S>
  static S checked(S s) {
    static_assert(accepted_spaces::template contains<typename S::space>,
                  "HostStaging carries host buffers and buffers of its Device space only");
    return s;
  }

  // Whether a staged copy goes back to the device after f ran on it.
  enum class Staging { kReadOnly, kWriteBack };
  // Runs f on a host view of s: s itself when the host can touch it, else a staged copy (copied in, and back
  // for kWriteBack).
  template <class T, class Space, class F>
  void with_host(SpaceSpan<T, Space> s, Staging staging, F&& f) {
    if constexpr (!needs_copy<Space>) {
      f(HostSpan<T>(s.data(), s.size()));
    } else {
      using U = std::remove_cv_t<T>;
      detail::HostStage<U> stage(s.size());
      Kernels<Space>::to_host(static_cast<std::int64_t>(s.size()), s.data(), stage.data());
      f(HostSpan<T>(stage.data(), stage.size()));
      if constexpr (!std::is_const_v<T>)
        if (staging == Staging::kWriteBack)
          Kernels<Space>::from_host(static_cast<std::int64_t>(s.size()), stage.data(), s.data());
    }
  }
  template <class I, class O, class F>
  void pair(I&& in, O&& out, F&& f) {
    auto i = checked(detail::as_space_span(in));
    auto o = checked(detail::as_space_span(out));
    with_host(i, Staging::kReadOnly, [&](auto hi) { with_host(o, Staging::kWriteBack, [&](auto ho) { f(hi, ho); }); });
  }

  C* inner_;
};

}  // namespace ddp
