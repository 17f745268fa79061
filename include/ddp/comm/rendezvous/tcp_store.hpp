// TcpStore: a Store over TCP that speaks PyTorch's TCPStore wire protocol (c10d), in both of its versions, so a ddp
// rank joins the store torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE) as PyTorch's own workers do, and the
// one a TcpStoreServer (tcp_store_server.hpp) serves. The protocol, which both sides share:
//  - PyTorch 1.x (1.13): one byte of query type per request, SET = 0 ... GETNUMKEYS = 6, WATCH_KEY = 7,
//    DELETE_KEY = 8;
//  - PyTorch 2.x (the TCPStoreBackend of 2.2 and later, both its classic and its libuv server): every connection
//    opens with VALIDATE (query 0 and the 4-byte magic 0x3C85F7CE, no reply); the query types after it moved up by
//    one (SET = 1 ... GETNUMKEYS = 7), DELETE_KEY stayed 8, and APPEND = 9, MULTI_GET = 10, MULTI_SET = 11,
//    CANCEL_WAIT = 12, PING = 13 (an echoed 4-byte nonce) were added. A 2.x server closes, or ignores, a
//    connection whose first request is not VALIDATE; a 1.x server reads VALIDATE as a SET with a key of gigabytes.
// Fields, in both: strings and byte vectors as a native-endian uint64 length followed by the bytes, integers as
// native-endian int64. SET (key, value) has no reply; GET (key) replies with the value; ADD (key, delta) with the new
// value; CHECK (n, keys) and WAIT (n, keys) with one byte (CHECK: 0 ready, 1 not; WAIT: 0 once every key exists). A
// client waits for a key before getting it.
// The client finds out which protocol the server speaks (StoreProtocol::kDetect) with two probes on throw-away
// connections, one after the other, each harmless to the other version: VALIDATE then 2.x's GETNUMKEYS, and 1.x's
// GETNUMKEYS alone; the one that gets a key count back names the protocol (against 1.x the first costs 200 ms). A
// service that answers neither is named as not a TCPStore.
// Every client call runs under a deadline and throws CommError naming the store and the key.
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
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/rendezvous/store.hpp"
#include "ddp/error.hpp"

