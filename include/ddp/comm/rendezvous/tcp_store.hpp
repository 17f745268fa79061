// TcpStore and TcpStoreServer: a Store over TCP that speaks PyTorch's TCPStore wire protocol (c10d, as in
// PyTorch 1.13), so a ddp rank joins the store torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE) as
// PyTorch's own workers do, and PyTorch clients can join a TcpStoreServer.
//
// The protocol, per request: one byte of query type, then strings and byte vectors as a native-endian uint64
// length followed by the bytes, integers as native-endian int64. SET (key, value) has no reply; GET (key)
// replies with the value; ADD (key, delta) with the new value; CHECK (n, keys) and WAIT (n, keys) with one
// byte (CHECK: 0 ready, 1 not; WAIT: 0 once every key exists). A client waits for a key before getting it.
//
// The server is one thread polling every connection; a request that is not the protocol (an unknown query
// type, a length beyond kMaxStoreBytes) closes that connection only, so garbage sent to the port leaves the
// job running. Every client call runs under a deadline and throws CommError naming the store and the key.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/error.hpp"

namespace ddp {

// The largest key or value either side accepts (a rendezvous moves addresses and ids: bytes, not megabytes).
inline constexpr std::uint64_t kMaxStoreBytes = std::uint64_t{64} << 20;

namespace detail {

enum class StoreQuery : std::uint8_t { kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDeleteKey };

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(Fd const&) = delete;
  Fd& operator=(Fd const&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

using StoreClock = std::chrono::steady_clock;

inline int ms_left(StoreClock::time_point deadline) {
  auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - StoreClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Connects to host:port, retrying refused connections (the server may not be up yet) until the deadline.
// ArgumentError for a host that does not resolve; CommError when nothing answers in time.
inline Fd connect_tcp(std::string const& host, int port, StoreClock::time_point deadline, std::string const& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string const service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    throw ArgumentError(cat(what, ": cannot resolve the address '", host, "': ", ::gai_strerror(rc)));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> hold(res, ::freeaddrinfo);
  std::string last = "no address";
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd) {
        last = std::strerror(errno);
        continue;
      }
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        rc = ::poll(&p, 1, std::max(1, std::min(ms_left(deadline), 2000)));
        int err = 0;
        socklen_t len = sizeof err;
        if (rc == 1 && ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
          rc = 0;
        } else {
          errno = rc == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
          rc = -1;
        }
      }
      if (rc == 0) {
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last = std::strerror(errno);
    }
    if (StoreClock::now() + pause >= deadline)
      throw CommError(cat(what, ": cannot connect to ", host, ":", port, " (", last,
                          "); is the address right, and is the store (rank 0, or torchrun's agent) running?"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

// Sends or receives exactly n bytes on a non-blocking socket before the deadline. Returns false on timeout;
// throws CommError when the peer closes or the socket fails.
inline bool send_exact(int fd, void const* data, std::size_t n, StoreClock::time_point deadline,
                       std::string const& what) {
  auto const* p = static_cast<char const*>(data);
  while (n > 0) {
    ssize_t const k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw CommError(cat(what, ": send failed: ", std::strerror(errno)));
    pollfd q{fd, POLLOUT, 0};
    if (::poll(&q, 1, ms_left(deadline)) == 0) return false;
  }
  return true;
}
inline bool recv_exact(int fd, void* data, std::size_t n, StoreClock::time_point deadline, std::string const& what) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t const k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) throw CommError(cat(what, ": the store closed the connection"));
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw CommError(cat(what, ": receive failed: ", std::strerror(errno)));
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, ms_left(deadline)) == 0) return false;
  }
  return true;
}

// A request under construction: the wire encoding of the protocol's fields.
struct StoreRequest {
  std::vector<char> bytes;
  explicit StoreRequest(StoreQuery q) { bytes.push_back(static_cast<char>(q)); }
  StoreRequest& u64(std::uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    bytes.insert(bytes.end(), b, b + 8);
    return *this;
  }
  StoreRequest& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  StoreRequest& str(std::string const& s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  StoreRequest& vec(std::vector<char> const& v) {
    u64(v.size());
    bytes.insert(bytes.end(), v.begin(), v.end());
    return *this;
  }
};

}  // namespace detail

