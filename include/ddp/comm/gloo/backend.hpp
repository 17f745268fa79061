// GlooBackend: collectives over Gloo's TCP transport (Debian's libgloo, the engine PyTorch uses for CPU
// collectives): a job launched by torchrun, srun or by hand runs on nothing but TCP, with no MPI. Blocking
// collectives run on the caller's thread and async all-reduces on a per-rank progress thread, in issue order
// (one Gloo context, one collective at a time). Include <ddp/comm/gloo.hpp> and depend on //:ddp_gloo.
#pragma once

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/call_record.hpp"
#include "ddp/comm/detail/front_end.hpp"
#include "ddp/comm/detail/progress.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/rendezvous/rendezvous.hpp"
#include "ddp/comm/rendezvous/store_peer_record.hpp"
#include "ddp/comm/trace.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp {

struct GlooOptions {
  // Where this rank listens for its peers: a network interface ("eth0"; default $GLOO_SOCKET_IFNAME, as in
  // PyTorch), else an address or host name. Both empty: the local address that routes to MASTER_ADDR, or the
  // host name's address when the store is a file.
  std::string iface{};
  std::string hostname{};
  // Async collectives in flight before all_reduce_async blocks.
  std::size_t queue_capacity = 1024;
  // Each collective's deadline (default: $DDP_TIMEOUT seconds, else 10 minutes). Gloo's TCP pairs wait at most
  // this long for a peer; a closed connection (a killed peer) fails at once.
  TimeoutOptions timeout{};
  TraceOptions trace{};
};

namespace detail {

// Gloo's rendezvous store, over a ddp Store (keys under "gloo/").
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(ddp::Store& store, std::chrono::milliseconds timeout) : store_(&store), timeout_(timeout) {}
  void set(std::string const& key, std::vector<char> const& data) override { store_->set("gloo/" + key, data); }
  std::vector<char> get(std::string const& key) override { return store_->get("gloo/" + key, timeout_); }
  void wait(std::vector<std::string> const& keys) override { wait(keys, timeout_); }
  void wait(std::vector<std::string> const& keys, std::chrono::milliseconds const& timeout) override {
    for (auto const& k : keys) store_->get("gloo/" + k, timeout);
  }

 private:
  ddp::Store* store_;
  std::chrono::milliseconds timeout_;
};

// The local address this host uses to reach `host` (a UDP "connect" sends nothing), or "" if unknown.
inline std::string local_address_towards(std::string const& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return {};
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> hold(res, ::freeaddrinfo);
  Fd fd(::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd || ::connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return {};
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) return {};
  char buf[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return buf;
}

// Gloo's element-wise reduction for T and op (kAvg sums; the backend divides after).
template <class T>
::gloo::AllreduceOptions::Func gloo_reduction(ReduceOp op) {
  auto make = [](auto tag) -> ::gloo::AllreduceOptions::Func {
    using Op = decltype(tag);
    return [](void* out, void const* a, void const* b, std::size_t n) {
      auto* o = static_cast<T*>(out);
      auto const* x = static_cast<T const*>(a);
      auto const* y = static_cast<T const*>(b);
      for (std::size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
    };
  };
  switch (op) {
    case ReduceOp::kMax:
      return make(MaxOp{});
    case ReduceOp::kMin:
      return make(MinOp{});
    default:
      return make(PlusOp{});
  }
}

// Warns once per collective that has run longer than the stall warning (TimeoutOptions::warn_fraction of the
// timeout): Gloo blocks inside its algorithms, so a thread of its own watches the clock. begin() and end() bracket
// one collective (one at a time); begin() copies a fixed-size record and the text is made only for a warning.
class GlooStallWatch {
 public:
  GlooStallWatch(Deadlines d, int rank, int world_size) : d_(std::move(d)), rank_(rank), n_(world_size) {
    if (d_.warn.count() > 0) thread_ = std::thread([this] { watch(); });
  }
  GlooStallWatch(GlooStallWatch const&) = delete;
  GlooStallWatch& operator=(GlooStallWatch const&) = delete;
  ~GlooStallWatch() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void begin(CallRecord const& call) {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      call_ = call;
      since_ = std::chrono::steady_clock::now();
      ++generation_;
      running_ = true;
    }
    cv_.notify_all();
  }
  void end() {
    if (!thread_.joinable()) return;
    std::lock_guard lock(mu_);
    running_ = false;
  }

 private:
  void watch() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (!running_) {
        cv_.wait(lock, [&] { return stop_ || running_; });
        continue;
      }
      std::uint64_t const gen = generation_;
      auto const at = since_ + d_.warn;
      if (cv_.wait_until(lock, at, [&] { return stop_ || generation_ != gen || !running_; })) {
        if (!running_ && generation_ == gen) cv_.wait(lock, [&] { return stop_ || generation_ != gen; });
        continue;
      }
      std::string const msg = stall_warning("gloo", describe(call_), rank_, n_, d_, " for its peers");
      lock.unlock();
      d_.warn_stall(msg);
      lock.lock();
      cv_.wait(lock, [&] { return stop_ || generation_ != gen; });  // once per collective
    }
  }

  Deadlines d_;
  int rank_;
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  CallRecord call_{};
  std::chrono::steady_clock::time_point since_{};
  std::uint64_t generation_ = 0;
  bool running_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace detail

