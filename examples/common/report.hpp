// What the examples print and read besides training: paths given relative to where `bazel run` was called,
// numbers with thousands separators, a digest of a model's weights, and --bucket-cap-mb auto (the cost model's
// cap, with a line saying how it was chosen).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tune/tune.hpp"

namespace ddp::examples {

// A path given on the command line, relative to where the user ran `bazel run` (not the runfiles tree).
inline std::filesystem::path user_path(std::string const& s) {
  if (s.empty()) return {};
  std::filesystem::path p(s);
  if (char const* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd && p.is_relative()) p = std::filesystem::path(wd) / p;
  return p;
}

// Creates directory `d` (and its parents) unless empty; ArgumentError naming it and `program` where it cannot.
inline void make_directory(std::filesystem::path const& d, std::string const& program) {
  std::error_code ec;
  if (!d.empty() && !std::filesystem::create_directories(d, ec) && ec)
    throw ArgumentError(detail::cat(program, ": cannot create directory ", d.string(), ": ", ec.message()));
}

// 1199882 -> "1,199,882".
inline std::string thousands(std::int64_t v) {
  std::string const digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// FNV-1a (64 bits) of the parameters' bytes in registration order: two runs' final weights at a glance.
template <nn::Model M>
std::string weights_digest(M const& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto const& p : model.named_parameters()) {
    Tensor<float> const host = to_space<HostSpace>(p.var.value());
    auto const* b = reinterpret_cast<unsigned char const*>(host.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(host.numel()) * sizeof(float); ++i)
      h = (h ^ b[i]) * 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// --bucket-cap-mb auto: the cost model's cap for this model, backend and layout (tune_bucket_cap: calibrate, or
// read `calibration_cache`; profile a few steps on this rank's first local batch of `data`). The model is left as
// it was, so the run trains as one given the chosen cap on the command line. Rank 0 says what was chosen.
template <class Comm, nn::Model M, class D>
SizeCapped auto_bucket_cap(Comm& comm, M& model, D const& data, std::int64_t global_batch,
                           std::string const& calibration_cache) {
  std::int64_t const local = global_batch / comm.world_size();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(std::min(local, data.size())));
  for (std::size_t i = 0; i < idx.size(); ++i)
    idx[i] = (static_cast<std::int64_t>(comm.rank()) * local + static_cast<std::int64_t>(i)) % data.size();
  auto const batch = data.collate(idx);
  TunedBucketCap const t =
      tune_bucket_cap(model, comm, [&](auto& ddp) { return cross_entropy(ddp(Var(batch.x)), batch.y); },
                      {.calibrate = {.cache = calibration_cache}});
  if (comm.rank() == 0) {
    double at_default = 0;
    std::size_t buckets = 0;
    for (auto const& c : t.choice.tried) {
      if (c.config.cap_bytes == kDefaultBucketCapBytes) at_default = c.prediction.step;
      if (c.config.cap_bytes == t.choice.config.cap_bytes) buckets = c.buckets;
    }
    std::string const timing =
        t.timing == CalibrationTiming::kBetweenSteps
            ? std::to_string(t.between_steps.size()) + " sizes probed again between the profiling steps"
            : "no probe between the profiling steps: a node has more ranks than CPUs";
    std::printf(
        "bucket cap: auto chose %.4g MiB, %zu buckets (predicted %.3f ms per step without the update, %.3f ms at 25 "
        "MiB; %s for %s; %s)\n",
        double(t.choice.config.cap_bytes) / double(1 << 20), buckets, t.choice.prediction.step * 1e3, at_default * 1e3,
        t.calibration.from_cache ? "calibration from the cache" : "calibrated", t.calibration.key.c_str(),
        timing.c_str());
  }
  return t.bucketer();
}

}  // namespace ddp::examples
