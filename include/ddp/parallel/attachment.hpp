// The one way to attach to a DistributedDataParallel: ddp.attach(hook) returns an Attachment, which detaches the
// hook when it goes (RAII). A hook (DdpHook) declares what it does, its capabilities, and DDP asks the composition
// rules (composition.hpp) whether it composes with what is already attached before taking it. ddp::join, the
// overlapped update and the optimizers that shard or reduce (ZeroRedundancyOptimizer, OwnerReduce) all attach
// this way; so would a new round policy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

// What a hook does to a DDP's rounds: the facts the composition rules (composition.hpp) read.
enum class Capability : std::uint8_t {
  kAgreesOnRounds = 1,        // agrees with the other ranks on each round first, and answers rounds it has no batch
                              // for with shadow rounds (ddp::join)
  kUpdatesInBackward = 2,     // moves the parameters as each bucket's reduction lands, inside backward
                              // (OverlappedOptimizer)
  kReducesGradients = 4,      // reduces the gradients itself, in its step (the optimizer under OwnerReduce)
  kShardsState = 8,           // keeps one rank's share of the optimizer state: every rank must step (ZeRO stage >= 1)
  kNeedsWholeGradients = 16,  // reads every averaged gradient between backward and the step (clipping, loss scaling)
  kLocalRounds = 32,          // decides before each round whether it is local: nothing travels and each rank keeps
                              // its own gradients (LocalSgd, DiLoCo: parallel/local_sgd.hpp)
  kVirtualReplicas = 64,      // with kLocalRounds: trains virtual replicas, a fixed number whatever the world size,
                              // averaged exactly (deterministic mode's local SGD: parallel/local_rounds.hpp)
};

// A set of capabilities: {Capability::kUpdatesInBackward} | Capability::kShardsState.
class Capabilities {
 public:
  constexpr Capabilities() = default;
  constexpr Capabilities(Capability c) noexcept : bits_(static_cast<std::uint8_t>(c)) {}  // NOLINT: a set of one
  constexpr bool has(Capability c) const noexcept { return (bits_ & static_cast<std::uint8_t>(c)) != 0; }
  constexpr bool has_any(Capabilities o) const noexcept { return (bits_ & o.bits_) != 0; }
  constexpr bool empty() const noexcept { return bits_ == 0; }
  friend constexpr Capabilities operator|(Capabilities a, Capabilities b) noexcept {
    Capabilities out;
    out.bits_ = static_cast<std::uint8_t>(a.bits_ | b.bits_);
    return out;
  }
  friend constexpr bool operator==(Capabilities, Capabilities) = default;

 private:
  std::uint8_t bits_ = 0;
};
constexpr Capabilities operator|(Capability a, Capability b) noexcept { return Capabilities(a) | Capabilities(b); }

// A hook as the composition rules see it: its name (in refusals) and what it does.
struct HookTraits {
  std::string name;
  Capabilities caps{};
};

// What one synchronised round under ddp::join was agreed to be: where buffers come from (the lowest rank that
// still has data) and the factor on the reduced gradients.
struct JoinRound {
  int buffer_root = 0;
  double grad_scale = 1.0;
};

// Something attached to a DDP. DDP calls the members its capabilities name, on the rank's thread:
//  - on_round() (kAgreesOnRounds): a round's first forward on a rank that has data, before any of the round's
//    collectives, to agree with the other ranks on the round;
//  - on_bucket_reduced(begin, end) (kUpdatesInBackward): at the end of a round's backward, once per bucket in plan
//    order, as soon as arena elements [begin, end) (one bucket's whole parameters) hold their final gradients, while
//    later buckets may still be in flight;
//  - local_round() (kLocalRounds): at every forward, whether the step it belongs to is local (the same answer for
//    every micro-batch of a step, and on every rank). A local step opens no round: no collective, buffers stay, and
//    the rank's gradients are the sum over its own micro-batches;
//  - on_local_forward(index) (kLocalRounds): in a local step, before the forward of the rank's micro-batch `index`
//    with gradients enabled (a training forward; evaluation under NoGradGuard does not call it).
class DdpHook {
 public:
  virtual HookTraits traits() const = 0;
  virtual JoinRound on_round() { return {}; }
  virtual void on_bucket_reduced(std::int64_t /*begin*/, std::int64_t /*end*/) {}
  virtual bool local_round() const { return false; }
  virtual void on_local_forward(std::int64_t /*index*/) {}