// A client of a TCPStore (PyTorch's, torchrun's agent's, or a TcpStoreServer). One connection, one request at a
// time (callers serialise). A request that times out leaves the connection out of step, so the next request
// reconnects.
class TcpStore final : public Store {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 29500;
    // How long connecting may take (the server may start after this rank) and how long any request may wait.
    std::chrono::milliseconds timeout = std::chrono::seconds(300);
  };

  explicit TcpStore(Options opt) : opt_(std::move(opt)) {
    if (opt_.port <= 0 || opt_.port > 65535)
      throw ArgumentError(detail::cat("TcpStore: port ", opt_.port, " is outside [1, 65535]"));
    connect();
  }

  void set(std::string const& key, std::vector<char> const& value) override {
    detail::StoreRequest r(detail::StoreQuery::kSet);
    r.str(key).vec(value);
    send(r, key);
  }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    detail::StoreRequest r(detail::StoreQuery::kGet);
    r.str(key);
    send(r, key);
    std::uint64_t n = 0;
    receive(&n, 8, key, deadline_after(opt_.timeout));
    if (n > kMaxStoreBytes) {
      fd_.reset();
      throw CommError(detail::cat(describe(), ": the value of '", key, "' claims ", n, " bytes; not a TCPStore?"));
    }
    std::vector<char> value(n);
    receive(value.data(), n, key, deadline_after(opt_.timeout));
    return value;
  }
  std::int64_t add(std::string const& key, std::int64_t delta) override {
    detail::StoreRequest r(detail::StoreQuery::kAdd);
    r.str(key).i64(delta);
    send(r, key);
    std::int64_t v = 0;
    receive(&v, 8, key, deadline_after(opt_.timeout));
    return v;
  }
  bool check(std::vector<std::string> const& keys) override {
    detail::StoreRequest r(detail::StoreQuery::kCheck);
    r.u64(keys.size());
    for (auto const& k : keys) r.str(k);
    std::string const what = keys.empty() ? std::string("(no keys)") : keys.front();
    send(r, what);
    std::uint8_t ready = 1;
    receive(&ready, 1, what, deadline_after(opt_.timeout));
    return ready == 0;
  }
  // Waits until every key exists; CommError naming the first key and the store after `timeout`.
  void wait(std::vector<std::string> const& keys, std::chrono::milliseconds timeout) {
    detail::StoreRequest r(detail::StoreQuery::kWait);
    r.u64(keys.size());
    for (auto const& k : keys) r.str(k);
    std::string const what = keys.empty() ? std::string("(no keys)") : keys.front();
    send(r, what);
    std::uint8_t done = 1;
    auto const deadline = deadline_after(timeout);
    if (!detail::recv_exact(fd_.get(), &done, 1, deadline, describe())) {
      fd_.reset();  // the server will still answer this wait: the connection is out of step
      throw CommError(detail::cat(describe(), ": key '", what, "' did not appear within ",
                                  std::chrono::duration<double>(timeout).count(), " s"));
    }
  }
  std::string describe() const override { return detail::cat("TCP store ", opt_.host, ":", opt_.port); }
  Options const& options() const noexcept { return opt_; }

 private:
  static detail::StoreClock::time_point deadline_after(std::chrono::milliseconds t) {
    return detail::StoreClock::now() + t;
  }
  void connect() { fd_ = detail::connect_tcp(opt_.host, opt_.port, deadline_after(opt_.timeout), describe()); }
  void send(detail::StoreRequest const& r, std::string const& key) {
    if (!fd_) connect();
    try {
      if (!detail::send_exact(fd_.get(), r.bytes.data(), r.bytes.size(), deadline_after(opt_.timeout), describe()))
        throw CommError(detail::cat(describe(), ": sending the request for '", key, "' timed out"));
    } catch (...) {
      fd_.reset();
      throw;
    }
  }
  void receive(void* data, std::size_t n, std::string const& key, detail::StoreClock::time_point deadline) {
    try {
      if (!detail::recv_exact(fd_.get(), data, n, deadline, describe()))
        throw CommError(detail::cat(describe(), ": no reply for '", key, "' in time"));
    } catch (...) {
      fd_.reset();
      throw;
    }
  }

  Options opt_;
  detail::Fd fd_;
};

