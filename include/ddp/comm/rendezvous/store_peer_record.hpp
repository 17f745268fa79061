// StorePeerRecord: the one store-based record of who failed, for every backend whose ranks learn about each other
// through the job's store (GlooBackend's blame, StoreWatch for NcclBackend without MPI). Keys, under a prefix that
// keeps one backend's apart ("gloo_" for Gloo, "nccl/<i>/watch/" for NCCL: the layouts these backends always had):
// - left/<r>: rank r takes part in no further collective, with its reason (its backend destroyed, a failed
//   collective); left_count, added to after each such post, so a waiting peer reads one counter per poll;
// - failed/<seq>/<r>: rank r reported a failure of collective seq (the roll call: a peer that did not is silent);
// - failure_claim/<seq>, failure/<seq>, failures/<seq>: the first cause of collective seq, claimed with an atomic add
//   so that two ranks that see a failure at once cannot both post one; its statuses and text (encode_cause).
// The first status of each rank stands; posting never throws where the store's failure must not hide the caller's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/peer_status.hpp"
#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

class StorePeerRecord {
 public:
  StorePeerRecord(std::shared_ptr<Store> store, std::string prefix, int rank, int world_size)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), n_(world_size) {}

  std::string left_key(int q) const { return cat(prefix_, "left/", q); }

  // This rank leaves, and why. The add is answered only once the set reached the store. Throws the store's error.
  void post_left(std::string const& why) {
    store_->set(left_key(rank_), std::vector<char>(why.begin(), why.end()));
    store_->add(cat(prefix_, "left_count"), 1);
  }
  // Whether any rank has posted that it left (one counter read).
  bool any_left() { return store_->add(cat(prefix_, "left_count"), 0) > 0; }
  // The peers that posted that they left, with their reasons, in rank order (kLeft, seen by themselves).
  std::vector<PeerStatus> left(std::chrono::milliseconds timeout) {
    std::vector<PeerStatus> out;
    for (int q = 0; q < n_; ++q) {
      if (q == rank_ || !store_->check({left_key(q)})) continue;
      auto const v = store_->get(left_key(q), timeout);
      out.push_back({.rank = q, .state = PeerState::kLeft, .seen_by = q, .reason = std::string(v.begin(), v.end())});
    }
    return out;
  }

  // The roll call of collective seq: this rank reports it failed there; whether peer q did.
  void report_failed(std::uint64_t seq) { store_->set(cat(prefix_, "failed/", seq, "/", rank_), {'1'}); }
  bool reported_failed(std::uint64_t seq, int q) { return store_->check({cat(prefix_, "failed/", seq, "/", q)}); }

  // The first cause of collective seq, if a rank posted it.
  bool has_cause(std::uint64_t seq) { return store_->check({cause_key(seq)}); }
  std::pair<std::vector<PeerStatus>, std::string> cause(std::uint64_t seq, std::chrono::milliseconds timeout) {
    auto const v = store_->get(cause_key(seq), timeout);
    return decode_cause(std::string_view(v.data(), v.size()));
  }
  // Posts this rank's cause of collective seq unless another rank claimed it first; returns the cause that stands.
  std::pair<std::vector<PeerStatus>, std::string> claim_cause(std::uint64_t seq, std::vector<PeerStatus> statuses,
                                                              std::string text, std::chrono::milliseconds timeout) {
    if (store_->add(cat(prefix_, "failure_claim/", seq), 1) != 1) return cause(seq, timeout);
    std::string const value = encode_cause(statuses, text);
    store_->set(cause_key(seq), std::vector<char>(value.begin(), value.end()));
    store_->add(cat(prefix_, "failures/", seq), 1);  // answered: the set above reached the store
    return {std::move(statuses), std::move(text)};
  }

 private:
  std::string cause_key(std::uint64_t seq) const { return cat(prefix_, "failure/", seq); }

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  int n_;
};

}  // namespace ddp::detail