namespace ddp {

// The largest key or value either side accepts (a rendezvous moves addresses and ids: bytes, not megabytes).
inline constexpr std::uint64_t kMaxStoreBytes = std::uint64_t{64} << 20;

// Which version of PyTorch's TCPStore protocol a TcpStore speaks (see the top of this file).
enum class StoreProtocol {
  kDetect,  // probe the server when connecting
  kTorch1,  // PyTorch 1.x (1.13)
  kTorch2,  // PyTorch 2.x (2.2 and later: VALIDATE first)
};
inline char const* name(StoreProtocol p) noexcept {
  return p == StoreProtocol::kTorch1 ? "PyTorch 1.x" : p == StoreProtocol::kTorch2 ? "PyTorch 2.x" : "detect";
}

namespace detail {

// The queries ddp uses, by their 1.x numbers (query_byte gives the wire byte for a protocol).
enum class StoreQuery : std::uint8_t { kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDeleteKey };
// PyTorch 2.x's query bytes (TCPStoreBackend.hpp's QueryType).
enum class Torch2Query : std::uint8_t {
  kValidate = 0,
  kSet = 1,  // ... kNumKeys = 7: the 1.x queries moved up by one
  kNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
};
inline constexpr std::uint32_t kStoreValidateMagic = 0x3C85F7CE;
// VALIDATE with its magic, as a 2.x client sends it first on every connection (no reply).
inline constexpr unsigned char kStoreValidate[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};

inline std::uint8_t query_byte(StoreQuery q, StoreProtocol p) noexcept {
  auto const v = static_cast<std::uint8_t>(q);
  if (p != StoreProtocol::kTorch2) return v;
  return q == StoreQuery::kDeleteKey ? std::uint8_t{8} : static_cast<std::uint8_t>(v + 1);
}

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
  StoreRequest(StoreQuery q, StoreProtocol p) { bytes.push_back(static_cast<char>(query_byte(q, p))); }
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

// Which protocol the TCPStore at host:port speaks: two probes, each on a connection of its own and harmless to a
// server of the other version: 2.x's VALIDATE then its key count (a 1.x server reads the magic as the start of a
// key length and waits for the rest: closing the probe frees it), then 1.x's key count (a 2.x server closes or
// ignores a connection that does not start with VALIDATE). One at a time, since PyTorch 1.x's server is one thread
// that a half-read request blocks. The probe that gets a plausible key count back (8 bytes, in [0, 2^40)) wins.
// Each gets 200 ms, then four times as long each round, until `window` (capped by the deadline) has passed, or both
// got an answer that is not a key count: CommError naming the address then, a service on that port that is not a
// TCPStore.
inline StoreProtocol detect_store_protocol(std::string const& host, int port, StoreClock::time_point deadline,
                                           std::chrono::milliseconds window, std::string const& what) {
  struct Probe {
    StoreProtocol protocol;
    std::vector<char> request;
    std::string outcome = "no reply";
    bool junk = false;  // it answered something that is not a key count: no TCPStore of that version
  };
  Probe probes[2] = {{StoreProtocol::kTorch2, {}}, {StoreProtocol::kTorch1, {}}};
  probes[0].request.assign(kStoreValidate, kStoreValidate + 5);
  probes[0].request.push_back(static_cast<char>(Torch2Query::kNumKeys));
  probes[1].request.push_back(static_cast<char>(StoreQuery::kNumKeys));
  // One probe for up to `wait`: true when it got a key count.
  auto ask = [&](Probe& p, std::chrono::milliseconds wait) {
    Fd fd = connect_tcp(host, port, deadline, what);
    if (!send_exact(fd.get(), p.request.data(), p.request.size(), deadline, what)) return false;
    auto const until = std::min(deadline, StoreClock::now() + wait);
    std::vector<char> reply;
    for (;;) {
      pollfd q{fd.get(), POLLIN, 0};
      if (::poll(&q, 1, ms_left(until)) <= 0) return false;  // no reply in time
      char buf[64];
      ssize_t const k = ::recv(fd.get(), buf, sizeof buf, 0);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (k <= 0) {
        p.outcome = k == 0 ? "closed the connection" : std::strerror(errno);
        return false;
      }
      reply.insert(reply.end(), buf, buf + k);
      if (reply.size() < 8) continue;
      std::int64_t count = -1;
      std::memcpy(&count, reply.data(), 8);
      if (reply.size() == 8 && count >= 0 && count < (std::int64_t{1} << 40)) return true;
      p.outcome = cat("replied with ", reply.size(), "+ bytes that are not a key count");
      p.junk = true;
      return false;
    }
  };
  auto const until = std::min(deadline, StoreClock::now() + window);
  for (auto wait = std::chrono::milliseconds(200); StoreClock::now() < until && !(probes[0].junk && probes[1].junk);
       wait *= 4)
    for (auto& p : probes)
      if (ask(p, wait)) return p.protocol;
  throw CommError(cat(what, ": the service on ", host, ":", port,
                      " does not speak PyTorch's TCPStore protocol (to PyTorch 2.x's VALIDATE and key count: ",
                      probes[0].outcome, "; to PyTorch 1.x's key count: ", probes[1].outcome,
                      "). Is MASTER_ADDR:MASTER_PORT another service's address? Give the job a free port"));
}

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
    // PyTorch 1.x's or 2.x's protocol, or probe the server for it when connecting (the default).
    StoreProtocol protocol = StoreProtocol::kDetect;
    // How long the probes may wait for a reply from a server that accepted the connections.
    std::chrono::milliseconds probe_window = std::chrono::seconds(10);
  };

  explicit TcpStore(Options opt) : opt_(std::move(opt)), protocol_(opt_.protocol) {
    if (opt_.port <= 0 || opt_.port > 65535)
      throw ArgumentError(detail::cat("TcpStore: port ", opt_.port, " is outside [1, 65535]"));
    connect();
  }

  void set(std::string const& key, std::vector<char> const& value) override {
    detail::StoreRequest r(detail::StoreQuery::kSet, protocol_);
    r.str(key).vec(value);
    send(r, key);
  }
  std::vector<char> get(std::string const& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    detail::StoreRequest r(detail::StoreQuery::kGet, protocol_);
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
    detail::StoreRequest r(detail::StoreQuery::kAdd, protocol_);
    r.str(key).i64(delta);
    send(r, key);
    std::int64_t v = 0;
    receive(&v, 8, key, deadline_after(opt_.timeout));
    return v;
  }
  bool check(std::vector<std::string> const& keys) override {
    detail::StoreRequest r(detail::StoreQuery::kCheck, protocol_);
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
    detail::StoreRequest r(detail::StoreQuery::kWait, protocol_);
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
  // The protocol spoken: Options::protocol, or what the probes found.
  StoreProtocol protocol() const noexcept { return protocol_; }

 private:
  static detail::StoreClock::time_point deadline_after(std::chrono::milliseconds t) {
    return detail::StoreClock::now() + t;
  }
  void connect() {
    auto const deadline = deadline_after(opt_.timeout);
    if (protocol_ == StoreProtocol::kDetect)
      protocol_ = detail::detect_store_protocol(opt_.host, opt_.port, deadline, opt_.probe_window, describe());
    fd_ = detail::connect_tcp(opt_.host, opt_.port, deadline, describe());
    if (protocol_ == StoreProtocol::kTorch2 &&
        !detail::send_exact(fd_.get(), detail::kStoreValidate, sizeof detail::kStoreValidate, deadline, describe())) {
      fd_.reset();
      throw CommError(detail::cat(describe(), ": sending VALIDATE timed out"));
    }
  }
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
  StoreProtocol protocol_;
  detail::Fd fd_;
};

}  // namespace ddp
