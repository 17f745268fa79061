// TcpStoreServer: serves PyTorch's TCPStore protocol (tcp_store.hpp describes it), both versions at once, so ddp ranks
// (TcpStore) and PyTorch 1.x and 2.x clients can all join it: rank 0's store when no launcher provides one. It reads
// the first bytes of each connection: VALIDATE's 5 bytes make it a 2.x client, anything else 1.x.
// One thread polls every connection; a request that is not the protocol (an unknown query type, a length beyond
// kMaxStoreBytes) closes that connection only, so garbage sent to the port leaves the job running.
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
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/rendezvous/tcp_store.hpp"
#include "ddp/error.hpp"

namespace ddp {

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
