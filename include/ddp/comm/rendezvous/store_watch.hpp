// StoreWatch: waits for one collective under a deadline, learning what the peers do through the job's store
// (the rendezvous's), for a backend whose ranks share nothing else: NcclBackend launched by torchrun, srun or a
// file store, with no MPI. It says what MpiWatch says over MPI, from posts instead of answers:
// - a rank whose wait outlasts a moment posts the call it waits in ("<prefix>at/<rank>");
// - at the stall warning and at the deadline it reads every peer's post: a peer that posted this call, or a later
//   one, has arrived; one at this position in another call has diverged (both sides are named); one that posted
//   nothing here is absent;
// - a rank that ends (its backend destroyed, or a failed collective) posts "<prefix>left/<rank>" with the reason,
//   so its peers fail at once, naming it and its reason, instead of at the deadline (StorePeerRecord, the record
//   GlooBackend's blame keeps too).
// A wait costs the store nothing until it has lasted kPostAfter; then one post, and one counter read per poll.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/detail/call_record.hpp"
#include "ddp/comm/detail/wait.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/comm/rendezvous/store_peer_record.hpp"
#include "ddp/comm/watch.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

class StoreWatch {
 public:
  // A wait shorter than this never touches the store (a healthy step's waits are shorter).
  static constexpr std::chrono::milliseconds kPostAfter{50};
  // A wait longer than this sleeps between polls (shorter ones spin, then yield).
  static constexpr std::chrono::milliseconds kSleepAfter{2};
  // How often a long wait looks for departed peers.
  static constexpr std::chrono::milliseconds kPollEvery{100};

  // `prefix` keeps this backend's keys apart from every other user of the store (e.g. "nccl/0/watch/").
  StoreWatch(std::shared_ptr<Store> store, int rank, int world_size, Deadlines deadlines, std::string_view backend,
             std::string prefix)
      : store_(std::move(store)),
        rank_(rank),
        n_(world_size),
        deadlines_(std::move(deadlines)),
        backend_(backend),
        prefix_(std::move(prefix)),
        record_(store_, prefix_, rank, world_size) {}
  StoreWatch(StoreWatch const&) = delete;
  StoreWatch& operator=(StoreWatch const&) = delete;

  // Where rank q posts that it left, and why (for share_from_root's root_left).
  std::string left_key(int q) const { return record_.left_key(q); }

  // Tells the peers this rank takes part in no further collective, and why ("its backend was destroyed"). The
  // first reason stands. Never throws: a store that is gone leaves the peers to their deadline.
  void leave(std::string const& why) noexcept {
    if (left_ || n_ == 1) return;
    left_ = true;
    try {
      record_.post_left(why);
    } catch (...) {}
  }

