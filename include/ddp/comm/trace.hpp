// Collective tracing: DDP_TRACE_COLLECTIVES=1 prints one line per collective per rank (rank, op, count,
// dtype, reduce op, tag), formatted without allocation; every backend owns a Tracer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "ddp/comm/communicator.hpp"

namespace ddp {

// One collective as issued by one rank (what the trace prints and Recording<C> stores).
struct CollectiveRecord {
  int rank = 0;
  CollectiveKind op = CollectiveKind::kBarrier;
  std::size_t count = 0;  // elements of the call's main buffer (all_reduce/broadcast: buf; others: in)
  Dtype dtype = Dtype::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;  // meaningful for all_reduce / reduce_scatter
  int root = -1;                     // broadcast / gather / scatter
  CollectiveTag tag{};
  bool async = false;
};

// Whether tracing is on for this process: DDP_TRACE_COLLECTIVES set to anything but "", "0" or "false".
inline bool trace_enabled_from_env() noexcept {
  char const* v = std::getenv("DDP_TRACE_COLLECTIVES");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0;
}

// "ddp-trace rank=1 op=all_reduce count=1024 dtype=float32 reduce=avg tag=bucket:3 async=1" into buf
// (truncated to size); returns the length written. No allocation.
inline std::size_t format_record(CollectiveRecord const& r, char* buf, std::size_t size) noexcept {
  auto const op = name(r.op);
  auto const dt = name(r.dtype);
  int n = std::snprintf(buf, size, "ddp-trace rank=%d op=%.*s count=%zu dtype=%.*s", r.rank,
                        static_cast<int>(op.size()), op.data(), r.count, static_cast<int>(dt.size()), dt.data());
  auto append = [&](char const* fmt, auto... args) {
    if (n >= 0 && static_cast<std::size_t>(n) < size) n += std::snprintf(buf + n, size - n, fmt, args...);
  };
  if (r.op == CollectiveKind::kAllReduce || r.op == CollectiveKind::kReduceScatter) {
    auto const red = name(r.reduce);
    append(" reduce=%.*s", static_cast<int>(red.size()), red.data());
  }
  if (r.root >= 0) append(" root=%d", r.root);
  if (r.tag.empty()) {
    append("%s", " tag=-");
  } else {
    append(" tag=%.*s", static_cast<int>(r.tag.label.size()), r.tag.label.data());
    if (r.tag.id >= 0) append("%s%lld", r.tag.label.empty() ? "" : ":", static_cast<long long>(r.tag.id));
  }
  if (r.async) append("%s", " async=1");
  append(" bytes=%zu", r.count * size_of(r.dtype));  // the buffer this rank passes, in its wire type
  if (n < 0) return 0;
  return static_cast<std::size_t>(n) < size ? static_cast<std::size_t>(n) : size - 1;
}

inline std::string to_string(CollectiveRecord const& r) {
  char buf[256];
  return std::string(buf, format_record(r, buf, sizeof buf));
}

// Where a backend's trace goes. `enabled` defaults to the environment variable; `sink` to stderr.
struct TraceOptions {
  bool enabled = trace_enabled_from_env();
  std::FILE* sink = nullptr;  // nullptr: stderr
};

namespace detail {

// A tag as error messages show it: " [bucket:3]", " [bucket]", " [3]", or "" for no tag.
inline std::string tag_suffix(CollectiveTag tag) {
  if (tag.empty()) return {};
  std::string s = " [";
  s += tag.label;
  if (tag.id >= 0) {
    if (!tag.label.empty()) s += ':';
    s += std::to_string(tag.id);
  }
  s += ']';
  return s;
}

// Held by each backend: one branch per collective when off; one line, written with a single fwrite, when on.
class Tracer {
 public:
  Tracer() = default;
  explicit Tracer(TraceOptions const& o) noexcept : enabled_(o.enabled), sink_(o.sink ? o.sink : stderr) {}
  bool enabled() const noexcept { return enabled_; }
  void operator()(CollectiveRecord const& r) const noexcept {
    if (!enabled_) return;
    char buf[320];
    std::size_t n = format_record(r, buf, sizeof buf - 1);
    buf[n++] = '\n';
    std::fwrite(buf, 1, n, sink_);
    std::fflush(sink_);
  }

 private:
  bool enabled_ = false;
  std::FILE* sink_ = stderr;
};

}  // namespace detail

}  // namespace ddp
