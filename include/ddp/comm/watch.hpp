// How backends watch their collectives, for every backend alike: the deadline one collective may wait for
// its peers before it fails (naming the operation, its sequence number, its tag and the ranks that did not
// arrive), the stall warning before it, and how thoroughly ranks check that they issue the same collectives.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/error.hpp"

namespace ddp {

// Ten minutes, as PyTorch's and Horovod's defaults: long enough for a slow first step or a checkpoint write
// on one rank, short enough that a stalled job ends the same hour.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(10);

// The environment variable that sets the timeout (in seconds, e.g. 30 or 2.5) where the program does not.
inline constexpr char const* kTimeoutEnvVar = "DDP_TIMEOUT";

// Every backend's options hold one: MpiOptions{.timeout = {.after = 30s}}.
struct TimeoutOptions {
  // The longest a collective waits for its peers. Unset: $DDP_TIMEOUT seconds if set, else 10 minutes.
  std::optional<std::chrono::milliseconds> after{};
  // The stall inspector warns once per collective that has waited this fraction of the timeout, naming the
  // ranks that have not arrived (as Horovod's stall check does). 0 turns the warning off.
  double warn_fraction = 0.5;
  // Where warnings go; empty: one line on stderr.
  std::function<void(std::string const&)> on_stall{};
};

// How ranks check that they issue the same collectives in the same order (same operation, count, element
// type, reduction, root and tag at each position). ThreadsBackend always checks every collective (it costs
// nothing in shared memory); MPI and NCCL choose:
//   kOnStall  free: a collective that stalls asks its peers what they are in, so a divergence that hangs is
//             reported at the stall warning and the timeout, showing both sides
//   kEvery    before every collective the ranks compare a digest of it (one extra 16-byte all-reduce); a
//             mismatch raises on every rank, showing each rank's call. PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL.
enum class CollectiveChecks { kOnStall, kEvery };

// The environment variable that turns on kEvery where the program did not choose: DDP_DEBUG=DETAIL (OFF or
// INFO: kOnStall).
inline constexpr char const* kDebugEnvVar = "DDP_DEBUG";

namespace detail {

// The checks a backend runs: its option if set, else $DDP_DEBUG, else kOnStall.
inline CollectiveChecks resolve(std::optional<CollectiveChecks> chosen) {
  if (chosen) return *chosen;
  char const* v = std::getenv(kDebugEnvVar);
  if (v == nullptr || *v == '\0') return CollectiveChecks::kOnStall;
  std::string_view const s(v);
  if (s == "DETAIL" || s == "detail") return CollectiveChecks::kEvery;
  if (s == "OFF" || s == "off" || s == "INFO" || s == "info") return CollectiveChecks::kOnStall;
  throw ArgumentError(cat("ddp: ", kDebugEnvVar, "='", s, "' is not one of OFF, INFO, DETAIL"));
}

// A TimeoutOptions with the environment and defaults applied, read once when a backend is built.
struct Deadlines {
  std::chrono::nanoseconds timeout{};  // > 0
  std::chrono::nanoseconds warn{};     // 0: no warning; else < timeout
  std::function<void(std::string const&)> on_stall{};

  void warn_stall(std::string const& message) const {
    if (on_stall) {
      on_stall(message);
    } else {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
    }
  }
};

// Seconds with at most one decimal, for messages: "10 s", "2.5 s", "0.2 s".
inline std::string seconds_text(std::chrono::nanoseconds d) {
  double const s = std::chrono::duration<double>(d).count();
  char buf[32];
  if (s == std::floor(s))
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s >= 0.1)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  return buf;
}

// The one wording of a stall warning, every backend's: "ddp <backend>: warning: <call> on rank R of N has waited W
// <who>; it fails at T (the collective timeout)". `who` says what is missing, as far as the backend knows: " for
// rank 1" (threads), " for its peers" (Gloo), ": rank 1 has not arrived (...)" (MPI, NCCL: detail::PeerReport).
inline std::string stall_warning(std::string_view backend, std::string_view call, int rank, int world,
                                 Deadlines const& d, std::string_view who) {
  return cat("ddp ", backend, ": warning: ", call, " on rank ", rank, " of ", world, " has waited ",
             seconds_text(d.warn), who, "; it fails at ", seconds_text(d.timeout), " (the collective timeout)");
}

// The value of $DDP_TIMEOUT, if set: a positive number of seconds; anything else is an ArgumentError that
// names the variable and the value.
inline std::optional<std::chrono::nanoseconds> timeout_from_env() {
  char const* v = std::getenv(kTimeoutEnvVar);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  double const s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 365.0 * 24 * 3600) {
    throw ArgumentError(cat("ddp: ", kTimeoutEnvVar, "='", v,
                            "' is not a timeout: give a positive number of seconds (e.g. 600 or 2.5)"));
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

inline Deadlines resolve(TimeoutOptions const& o, std::string_view backend) {
  Deadlines d;
  if (o.after) {
    if (o.after->count() <= 0) {
      throw ArgumentError(
          cat("ddp ", backend, ": the collective timeout must be positive, got ", o.after->count(), " ms"));
    }
    d.timeout = *o.after;
  } else if (auto env = timeout_from_env()) {
    d.timeout = *env;
  } else {
    d.timeout = kDefaultCollectiveTimeout;
  }
  if (!(o.warn_fraction >= 0 && o.warn_fraction < 1)) {
    throw ArgumentError(
        cat("ddp ", backend, ": TimeoutOptions::warn_fraction must be in [0, 1), got ", o.warn_fraction));
  }
  d.warn = std::chrono::duration_cast<std::chrono::nanoseconds>(d.timeout * o.warn_fraction);
  d.on_stall = o.on_stall;
  return d;
}

// "rank 1" / "ranks 1, 3": for messages about who did not arrive.
template <class Range>
std::string rank_list(Range const& ranks) {
  std::string s;
  int n = 0;
  for (int r : ranks) {
    s += cat(n == 0 ? "" : ", ", r);
    ++n;
  }
  return cat(n == 1 ? "rank " : "ranks ", s);
}

}  // namespace detail
}  // namespace ddp