  // Waits until done() (which may throw the collective's own error) returns true for the collective `call`;
  // throws a CommError at the deadline, at once when the ranks diverged, or when a peer left (after a grace in
  // which the collective may still complete: a peer leaves once its own part is done). A failure here is posted
  // as this rank's departure, so its peers name it with this reason.
  template <class Done>
  void wait_until(Done&& done, CallRecord const& call) {
    if (done()) return;
    auto const start = Clock::now();
    auto next_poll = start + kPostAfter;
    bool warned = deadlines_.warn.count() == 0;
    bool posted = false;
    bool sleeping = false;
    for (std::uint32_t i = 1;; ++i) {
      if (done()) return;
      if (!sleeping && (i & 15u) != 0) continue;
      auto const now = Clock::now();
      // Spin, then yield past 100 us; past 2 ms the wait is long enough to sleep between polls without a core
      // spinning for it, each sleep 1/16 of the time waited so far (at most 1 ms): under 7% added to the wait.
      auto const waited = now - start;
      if (waited > kSleepAfter) {
        sleeping = true;
        std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(1), waited / 16));
      } else if (waited > std::chrono::microseconds(100)) {
        std::this_thread::yield();
      }
      if (now < next_poll) continue;
      next_poll = now + kPollEvery;
      if (!posted) posted = guarded([&] { post(call); });
      std::string who;
      guarded([&] { who = departed(); });
      if (!who.empty()) {
        if (finishes_within(done, grace())) return;
        fail(CommError(cat("ddp ", backend_, ": ", describe(call), " on rank ", rank_, " of ", n_, " failed: ", who),
                       first_departed_));
      }
      if (!warned && now - start >= deadlines_.warn) {
        warned = true;
        auto const report = gather(done, call);
        if (!report) return;  // it completed while we looked
        if (report->diverged(call)) fail(report->failure(backend_, call, "stalled"));
        deadlines_.warn_stall(report->warning(backend_, call, deadlines_));
      }
      if (now - start >= deadlines_.timeout) {
        auto const report = gather(done, call);
        if (!report) return;
        fail(report->failure(backend_, call, cat("timed out after ", seconds_text(deadlines_.timeout))));
      }
    }
  }

 private:
  static constexpr std::string_view kSilence =
      "it posted no wait in this collective: stopped, ended, or busy outside ddp's collectives";

  std::chrono::nanoseconds grace() const {
    return std::min<std::chrono::nanoseconds>(std::chrono::seconds(1), deadlines_.timeout / 4);
  }

  // Runs one exchange with the store; a store that fails (its host ended) is given up for the rest of this
  // backend's life: the waits keep their deadlines, and the messages say the peers could not be asked.
  template <class F>
  bool guarded(F&& f) noexcept {
    if (!store_lost_.empty()) return false;
    try {
      f();
      return true;
    } catch (std::exception const& e) {
      store_lost_ = e.what();
      if (store_lost_.empty()) store_lost_ = "unknown error";
      return false;
    }
  }

  [[noreturn]] void fail(CommError const& e) {
    leave(cat("it failed: ", e.what()));
    throw e;
  }

  void post(CallRecord const& call) {
    std::vector<char> bytes(sizeof call);
    std::memcpy(bytes.data(), &call, sizeof call);
    store_->set(cat(prefix_, "at/", rank_), bytes);
  }

  std::optional<CallRecord> posted_by(int q) {
    std::string const key = cat(prefix_, "at/", q);
    if (!store_->check({key})) return std::nullopt;
    auto const bytes = store_->get(key, std::chrono::duration_cast<std::chrono::milliseconds>(grace()));
    if (bytes.size() != sizeof(CallRecord)) return std::nullopt;
    CallRecord r;
    std::memcpy(&r, bytes.data(), sizeof r);
    r.label[sizeof r.label - 1] = '\0';
    return r;
  }

  // "rank 2 left (its backend was destroyed)", or "" while every peer is still in the job.
  std::string departed() {
    if (!record_.any_left()) return {};
    std::string who;
    for (auto const& s : record_.left(std::chrono::duration_cast<std::chrono::milliseconds>(grace()))) {
      who += cat(who.empty() ? "" : "; ", "rank ", s.rank, " left (", s.reason, ")");
      if (first_departed_ < 0) first_departed_ = s.rank;
    }
    return who;
  }

  template <class Done>
  bool finishes_within(Done& done, std::chrono::nanoseconds d) {
    auto const until = Clock::now() + d;
    while (Clock::now() < until) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return done();
  }

  // Every peer's post, read for up to grace() until each has reached this collective; nullopt if the
  // collective completed meanwhile. A post from before this collective is stale: that peer counts as silent.
  template <class Done>
  std::optional<PeerReport> gather(Done& done, CallRecord const& call) {
    PeerReport report{.peers = std::vector<std::optional<CallRecord>>(static_cast<std::size_t>(n_)),
                      .rank = rank_,
                      .silence = std::string(kSilence)};
    report.peers[static_cast<std::size_t>(rank_)] = call;
    auto const until = Clock::now() + grace();
    for (;;) {
      if (done()) return std::nullopt;
      bool all = true;
      for (int q = 0; q < n_; ++q) {
        auto& slot = report.peers[static_cast<std::size_t>(q)];
        if (q == rank_ || (slot && slot->seq >= call.seq)) continue;
        guarded([&] { slot = posted_by(q); });
        if (slot && slot->seq < call.seq) slot.reset();
        all = all && slot.has_value();
      }
      if (!store_lost_.empty()) {
        report.silence = cat("the peers could not be asked: the store failed: ", store_lost_);
        return report;
      }
      if (all || Clock::now() >= until) return report;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::shared_ptr<Store> store_;
  int rank_;
  int n_;
  Deadlines deadlines_;
  std::string_view backend_;
  std::string prefix_;
  StorePeerRecord record_;  // who left and why (keys <prefix>left/<r>, <prefix>left_count)
  bool left_ = false;
  int first_departed_ = -1;  // the first peer departed() found
  std::string store_lost_;   // the store's error, once it failed
};

}  // namespace ddp::detail
