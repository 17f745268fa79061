// Timeline: per-rank spans (forward, backward, each bucket's all-reduce, optimizer step) written as a
// Chrome/Perfetto trace-event JSON file (open in ui.perfetto.dev or chrome://tracing).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

// Thread-safe: the rank's thread and its communication progress thread may both add spans. Times are
// microseconds since the timeline's creation (steady clock). Lanes become trace "threads" (tid), e.g.
// lane 0 = compute, lane 1 = communication, so overlap is visible as parallel bars.
class Timeline {
 public:
  using clock = std::chrono::steady_clock;
  enum Lane : int { kCompute = 0, kComm = 1 };

  explicit Timeline(int rank = 0, clock::time_point origin = clock::now()) : rank_(rank), origin_(origin) {}

  void add(std::string_view name, std::string_view category, clock::time_point begin, clock::time_point end,
           int lane = kCompute) {
    std::lock_guard lock(mu_);
    events_.push_back({std::string(name), std::string(category), us(begin), us(end) - us(begin), lane});
  }
  // RAII span on the compute lane: `{ auto s = timeline.scope("forward", "step"); ... }`.
  class Scope {
   public:
    Scope(Timeline* t, std::string_view name, std::string_view cat, int lane)
        : t_(t), name_(name), cat_(cat), lane_(lane), begin_(clock::now()) {}
    ~Scope() {
      if (t_) t_->add(name_, cat_, begin_, clock::now(), lane_);
    }
    Scope(Scope const&) = delete;
    Scope& operator=(Scope const&) = delete;

   private:
    Timeline* t_;
    std::string name_, cat_;
    int lane_;
    clock::time_point begin_;
  };
  Scope scope(std::string_view name, std::string_view category = "compute", int lane = kCompute) {
    return Scope(this, name, category, lane);
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return events_.size();
  }
  // The spans recorded so far, in the order they were added (times in microseconds since the origin).
  struct Span {
    std::string name, category;
    double begin_us, duration_us;
    int lane;
  };
  std::vector<Span> spans() const {
    std::lock_guard lock(mu_);
    std::vector<Span> out;
    out.reserve(events_.size());
    for (auto const& e : events_) out.push_back({e.name, e.cat, e.ts, e.dur, e.lane});
    return out;
  }
  int rank() const noexcept { return rank_; }

  // Trace-event JSON ("X" complete events; pid = rank, tid = lane, with names for both).
  void write_json(std::ostream& os) const {
    std::lock_guard lock(mu_);
    os << "{\"traceEvents\":[\n";
    os << R"({"name":"process_name","ph":"M","pid":)" << rank_ << R"(,"args":{"name":"rank )" << rank_ << "\"}}";
    for (int lane : {kCompute, kComm})
      os << ",\n"
         << R"({"name":"thread_name","ph":"M","pid":)" << rank_ << ",\"tid\":" << lane << R"(,"args":{"name":")"
         << (lane == kCompute ? "compute" : "communication") << "\"}}";
    for (auto const& e : events_) {
      os << ",\n{\"name\":\"" << escape(e.name) << "\",\"cat\":\"" << escape(e.cat) << "\",\"ph\":\"X\",\"ts\":" << e.ts
         << ",\"dur\":" << e.dur << ",\"pid\":" << rank_ << ",\"tid\":" << e.lane << "}";
    }
    os << "\n],\"displayTimeUnit\":\"ms\"}\n";
  }
  void write_json(std::string const& path) const {
    std::ofstream f(path);
    if (!f) throw IoError(detail::cat("cannot write timeline file ", path));
    write_json(f);
    if (!f) throw IoError(detail::cat("error writing timeline file ", path));
  }

 private:
  struct Event {
    std::string name, cat;
    double ts, dur;
    int lane;
  };
  double us(clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }
  static std::string escape(std::string const& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) o += c;
    }
    return o;
  }

  int rank_;
  clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace ddp