// Serves the TCPStore protocol on a port, from a thread of its own, until destroyed. Port 0 picks a free one
// (port() says which). Binding a port another process holds is a CommError naming the port.
class TcpStoreServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // the address to listen on
    int port = 0;
  };

  explicit TcpStoreServer(Options opt) : opt_(std::move(opt)) {
    if (opt_.port < 0 || opt_.port > 65535)
      throw ArgumentError(detail::cat("TcpStoreServer: port ", opt_.port, " is outside [0, 65535]"));
    listen_ = bind_listen();
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      throw CommError(detail::cat("TcpStoreServer: pipe: ", std::strerror(errno)));
    wake_read_ = detail::Fd(fds[0]);
    wake_write_ = detail::Fd(fds[1]);
    thread_ = std::thread([this] { serve(); });
  }
  TcpStoreServer(TcpStoreServer const&) = delete;
  TcpStoreServer& operator=(TcpStoreServer const&) = delete;
  ~TcpStoreServer() {
    stop_.store(true);
    char c = 1;
    [[maybe_unused]] auto k = ::write(wake_write_.get(), &c, 1);
    if (thread_.joinable()) thread_.join();
  }

  int port() const noexcept { return port_; }
  // Requests that were not the protocol (their connections were closed).
  std::int64_t rejected() const noexcept { return rejected_.load(); }

 private:
  struct Client {
    detail::Fd fd;
    std::vector<char> in;              // bytes received, not yet a whole request
    std::vector<std::string> waiting;  // WAIT keys still missing
    bool closing = false;
  };

  detail::Fd bind_listen() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    std::string const service = std::to_string(opt_.port);
    if (int rc = ::getaddrinfo(opt_.host.c_str(), service.c_str(), &hints, &res); rc != 0)
      throw ArgumentError(detail::cat("TcpStoreServer: cannot resolve '", opt_.host, "': ", ::gai_strerror(rc)));
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> hold(res, ::freeaddrinfo);
    std::string last;
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      detail::Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd) continue;
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
        last = std::strerror(errno);
        continue;
      }
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
      port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      return fd;
    }
    throw CommError(detail::cat("TcpStoreServer: cannot listen on ", opt_.host, ":", opt_.port, " (", last,
                                "); another job may hold the port: give each job its own MASTER_PORT"));
  }

  void serve() {
    std::vector<pollfd> fds;
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({listen_.get(), POLLIN, 0});
      fds.push_back({wake_read_.get(), POLLIN, 0});
      for (auto const& c : clients_) fds.push_back({c->fd.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
      if (fds[0].revents & POLLIN) accept_all();
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(*clients_[i - 2]);
      std::erase_if(clients_, [](auto const& c) { return c->closing; });
    }
  }

  void accept_all() {
    for (;;) {
      int const fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Client>();
      c->fd = detail::Fd(fd);
      clients_.push_back(std::move(c));
    }
  }

  void read_from(Client& c) {
    char buf[65536];
    for (;;) {
      ssize_t const k = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (k > 0) {
        c.in.insert(c.in.end(), buf, buf + k);
        continue;
      }
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.closing = true;
      break;
    }
    while (!c.closing && handle_one(c)) {}
  }

  // A cursor over a client's buffered bytes; nullopt-like `ok == false` when the request is not complete yet.
  struct Reader {
    std::vector<char> const& in;
    std::size_t at = 0;
    bool ok = true, bad = false;
    std::uint64_t u64() {
      if (!ok || in.size() - at < 8) return ok = false, 0;
      std::uint64_t v;
      std::memcpy(&v, in.data() + at, 8);
      at += 8;
      return v;
    }
    std::string bytes() {
      std::uint64_t const n = u64();
      if (!ok) return {};
      if (n > kMaxStoreBytes) return bad = true, ok = false, std::string();
      if (in.size() - at < n) return ok = false, std::string();
      std::string s(in.data() + at, n);
      at += n;
      return s;
    }
  };

  // Handles the first whole request in c.in, if there is one; false when more bytes are needed (or c closes).
  bool handle_one(Client& c) {
    if (c.in.empty() || !c.waiting.empty()) return false;  // a waiting client sends nothing until answered
    auto const q = static_cast<std::uint8_t>(c.in[0]);
    Reader r{c.in, 1};
    auto reject = [&] {
      rejected_.fetch_add(1);
      c.closing = true;
      return false;
    };
    switch (static_cast<detail::StoreQuery>(q)) {
      case detail::StoreQuery::kSet: {
        std::string key = r.bytes(), value = r.bytes();
        if (!r.ok) return r.bad ? reject() : false;
        data_[key] = std::vector<char>(value.begin(), value.end());
        consume(c, r.at);
        wake_waiters();
        return true;
      }
      case detail::StoreQuery::kCompareSet: {
        std::string key = r.bytes(), expected = r.bytes(), desired = r.bytes();
        if (!r.ok) return r.bad ? reject() : false;
        auto it = data_.find(key);
        std::vector<char> out;
        if (it == data_.end() && expected.empty()) {
          out = data_[key] = std::vector<char>(desired.begin(), desired.end());
        } else if (it != data_.end() && std::string(it->second.begin(), it->second.end()) == expected) {
          out = it->second = std::vector<char>(desired.begin(), desired.end());
        } else {
          out = it == data_.end() ? std::vector<char>(expected.begin(), expected.end()) : it->second;
        }
        consume(c, r.at);
        reply_vec(c, out);
        wake_waiters();
        return true;
      }
      case detail::StoreQuery::kGet: {
        std::string key = r.bytes();
        if (!r.ok) return r.bad ? reject() : false;
        consume(c, r.at);
        auto it = data_.find(key);
        reply_vec(c, it == data_.end() ? std::vector<char>() : it->second);
        return true;
      }
      case detail::StoreQuery::kAdd: {
        std::string key = r.bytes();
        auto const delta = static_cast<std::int64_t>(r.u64());
        if (!r.ok) return r.bad ? reject() : false;
        std::int64_t v = 0;
        if (auto it = data_.find(key); it != data_.end()) v = parse_int(it->second);
        v += delta;
        std::string const text = std::to_string(v);
        data_[key] = std::vector<char>(text.begin(), text.end());
        consume(c, r.at);
        reply(c, &v, 8);
        wake_waiters();
        return true;
      }
      case detail::StoreQuery::kCheck:
      case detail::StoreQuery::kWait: {
        std::uint64_t const n = r.u64();
        if (r.ok && n > 1 << 20) return reject();
        std::vector<std::string> keys;
        for (std::uint64_t i = 0; r.ok && i < n; ++i) keys.push_back(r.bytes());
        if (!r.ok) return r.bad ? reject() : false;
        consume(c, r.at);
        std::erase_if(keys, [&](std::string const& k) { return data_.count(k) > 0; });
        if (static_cast<detail::StoreQuery>(q) == detail::StoreQuery::kCheck) {
          std::uint8_t const ready = keys.empty() ? 0 : 1;
          reply(c, &ready, 1);
        } else if (keys.empty()) {
          std::uint8_t const stop = 0;
          reply(c, &stop, 1);
        } else {
          c.waiting = std::move(keys);
        }
        return true;
      }
      case detail::StoreQuery::kNumKeys: {
        consume(c, 1);
        auto const n = static_cast<std::int64_t>(data_.size());
        reply(c, &n, 8);
        return true;
      }
      case detail::StoreQuery::kDeleteKey: {
        std::string key = r.bytes();
        if (!r.ok) return r.bad ? reject() : false;
        consume(c, r.at);
        auto const n = static_cast<std::int64_t>(data_.erase(key));
        reply(c, &n, 8);
        return true;
      }
      default:
        return reject();  // WATCH_KEY (unused by ddp) and anything that is not the protocol
    }
  }

  static std::int64_t parse_int(std::vector<char> const& v) {
    std::int64_t x = 0;
    bool neg = false;
    std::size_t i = 0;
    if (!v.empty() && v[0] == '-') neg = true, i = 1;
    for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) x = x * 10 + (v[i] - '0');
    return neg ? -x : x;
  }
  static void consume(Client& c, std::size_t n) { c.in.erase(c.in.begin(), c.in.begin() + static_cast<long>(n)); }
  // Replies block briefly at most: a client that does not read its replies is dropped.
  void reply(Client& c, void const* data, std::size_t n) {
    try {
      if (!detail::send_exact(c.fd.get(), data, n, detail::StoreClock::now() + std::chrono::seconds(5), "store"))
        c.closing = true;
    } catch (CommError const&) {
      c.closing = true;
    }
  }
  void reply_vec(Client& c, std::vector<char> const& v) {
    std::vector<char> out(8 + v.size());
    std::uint64_t const n = v.size();
    std::memcpy(out.data(), &n, 8);
    std::copy(v.begin(), v.end(), out.begin() + 8);
    reply(c, out.data(), out.size());
  }
  void wake_waiters() {
    for (auto& c : clients_) {
      if (c->waiting.empty() || c->closing) continue;
      std::erase_if(c->waiting, [&](std::string const& k) { return data_.count(k) > 0; });
      if (c->waiting.empty()) {
        std::uint8_t const stop = 0;
        reply(*c, &stop, 1);
        while (!c->closing && handle_one(*c)) {}
      }
    }
  }

  Options opt_;
  int port_ = 0;
  detail::Fd listen_, wake_read_, wake_write_;
  std::vector<std::unique_ptr<Client>> clients_;  // the server thread's only
  std::map<std::string, std::vector<char>> data_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> rejected_{0};
  std::thread thread_;
};

}  // namespace ddp
