// The calibration cache (one line per backend, world size, layout and host) and calibrate(): the cached model
// where there is one, else the probes of probe.hpp, appended to the cache for the next run.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/tune/alpha_beta.hpp"
#include "ddp/tune/probe.hpp"

namespace ddp {

// The cache: one line per key, "alpha beta n [bytes seconds]*n overlap k [bytes compute comm]*k<TAB>key"
// (the probe's n points, and probe_overlap's k samples). Later lines win; unreadable lines are skipped, and so
// are lines without the overlap part (written before it was measured): such a key is probed again.
inline std::optional<AlphaBeta> load_calibration(std::string const& path, std::string const& key) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::optional<AlphaBeta> found;
  std::string line;
  while (std::getline(f, line)) {
    auto const tab = line.find('\t');
    if (tab == std::string::npos || line.substr(tab + 1) != key) continue;
    std::istringstream in(line.substr(0, tab));
    AlphaBeta m;
    std::size_t n = 0;
    if (!(in >> m.alpha >> m.beta >> n) || m.alpha < 0 || m.beta < 0) continue;
    bool ok = true;
    for (std::size_t i = 0; i < n && ok; ++i) {
      ProbeSample p;
      ok = static_cast<bool>(in >> p.bytes >> p.seconds) && p.seconds > 0 &&
           (m.curve.empty() || p.bytes > m.curve.back().bytes);
      m.curve.push_back(p);
    }
    std::string word;
    std::size_t k = 0;
    ok = ok && static_cast<bool>(in >> word >> k) && word == "overlap";
    auto const rate = [](double r) { return r > 0 && r <= 1; };
    for (std::size_t i = 0; i < k && ok; ++i) {
      OverlapSample o;
      ok = static_cast<bool>(in >> o.bytes >> o.compute >> o.comm) && rate(o.compute) && rate(o.comm) &&
           (m.overlap.curve.empty() || o.bytes > m.overlap.curve.back().bytes);
      m.overlap.curve.push_back(o);
    }
    if (ok) found = m;
  }
  return found;
}
namespace detail {
// 0 when `path` opens for appending (created if missing, as the append after a probe would), else the errno.
inline int append_errno(std::string const& path) noexcept {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f != nullptr && std::fclose(f) == 0) return 0;
  return errno != 0 ? errno : EIO;
}
}  // namespace detail

inline void save_calibration(std::string const& path, std::string const& key, AlphaBeta const& m) {
  if (int const e = detail::append_errno(path); e != 0)
    throw IoError(detail::cat("save_calibration: cannot append to ", path, ": ", std::strerror(e)));
  std::ofstream f(path, std::ios::app);
  f.precision(17);
  f << m.alpha << ' ' << m.beta << ' ' << m.curve.size();
  for (auto const& p : m.curve) f << ' ' << p.bytes << ' ' << p.seconds;
  f << " overlap " << m.overlap.curve.size();
  for (auto const& o : m.overlap.curve) f << ' ' << o.bytes << ' ' << o.compute << ' ' << o.comm;
  f << '\t' << key << '\n';
  if (!f) throw IoError(detail::cat("save_calibration: cannot append to ", path));
}

struct CalibrateOptions {
  std::string cache;  // file of earlier fits ("" : always probe, write nothing)
  ProbeOptions probe{};
  OverlapProbeOptions overlap{};
};

// Rank 0 looks the key up in the cache; every rank follows its answer (so all use one model): a cached fit
// is broadcast, otherwise every rank probes (probe_alpha_beta, then probe_overlap) and rank 0 appends the fit
// to the cache. A cache rank 0 cannot append to fails on every rank before the probes (IoError naming the file
// and the reason), not after them on rank 0 alone. A cached curve that stops
// short of the largest size asked for (opts.probe.sizes) counts as a miss: the probe runs and its line, appended
// later, wins, so a larger model never reads an extrapolated time from an earlier, smaller calibration.
template <AsyncCommunicator C>
Calibration calibrate(C& comm, CalibrateOptions const& opts = {}) {
  std::string const key = calibration_key(comm);
  // Rank 0's find: alpha, beta, the curve's point count and (bytes, seconds) pairs, then the overlap's
  // (bytes, compute, comm) triples.
  std::vector<double> cached;
  if (comm.rank() == 0 && !opts.cache.empty()) {
    std::size_t const wanted =
        opts.probe.sizes.empty() ? 0 : *std::max_element(opts.probe.sizes.begin(), opts.probe.sizes.end());
    auto m = load_calibration(opts.cache, key);
    if (m && !m->curve.empty() && m->curve.back().bytes < wanted) m.reset();
    if (m) {
      cached = {m->alpha, m->beta, static_cast<double>(m->curve.size())};
      for (auto const& p : m->curve) cached.push_back(static_cast<double>(p.bytes)), cached.push_back(p.seconds);
      for (auto const& o : m->overlap.curve)
        cached.insert(cached.end(), {static_cast<double>(o.bytes), o.compute, o.comm});
    }
  }
  // The count of cached values, or minus the errno of a cache that a probe's fit could not be appended to.
  double size = static_cast<double>(cached.size());
  if (comm.rank() == 0 && !opts.cache.empty() && cached.empty()) {
    if (int const e = detail::append_errno(opts.cache); e != 0) size = -static_cast<double>(e);
  }
  host_broadcast(comm, std::span<double>(&size, 1), 0);
  if (size < 0) {
    throw IoError(detail::cat("calibrate: rank 0 cannot append to the calibration cache ", opts.cache, ": ",
                              std::strerror(static_cast<int>(-size)), " (nothing was probed)"));
  }
  if (size > 0) {
    cached.resize(static_cast<std::size_t>(size));
    host_broadcast(comm, std::span<double>(cached), 0);
    AlphaBeta m{cached[0], cached[1]};
    std::size_t const points = static_cast<std::size_t>(cached[2]);
    std::size_t i = 3;
    for (std::size_t k = 0; k < points; ++k, i += 2)
      m.curve.push_back({static_cast<std::size_t>(cached[i]), cached[i + 1]});
    for (; i + 2 < cached.size(); i += 3)
      m.overlap.curve.push_back({static_cast<std::size_t>(cached[i]), cached[i + 1], cached[i + 2]});
    return Calibration{key, std::move(m), {}, true};
  }
  Calibration cal = probe_alpha_beta(comm, opts.probe);
  cal.model.overlap = probe_overlap(comm, opts.overlap);
  if (comm.rank() == 0 && !opts.cache.empty()) save_calibration(opts.cache, key, cal.model);
  return cal;
}

}  // namespace ddp
