// Store: the small key-value service ranks meet through before they can talk to each other (PyTorch's c10d
// Store; Gloo's rendezvous store): set a key, get one (waiting until some rank sets it), add to a counter.
// Implementations: TcpStore (tcp_store.hpp: PyTorch's TCPStore protocol, so torchrun's agent or a TcpStoreServer,
// tcp_store_server.hpp, serves it) and FileStore (file_store.hpp: a directory on a filesystem every rank sees, which
// also sees which ranks live). PrefixStore keeps one job's keys apart from everything else a shared store holds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

// Every call may throw CommError (the store is unreachable, a wait ran out of time: the message names the key
// and the store).
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(std::string const& key, std::vector<char> const& value) = 0;
  // Waits until `key` exists (at most `timeout`), then returns its value.
  virtual std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the integer counter `key` (created at 0) and returns the new value: atomic across ranks.
  virtual std::int64_t add(std::string const& key, std::int64_t delta) = 0;
  // Whether every key exists now (no waiting).
  virtual bool check(std::vector<std::string> const& keys) = 0;
  // For messages: "TCP store 127.0.0.1:29500", "file store /shared/job".
  virtual std::string describe() const = 0;
  // Liveness, where the store can see it (FileStore: a lock each rank holds while its process lives). hold_rank(r)
  // marks this process as rank r for as long as the store object lives; rank_gone(q) is true once rank q held its
  // mark and no longer does (its process ended: returned, crashed or killed). A store that cannot tell never says
  // gone (a TCP store served by a rank fails on its own when that rank ends).
  virtual void hold_rank(int /*rank*/) {}
  virtual bool rank_gone(int /*rank*/) { return false; }
};

// Another store's keys under `prefix` ("ddp/attempt_0/" + key).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base) : prefix_(std::move(prefix)), base_(std::move(base)) {}
  void set(std::string const& key, std::vector<char> const& value) override { base_->set(prefix_ + key, value); }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    return base_->get(prefix_ + key, timeout);
  }
  std::int64_t add(std::string const& key, std::int64_t delta) override { return base_->add(prefix_ + key, delta); }
  bool check(std::vector<std::string> const& keys) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (auto const& k : keys) full.push_back(prefix_ + k);
    return base_->check(full);
  }
  std::string describe() const override { return base_->describe(); }
  void hold_rank(int rank) override { base_->hold_rank(rank); }
  bool rank_gone(int rank) override { return base_->rank_gone(rank); }
  Store& base() const noexcept { return *base_; }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// A store in this process's memory: for ranks that are threads of one process (tests, the in-process Gloo
// harness) and for a job of one rank.
class LocalStore final : public Store {
 public:
  void set(std::string const& key, std::vector<char> const& value) override {
    {
      std::lock_guard lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; }))
      throw CommError(detail::cat(describe(), ": key '", key, "' did not appear within ",
                                  std::chrono::duration<double>(timeout).count(), " s"));
    return data_[key];
  }
  std::int64_t add(std::string const& key, std::int64_t delta) override {
    std::int64_t v = 0;
    {
      std::lock_guard lock(mu_);
      auto& slot = data_[key];
      if (!slot.empty()) v = std::stoll(std::string(slot.begin(), slot.end()));
      v += delta;
      std::string const text = std::to_string(v);
      slot.assign(text.begin(), text.end());
    }
    cv_.notify_all();
    return v;
  }
  bool check(std::vector<std::string> const& keys) override {
    std::lock_guard lock(mu_);
    for (auto const& k : keys)
      if (!data_.count(k)) return false;
    return true;
  }
  std::string describe() const override { return "in-process store"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

}  // namespace ddp