 protected:
  virtual ~DdpHook() = default;
};

namespace detail {
// The hooks attached to one DDP, in attach order, with their traits; join() and update() are the ones that act in a
// round (the last attached with kAgreesOnRounds, with kUpdatesInBackward), or nullptr; local_round() asks the one with
// kLocalRounds.
class HookList {
 public:
  void add(DdpHook& hook, HookTraits traits) {
    hooks_.push_back(&hook);
    traits_.push_back(std::move(traits));
    sync();
  }
  void remove(DdpHook& hook) noexcept {
    auto const at = std::find(hooks_.begin(), hooks_.end(), &hook);
    if (at == hooks_.end()) return;
    traits_.erase(traits_.begin() + (at - hooks_.begin()));
    hooks_.erase(at);
    sync();
  }
  std::span<HookTraits const> traits() const noexcept { return traits_; }
  bool has(Capability c) const noexcept {
    return std::any_of(traits_.begin(), traits_.end(), [c](HookTraits const& t) { return t.caps.has(c); });
  }
  DdpHook* join() const noexcept { return join_; }
  DdpHook* update() const noexcept { return update_; }
  // Whether the coming step is local (a kLocalRounds hook says so).
  bool local_round() const { return local_ && local_->local_round(); }
  void local_forward(std::int64_t index) const {
    if (local_) local_->on_local_forward(index);
  }

 private:
  void sync() noexcept {
    join_ = update_ = local_ = nullptr;
    for (std::size_t k = 0; k < hooks_.size(); ++k) {
      if (traits_[k].caps.has(Capability::kAgreesOnRounds)) join_ = hooks_[k];
      if (traits_[k].caps.has(Capability::kUpdatesInBackward)) update_ = hooks_[k];
      if (traits_[k].caps.has(Capability::kLocalRounds)) local_ = hooks_[k];
    }
  }
  std::vector<DdpHook*> hooks_;
  std::vector<HookTraits> traits_;
  DdpHook* join_ = nullptr;
  DdpHook* update_ = nullptr;
  DdpHook* local_ = nullptr;
};

// What an Attachment detaches from (DistributedDataParallel).
class HookSite {
 public:
  virtual void detach(DdpHook& hook) noexcept = 0;

 protected:
  virtual ~HookSite() = default;
};
}  // namespace detail

// A hook attached to a DDP, until this is destroyed or reset(). Move-only. The DDP must outlive it.
class Attachment {
 public:
  Attachment() = default;
  Attachment(detail::HookSite& site, DdpHook& hook) noexcept : site_(&site), hook_(&hook) {}
  Attachment(Attachment&& o) noexcept
      : site_(std::exchange(o.site_, nullptr)), hook_(std::exchange(o.hook_, nullptr)) {}
  Attachment& operator=(Attachment&& o) noexcept {
    if (this != &o) {
      reset();
      site_ = std::exchange(o.site_, nullptr);
      hook_ = std::exchange(o.hook_, nullptr);
    }
    return *this;
  }
  Attachment(Attachment const&) = delete;
  Attachment& operator=(Attachment const&) = delete;
  ~Attachment() { reset(); }

  void reset() noexcept {
    if (site_) site_->detach(*hook_);
    site_ = nullptr;
    hook_ = nullptr;
  }
  bool attached() const noexcept { return site_ != nullptr; }
  // Whether this attaches `hook` to `site`.
  bool holds(detail::HookSite const& site, DdpHook const& hook) const noexcept {
    return site_ == &site && hook_ == &hook;
  }

 private:
  detail::HookSite* site_ = nullptr;
  DdpHook* hook_ = nullptr;
};

}  // namespace ddp
