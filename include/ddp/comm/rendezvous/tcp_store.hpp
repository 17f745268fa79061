// TcpStore and TcpStoreServer: a Store over TCP that speaks PyTorch's TCPStore wire protocol (c10d), in both of its
// versions, so a ddp rank joins the store torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE) as PyTorch's own
// workers do, and PyTorch clients can join a TcpStoreServer:
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
// GETNUMKEYS alone; the one that gets a key count back names the protocol (against 1.x the first costs 200 ms). A service that answers neither is named as not a TCPStore.
// The server reads the first bytes of each connection: VALIDATE's 5 bytes make it a 2.x client, anything else 1.x.
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

namespace detail {}  // namespace detail

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
    StoreProtocol protocol = StoreProtocol::kDetect;  // known from its first bytes
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
    if (c.in.empty()) return false;
    auto reject = [&] {
      rejected_.fetch_add(1);
      c.closing = true;
      return false;
    };
    if (c.protocol == StoreProtocol::kDetect) {  // VALIDATE's 5 bytes first: a 2.x client; anything else: 1.x
      std::size_t const n = std::min<std::size_t>(c.in.size(), sizeof detail::kStoreValidate);
      if (std::memcmp(c.in.data(), detail::kStoreValidate, n) != 0) {
        c.protocol = StoreProtocol::kTorch1;
      } else {
        if (n < sizeof detail::kStoreValidate) return false;
        consume(c, sizeof detail::kStoreValidate);
        c.protocol = StoreProtocol::kTorch2;
        return true;
      }
    }
    auto const b = static_cast<std::uint8_t>(c.in[0]);
    bool const v2 = c.protocol == StoreProtocol::kTorch2;
    if (!c.waiting.empty()) {  // a waiting client sends nothing until answered, but a 2.x one may cancel
      if (!v2 || b != static_cast<std::uint8_t>(detail::Torch2Query::kCancelWait)) return false;
      consume(c, 1);
      c.waiting.clear();
      std::uint8_t const canceled = 1;
      reply(c, &canceled, 1);
      return true;
    }
    Reader r{c.in, 1};
    if (v2 && b >= static_cast<std::uint8_t>(detail::Torch2Query::kAppend)) return handle_torch2(c, b, r);
    if (v2 && (b == 0 || b > 8)) return reject();  // a second VALIDATE, or not the protocol
    // The 1.x query this byte means (2.x moved SET ... GETNUMKEYS up by one; DELETE_KEY stayed 8).
    auto const q = !v2 || b == 8 ? b : static_cast<std::uint8_t>(b - 1);
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

  // PyTorch 2.x's additions: APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT (nothing to cancel: still answered), PING.
  bool handle_torch2(Client& c, std::uint8_t b, Reader& r) {
    auto reject = [&] {
      rejected_.fetch_add(1);
      c.closing = true;
      return false;
    };
    using Q = detail::Torch2Query;
    switch (static_cast<Q>(b)) {
      case Q::kAppend: {
        std::string key = r.bytes(), value = r.bytes();
        if (!r.ok) return r.bad ? reject() : false;
        auto& v = data_[key];
        if (v.size() + value.size() > kMaxStoreBytes) return reject();
        v.insert(v.end(), value.begin(), value.end());
        consume(c, r.at);
        wake_waiters();
        return true;
      }
      case Q::kMultiGet:
      case Q::kMultiSet: {
        std::uint64_t const n = r.u64();
        if (r.ok && n > 1 << 20) return reject();
        std::vector<std::pair<std::string, std::string>> kv;
        bool const set = static_cast<Q>(b) == Q::kMultiSet;
        for (std::uint64_t i = 0; r.ok && i < n; ++i) {
          std::string key = r.bytes();
          std::string value = set ? r.bytes() : std::string();
          kv.emplace_back(std::move(key), std::move(value));
        }
        if (!r.ok) return r.bad ? reject() : false;
        consume(c, r.at);
        if (set) {
          for (auto& [k, v] : kv) data_[k] = std::vector<char>(v.begin(), v.end());
          wake_waiters();
          return true;
        }
        std::vector<char> out;
        for (auto const& [k, unused] : kv) {
          auto const it = data_.find(k);
          std::uint64_t const len = it == data_.end() ? 0 : it->second.size();
          char l[8];
          std::memcpy(l, &len, 8);
          out.insert(out.end(), l, l + 8);
          if (len) out.insert(out.end(), it->second.begin(), it->second.end());
        }
        reply(c, out.data(), out.size());
        return true;
      }
      case Q::kCancelWait: {
        consume(c, 1);
        std::uint8_t const canceled = 1;
        reply(c, &canceled, 1);
        return true;
      }
      case Q::kPing: {
        if (c.in.size() < 5) return false;
        char nonce[4];
        std::memcpy(nonce, c.in.data() + 1, 4);
        consume(c, 5);
        reply(c, nonce, 4);
        return true;
      }
      default:
        return reject();
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