// Guarantees: every rank gets the same bits (Gloo's ring all-reduce sends the reduced chunks to every rank);
// for a fixed world size and buffer size the reduction order is fixed, so runs repeat bit for bit. kAvg costs
// one extra pass. reduce_scatter is an all-reduce of a copy, keeping this rank's block (Gloo has no ring
// reduce-scatter in its options API). 16-bit floats add pairwise in float, rounding after each addition (as
// MPI_Allreduce). No hangs: a collective fails with a CommError naming itself (operation, sequence number,
// tag), this rank and Gloo's reason when a peer closes its connection (at once) or does not answer within
// the timeout; the backend is then unusable and the job must end.
class GlooBackend : public detail::CollectiveFrontEnd<GlooBackend> {
 public:
  using accepted_spaces = SpaceList<HostSpace>;
  static constexpr std::string_view backend_name = "gloo";
  using work_type = Work;

  // Over a job's rendezvous (ddp::rendezvous(): torchrun, env or a file store). Collective: every rank.
  explicit GlooBackend(Rendezvous rv, GlooOptions const& opts = {})
      : GlooBackend(rv.store, rv.launch.rank, rv.launch.world_size, opts, default_host(rv.master_addr)) {
    rendezvous_ = std::make_shared<Rendezvous>(std::move(rv));
  }
  // Over any store the ranks share (LocalStore for ranks that are threads of one process). Collective.
  GlooBackend(std::shared_ptr<Store> store, int rank, int world_size, GlooOptions const& opts = {},
              std::string default_hostname = "127.0.0.1")
      : CollectiveFrontEnd(opts.trace),
        rank_(rank),
        n_(world_size),
        store_(std::move(store)),
        record_(store_, "gloo_", rank, world_size),
        queue_(opts.queue_capacity, detail::WaitPolicy{.spin = std::chrono::microseconds(10), .yields = 4},
               detail::AllReduceExecutor<GlooBackend>{this}) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
      throw ArgumentError(detail::cat("ddp gloo: rank ", rank, " of world size ", world_size, " is not a rank"));
    auto const deadlines = detail::resolve(opts.timeout, backend_name);
    timeout_ = std::chrono::duration_cast<std::chrono::milliseconds>(deadlines.timeout);
    stall_ = std::make_unique<detail::GlooStallWatch>(deadlines, rank_, n_);
    ::gloo::transport::tcp::attr attr;
    char const* env_iface = std::getenv("GLOO_SOCKET_IFNAME");
    attr.iface = !opts.iface.empty() ? opts.iface : (env_iface != nullptr ? env_iface : "");
    if (attr.iface.empty()) attr.hostname = !opts.hostname.empty() ? opts.hostname : default_hostname;
    where_ = attr.iface.empty() ? attr.hostname : "interface " + attr.iface;
    try {
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, n_);
      ctx->setTimeout(timeout_);
      detail::GlooStoreAdapter adapter(*store_, timeout_);
      ctx->connectFullMesh(adapter, device_);
      context_ = std::move(ctx);
      learn_peer_addresses();
    } catch (::gloo::Exception const& e) {
      throw CommError(detail::cat("ddp gloo: rank ", rank_, " of ", n_, " could not connect to its peers from ", where_,
                                  " through ", store_->describe(), ": ", e.what()),
                      rank_);
    }
  }
  GlooBackend(GlooBackend const&) = delete;
  GlooBackend& operator=(GlooBackend const&) = delete;
  ~GlooBackend() {
    try {
      queue_.drain();
    } catch (...) {  // already reported by the Work handles
    }
    queue_.stop();
    // Say so before the connections close (the members go after this body), so a peer still in a collective
    // with this rank names it rather than guessing. The add waits for the store's answer: the set reached it.
    try {
      if (context_ && n_ > 1 && !store_lost_.load(std::memory_order_acquire)) {  // (a lost store would make each
        record_.post_left("its backend was destroyed");                          // post wait out its timeout)
      }
    } catch (...) {  // the store's host ended first: the peers fall back on Gloo's addresses and the reports
    }
  }

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return n_; }
  // The peers a failed collective of this backend was about (left: their backend destroyed; ended: the connection
  // closed; stalled: not in the collective within the timeout), as the first rank to claim the cause posted them
  // (ObservesPeers): the same on every rank whose collective failed for that cause. Empty until then.
  std::vector<PeerStatus> peer_failures() const { return peers_.all(); }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  // For logs: "Gloo TCP over 4 ranks from 127.0.0.1, rendezvous at torchrun's agent store (TCP store ...)".
  std::string layout() const {
    return detail::cat("Gloo TCP over ", n_, n_ == 1 ? " rank" : " ranks", " from ", where_, ", rendezvous at ",
                       rendezvous_ ? rendezvous_->describe() : store_->describe());
  }
  // The job's store (after the backend's own keys): for a NCCL id, a checkpoint path, a barrier outside Gloo.
  Store& store() const noexcept { return *store_; }

  // Waits for every async collective issued so far; rethrows the first error.
  void synchronize() { queue_.drain(); }

  // The address peers reach this rank at: the one routing to MASTER_ADDR (a loopback MASTER_ADDR gives
  // 127.0.0.1), else this host's name.
  static std::string default_host(std::string const& master) {
    if (!master.empty())
      if (auto a = detail::local_address_towards(master); !a.empty()) return a;
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') return name;
    return "127.0.0.1";
  }

 private:
  friend class detail::CollectiveFrontEnd<GlooBackend>;
  friend struct detail::AllReduceExecutor<GlooBackend>;

  template <class S>
  static constexpr void check_space() {
    static_assert(std::same_as<typename S::space, HostSpace>,
                  "GlooBackend takes host memory, but this buffer is a DeviceSpan (device memory): name a staging "
                  "adapter, HostStaging<GlooBackend> from ddp/comm/host_staging.hpp, which copies through host "
                  "memory; or use NcclBackend from ddp/comm/nccl.hpp for device buffers");
  }

  detail::AllReduceQueue<GlooBackend>& progress_queue() noexcept { return queue_; }

  void enter(CollectiveKind kind, CollectiveTag tag) {
    if (!queue_.idle()) queue_.drain();
    if (broken_.load(std::memory_order_acquire))
      throw CommError(detail::cat("ddp gloo: ", name(kind), detail::tag_suffix(tag), " on rank ", rank_, " of ", n_,
                                  ": an earlier collective of this backend failed; it is out of step with its peers "
                                  "and cannot be used (end the job)"),
                      rank_);
  }

  // Gloo's errors name a connection by its address ("[10.0.0.2]:41234"): each rank's end of its connection to
  // every other rank has one. Every rank publishes its ends, so a failure can name the peer rank.
  void learn_peer_addresses() {
    std::string mine;
    for (int q = 0; q < n_; ++q) mine += (q == rank_ ? std::string() : context_->getPair(q)->address().str()) + "\n";
    store_->set(detail::cat("gloo_ends/", rank_), std::vector<char>(mine.begin(), mine.end()));
    peer_ends_.assign(static_cast<std::size_t>(n_), std::string());
    for (int q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      auto const v = store_->get(detail::cat("gloo_ends/", q), timeout_);
      std::string const all(v.begin(), v.end());
      std::size_t at = 0;
      for (int k = 0; k < rank_; ++k) at = all.find('\n', at) + 1;  // line rank_: q's end towards this rank
      peer_ends_[static_cast<std::size_t>(q)] = all.substr(at, all.find('\n', at) - at);
    }
  }
  // Who a failure is about, from the store and Gloo's message, in this order: the ranks whose backend said it was
  // leaving (its destructor, before its connections close); else the peer a closed connection names by address;
  // else the ranks that did not report a failure of their own within a grace period (killed, or stalled past a
  // timeout). The first rank to claim a cause posts it (an atomic add on the store, so two ranks that see the failure
  // at once cannot both post), and every rank reports that first cause: ranks that fail later, because a peer gave
  // up on them, do not blame the peer that gave up.
  std::string blame(std::string const& what, std::uint64_t seq) {
    try {
      store_->set(detail::broken_key(rank_), {'1'});  // alive, handling it (at whatever collective the peers are)
      auto const stands = [&](std::pair<std::vector<PeerStatus>, std::string> cause) {  // noted; its text returned
        peers_.note_all(cause.first);
        return std::move(cause.second);
      };
      if (record_.has_cause(seq)) return stands(record_.cause(seq, timeout_));
      std::string who;
      std::vector<PeerStatus> statuses;
      auto const note = [&](int q, PeerState state, int seen_by, std::string reason) {
        statuses.push_back({.rank = q, .state = state, .seen_by = seen_by, .seq = seq, .reason = std::move(reason)});
      };
      // Ranks whose backend ended (normally, or unwinding an error) during this collective.
      auto const left = record_.any_left() ? record_.left(timeout_) : std::vector<PeerStatus>{};
      if (!left.empty()) {
        std::vector<int> ranks;
        for (auto const& l : left) ranks.push_back(l.rank);
        who = detail::cat(detail::rank_list(ranks), " left (", left.size() == 1 ? "its" : "their",
                          " backend was destroyed while this rank was in a collective with it; seen by rank ", rank_,
                          ")");
        for (auto const& l : left) note(l.rank, PeerState::kLeft, l.rank, l.reason);
      }
      for (int q = 0; q < n_ && who.empty(); ++q) {  // else the peer Gloo names by its address
        auto const& end = peer_ends_[static_cast<std::size_t>(q)];
        if (!end.empty() && what.find(end) != std::string::npos) {
          who = detail::cat("rank ", q, " ended (its connection closed; seen by rank ", rank_, ")");
          note(q, PeerState::kEnded, rank_, "its connection closed");
        }
      }
      if (who.empty()) {  // the end is not one Gloo named by a published address: ask who else saw a failure
        bool const timed_out = what.find("imed out") != std::string::npos;
        record_.report_failed(seq);
        auto const grace = std::min<std::chrono::milliseconds>(timeout_ / 2, std::chrono::seconds(5));
        // Wait out the grace, or less: until a peer posts the first cause (a rank next to the one that ended names it
        // at once), or until every peer has reported a failure of its own (then none is silent).
        auto const until = std::chrono::steady_clock::now() + grace;
        // A peer reported when it posted a failure of this collective, or broke at another one (a collective behind
        // or ahead of this rank): either way it is alive, not silent.
        auto const reported = [&](int q) {
          return record_.reported_failed(seq, q) || store_->check({detail::broken_key(q)});
        };
        auto const all_reported = [&] {
          for (int q = 0; q < n_; ++q)
            if (q != rank_ && !reported(q)) return false;
          return true;
        };
        while (std::chrono::steady_clock::now() < until && !record_.has_cause(seq) && !all_reported())
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (record_.has_cause(seq)) return stands(record_.cause(seq, timeout_));
        std::vector<int> silent;
        for (int q = 0; q < n_; ++q)
          if (q != rank_ && !reported(q)) silent.push_back(q);
        if (!silent.empty()) {
          who = timed_out
                    ? detail::cat(detail::rank_list(silent), silent.size() == 1 ? " was" : " were",
                                  " not in this collective within the timeout of ", detail::seconds_text(timeout_),
                                  " (stalled, or issuing other collectives; seen by rank ", rank_, ")")
                    : detail::cat(detail::rank_list(silent), " ended",
                                  " (connection closed, no failure reported; seen by rank ", rank_, ")");
          for (int q : silent)
            if (timed_out)
              note(q, PeerState::kStalled, rank_,
                   detail::cat("not in this collective within the timeout of ", detail::seconds_text(timeout_)));
            else
              note(q, PeerState::kEnded, rank_, "connection closed, no failure reported");
        }
      }
      if (who.empty()) return who;
      // One cause per collective: the first rank to claim it posts its own; a rank that loses the claim (it saw the
      // failure at the same moment) reports the winner's, as a later one would.
      return stands(record_.claim_cause(seq, std::move(statuses), std::move(who), timeout_));
    } catch (Error const&) {  // the store is gone too (its host ended): Gloo's message alone
      store_lost_.store(true, std::memory_order_release);
      return {};
    }
  }

  // Runs one Gloo collective (tagged with its sequence number, so a rank out of order never matches another
  // collective's messages); a Gloo error breaks the backend and becomes a CommError.
  // `count`, `dtype`, `op` and `root` are for the stall warning.
  template <class Fn>
  void run(CollectiveKind kind, CollectiveTag tag, Fn&& fn, std::size_t count = 0, Dtype dtype = Dtype::kFloat32,
           ReduceOp op = ReduceOp::kSum, int root = -1) {
    std::uint64_t const seq = ++calls_;
    stall_->begin(detail::CallRecord::make(seq, kind, count, dtype, op, root, tag));
    try {
      fn(static_cast<std::uint32_t>(seq));
      stall_->end();
    } catch (::gloo::Exception const& e) {
      stall_->end();
      broken_.store(true, std::memory_order_release);
      std::string const who = blame(e.what(), seq);
      throw CommError(
          detail::cat("ddp gloo: ", name(kind), " #", seq, detail::tag_suffix(tag), " on rank ", rank_, " of ", n_,
                      " failed: ",
                      who.empty() ? detail::cat("a peer ended, stalled past the timeout of ",
                                                detail::seconds_text(timeout_), ", or issued other collectives")
                                  : who,
                      " (Gloo: ", e.what(), ")"),
          rank_);
    }
  }

  template <class T>
  void run_all_reduce(HostSpan<T> buf, ReduceOp op, CollectiveTag tag) {
    run(
        CollectiveKind::kAllReduce, tag,
        [&](std::uint32_t t) {
          if (n_ == 1 || buf.empty()) return;
          ::gloo::AllreduceOptions o(context_);
          o.setOutput(buf.data(), buf.size());
          o.setReduceFunction(detail::gloo_reduction<T>(op));
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::allreduce(o);
        },
        buf.size(), dtype_of<T>, op);
    if (op == ReduceOp::kAvg) detail::average(buf.data(), buf.size(), n_);
  }

  template <class T>
  void run_broadcast(HostSpan<T> buf, int root, CollectiveTag tag) {
    run(
        CollectiveKind::kBroadcast, tag,
        [&](std::uint32_t t) {
          if (n_ == 1 || buf.empty()) return;
          ::gloo::BroadcastOptions o(context_);
          o.setOutput(buf.data(), buf.size());
          o.setRoot(root);
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::broadcast(o);
        },
        buf.size(), dtype_of<T>, ReduceOp::kSum, root);
  }

  template <class T>
  void run_all_gather(HostSpan<T const> src, HostSpan<T> dst, CollectiveTag tag) {
    run(
        CollectiveKind::kAllGather, tag,
        [&](std::uint32_t t) {
          if (src.empty()) return;
          T* const mine = dst.data() + static_cast<std::size_t>(rank_) * src.size();
          if (src.data() != mine) std::copy(src.data(), src.data() + src.size(), mine);
          if (n_ == 1) return;
          ::gloo::AllgatherOptions o(context_);
          o.setOutput(dst.data(), dst.size());  // no input: this rank's block of the output is its input
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::allgather(o);
        },
        src.size(), dtype_of<T>);
  }

  template <class T>
  void run_reduce_scatter(HostSpan<T const> src, HostSpan<T> dst, ReduceOp op, CollectiveTag tag) {
    scratch_.resize(src.size_bytes());
    T* const all = reinterpret_cast<T*>(scratch_.data());
    std::copy(src.data(), src.data() + src.size(), all);
    run(
        CollectiveKind::kReduceScatter, tag,
        [&](std::uint32_t t) {
          if (n_ == 1 || src.empty()) return;
          ::gloo::AllreduceOptions o(context_);
          o.setOutput(all, src.size());
          o.setReduceFunction(detail::gloo_reduction<T>(op));
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::allreduce(o);
        },
        src.size(), dtype_of<T>, op);
    T const* const block = all + static_cast<std::size_t>(rank_) * dst.size();
    std::copy(block, block + dst.size(), dst.data());
    if (op == ReduceOp::kAvg) detail::average(dst.data(), dst.size(), n_);
  }

  template <class T>
  void run_gather(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    run(
        CollectiveKind::kGather, tag,
        [&](std::uint32_t t) {
          if (src.empty()) return;
          if (n_ == 1) {
            if (dst.data() != src.data()) std::copy(src.data(), src.data() + src.size(), dst.data());
            return;
          }
          ::gloo::GatherOptions o(context_);
          o.setInput(const_cast<T*>(src.data()), src.size());
          if (rank_ == root) o.setOutput(dst.data(), dst.size());
          o.setRoot(root);
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::gather(o);
        },
        src.size(), dtype_of<T>, ReduceOp::kSum, root);
  }

  template <class T>
  void run_scatter(HostSpan<T const> src, HostSpan<T> dst, int root, CollectiveTag tag) {
    run(
        CollectiveKind::kScatter, tag,
        [&](std::uint32_t t) {
          if (dst.empty()) return;
          if (n_ == 1) {
            if (dst.data() != src.data()) std::copy(src.data(), src.data() + dst.size(), dst.data());
            return;
          }
          ::gloo::ScatterOptions o(context_);
          std::vector<T*> blocks;
          if (rank_ == root)
            for (int q = 0; q < n_; ++q) blocks.push_back(const_cast<T*>(src.data()) + q * dst.size());
          if (rank_ == root) o.setInputs(blocks, dst.size());
          o.setOutput(dst.data(), dst.size());
          o.setRoot(root);
          o.setTag(t);
          o.setTimeout(timeout_);
          ::gloo::scatter(o);
        },
        dst.size(), dtype_of<T>, ReduceOp::kSum, root);
  }

  void run_barrier(CollectiveTag tag) {
    run(CollectiveKind::kBarrier, tag, [&](std::uint32_t t) {
      if (n_ == 1) return;
      ::gloo::BarrierOptions o(context_);
      o.setTag(t);
      o.setTimeout(timeout_);
      ::gloo::barrier(o);
    });
  }

  int rank_ = 0;
  int n_ = 1;
  std::shared_ptr<Store> store_;
  detail::StorePeerRecord record_;  // who left, who reported a failure, each collective's first cause (keys gloo_*)
  std::shared_ptr<Rendezvous> rendezvous_;  // the job's, when built from one (keeps rank 0's store server up)
  std::chrono::milliseconds timeout_{};
  std::string where_;
  detail::PeerLog peers_;               // what blame() learned (peer_failures)
  std::vector<std::string> peer_ends_;  // [q]: rank q's end of its connection to this rank, as Gloo prints it
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  std::uint64_t calls_ = 0;  // collectives issued (their sequence numbers and Gloo tags); one thread at a time
  std::atomic<bool> broken_{false};
  std::atomic<bool> store_lost_{false};  // blame found the store gone: the destructor does not post to it
  std::vector<char> scratch_;            // reduce_scatter's copy of its input
  std::unique_ptr<detail::GlooStallWatch> stall_;
  detail::AllReduceQueue<GlooBackend> queue_;
};

static_assert(Communicator<GlooBackend>);
static_assert(AsyncCommunicator<GlooBackend>);
static_assert(ObservesPeers<GlooBackend>);

}  // namespace ddp
