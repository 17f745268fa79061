// tune_bucket_cap: the bucket cap chosen by the cost model for a real model on a real communicator. Calibrates
// the backend (ddp/tune/calibration.hpp: a probe, or the cached fit), profiles a few DDP steps of the model at
// PyTorch's cap (when each gradient is ready, in the job's view: the slowest rank's), and returns the cap with
// the least predicted step (choose_bucket_cap, ddp/tune/cost_model.hpp), which the caller then builds its
// DDP or trainer with (TunedBucketCap::bucketer()). By default, where no node has more ranks than CPUs, the
// model it predicts with also holds a probe taken between the profiling steps (CalibrationTiming). PyTorch
// rebuilds its buckets from the first iteration's gradient order; this chooses their size as well, from what
// the backend and the model measure.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/autograd/backward.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tune/calibration.hpp"
#include "ddp/tune/cost_model.hpp"

namespace ddp {

// When the all-reduce times the choice is made with are measured.
enum class CalibrationTiming {
  // kBetweenSteps, unless some node has more ranks than CPUs (TuneOptions::node_cpus against the backend's
  // ranks_on_node(); a backend that cannot say counts as one rank per node): then kStartUp. Every rank resolves
  // it the same way (TunedBucketCap::timing says to what).
  kAuto,
  // calibrate() alone, before the profiling steps (or the cache): back-to-back repetitions. Where ranks
  // outnumber cores, a probe between steps times the ranks' contention for CPUs, not the network, and
  // over-predicts small models (bench/RESULTS.md, cost model).
  kStartUp,
  // Also, before every profiling step, one timed all-reduce of each of the calibration's sizes up to the first
  // that holds all the model's gradients (no bucket is larger); their medians (the slowest rank's) replace the
  // calibration's points at those sizes (with_probe_samples). An all-reduce right after compute can cost more
  // than back to back (twice as much for a small one across hosts), and this probe predicts such steps more
  // often within 20% than the start-up calibration (bench/RESULTS.md, cost model). Costs one all-reduce of each size per
  // profiling step: well under a millisecond for a small model, ~85 MB for one past 64 MiB.
  kBetweenSteps,
};

struct TuneOptions {
  CalibrateOptions calibrate{};  // the probe's sizes, and the cache file (a later run skips the probe)
  CalibrationTiming timing = CalibrationTiming::kAuto;
  // kAuto's CPUs per node; 0: std::thread::hardware_concurrency() on each rank, the node's online CPUs (a
  // container's CPU quota is not seen there: set it to the quota).
  int node_cpus = 0;
  DdpOptions ddp{};  // for the profiling DDP, e.g. find_unused_parameters as the real run has it
  int warmup = 2;    // untimed steps first (caches, the backend's first calls)
  int steps = 8;     // timed steps; the profile takes the median of each time over them
  std::vector<std::size_t> caps = default_candidate_caps();
};

struct TunedBucketCap {
  CapChoice choice;                        // the chosen config, its prediction, and every candidate's
  Calibration calibration;                 // at start-up (or from the cache)
  CalibrationTiming timing{};              // kStartUp or kBetweenSteps (what kAuto resolved to)
  std::vector<ProbeSample> between_steps;  // kBetweenSteps' probe, sizes ascending; empty with kStartUp
  AlphaBeta model;                         // what choice was made with: calibration's, between_steps in place
  BackwardProfile profile;  // measured at PyTorch's cap; update 0 (no optimizer runs: the same for every cap)
  SizeCapped bucketer() const { return SizeCapped{choice.config}; }
};

namespace detail {

// The job's ranks on this rank's node, where the backend can say; 1 where it cannot.
template <class C>
int ranks_on_node(C const& comm) {
  if constexpr (requires {
                  { comm.ranks_on_node() } -> std::convertible_to<int>;
                }) {
    return comm.ranks_on_node();
  } else {
    return 1;
  }
}

// CalibrationTiming::kAuto resolved, the same on every rank (collective when kAuto).
template <class C>
CalibrationTiming resolve_timing(C& comm, TuneOptions const& opts) {
  if (opts.timing != CalibrationTiming::kAuto) return opts.timing;
  int const cpus =
      opts.node_cpus > 0 ? opts.node_cpus : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double crowded[1] = {ranks_on_node(comm) > cpus ? 1.0 : 0.0};
  host_all_reduce(comm, std::span<double>(crowded), ReduceOp::kMax);
  return crowded[0] > 0 ? CalibrationTiming::kStartUp : CalibrationTiming::kBetweenSteps;
}

}  // namespace detail

// Collective: every rank calls it with the same model (as DistributedDataParallel requires), the same options,
// and a loss_of(ddp) that runs one forward through the DDP wrapper it is given on this rank's batch and returns
// the loss. Wraps `model` in a DistributedDataParallel at PyTorch's cap for warmup + steps forward/backward
// passes (no optimizer step: the parameters do not change), then unwraps it; the model's buffers (BatchNorm's
// running statistics) and generators (Dropout's masks) are restored, so a run built with the chosen cap
// trains bit for bit as one that never tuned. Every rank returns the same choice. Gradient hooks already set
// on the parameters keep running, and are theirs again afterwards. Host models: on a device the hooks fire as
// kernels are queued, not as they finish, so the profile would not be backward's.
template <nn::Model M, AsyncCommunicator C, class LossOf>
TunedBucketCap tune_bucket_cap(M& model, C& comm, LossOf&& loss_of, TuneOptions const& opts = {}) {
  using T = typename M::value_type;
  using S = typename M::space;
  using V = Variable<T, S>;
  using Clock = std::chrono::steady_clock;
  static_assert(std::same_as<S, HostSpace>,
                "tune_bucket_cap profiles backward on the host: gradient hooks of device tensors fire when their "
                "kernels are queued, not when they finish. Tune a host copy of the model, or choose the cap with "
                "choose_bucket_cap from a profile taken with device events.");
  if (opts.warmup < 0 || opts.steps < 1)
    throw ArgumentError(detail::cat("tune_bucket_cap: needs warmup >= 0 and steps >= 1, got warmup ", opts.warmup,
                                    " and steps ", opts.steps));
  if (opts.caps.empty()) throw ArgumentError("tune_bucket_cap: no candidate caps");
  if (opts.node_cpus < 0)
    throw ArgumentError(
        detail::cat("tune_bucket_cap: node_cpus must be >= 0 (0: this node's online CPUs), got ", opts.node_cpus));

  TunedBucketCap out;
  out.calibration = calibrate(comm, opts.calibrate);
  out.timing = detail::resolve_timing(comm, opts);
  // kBetweenSteps' sizes: the calibration's, ascending, up to the first that holds every gradient (two at least,
  // so they fix a line of their own where the calibration, from an old cache, brought no points).
  std::vector<std::size_t> probe_sizes;
  if (out.timing == CalibrationTiming::kBetweenSteps) {
    std::vector<std::size_t> sizes;
    for (auto const& c : out.calibration.model.curve) sizes.push_back(c.bytes);
    if (sizes.empty()) sizes = opts.calibrate.probe.sizes;
    std::sort(sizes.begin(), sizes.end());
    std::size_t total = 0;
    for (auto const& p : nn::ParameterArena<T, S>::trainable(model.named_parameters()))
      total += static_cast<std::size_t>(p.var.value().numel()) * sizeof(T);
    for (std::size_t bytes : sizes)
      if (probe_sizes.size() < 2 || probe_sizes.back() < total) probe_sizes.push_back(bytes);
  }

  // What the profiling steps change besides gradients, put back at the end.
  std::vector<std::pair<Tensor<T, S>, Tensor<T, S>>> buffers;  // (the model's, a copy)
  for (auto const& b : model.named_buffers()) {
    Tensor<T, S> copy(b.tensor.shape());
    Kernels<S>::copy(b.tensor.numel(), b.tensor.data(), copy.data());
    buffers.emplace_back(b.tensor, std::move(copy));
  }
  std::vector<std::pair<std::shared_ptr<Generator>, GeneratorState>> generators;
  for (auto const& g : nn::generators_of(model)) generators.emplace_back(g.generator, g.generator->state());

  std::vector<V> params;  // DDP's trainable parameters, registration order (its plan's indices)
  for (auto const& p : nn::ParameterArena<T, S>::trainable(model.named_parameters())) params.push_back(p.var);
  std::size_t const np = params.size();
  using Hook = typename V::node_type::GradHook;
  std::vector<Hook> user_hooks(np);
  for (std::size_t i = 0; i < np; ++i) user_hooks[i] = params[i].node().leaf_hooks().grad_hook;

  // Per timed step: forward, then each parameter's ready time after backward began (this rank's clock); the
  // job's view is the element-wise max over ranks.
  std::size_t const row = np + 1;
  std::vector<double> stamps(static_cast<std::size_t>(opts.steps) * row, 0);
  std::vector<double> probe_times(static_cast<std::size_t>(opts.steps) * probe_sizes.size(), 0);  // [step][size]
  {
    DistributedDataParallel<M, C> ddp(model, comm, opts.ddp);
    Clock::time_point backward_start;
    std::vector<double> ready(np, 0);
    for (std::size_t i = 0; i < np; ++i) {
      params[i].set_grad_hook([&, i](auto& node) {
        ready[i] = std::chrono::duration<double>(Clock::now() - backward_start).count();
        if (user_hooks[i]) user_hooks[i](node);
      });
    }
    struct RestoreHooks {  // the user's hooks back on every way out (they hold references into this scope)
      std::vector<V> const& params;
      std::vector<Hook> const& hooks;
      ~RestoreHooks() {
        for (std::size_t i = 0; i < params.size(); ++i) params[i].node().leaf_hooks().grad_hook = hooks[i];
      }
    } const restore{params, user_hooks};
    using PS = native_space_t<C>;
    Tensor<float, PS> const probe_storage = probe_sizes.empty()
                                                ? Tensor<float, PS>()
                                                : detail::probe_buffer(comm, detail::probe_floats(probe_sizes.back()));
    for (int it = 0; it < opts.warmup + opts.steps; ++it) {
      for (std::size_t k = 0; k < probe_sizes.size(); ++k) {  // as probe_alpha_beta times them, after a step
        Tensor<float, PS> buf = detail::probe_slice(probe_storage, probe_sizes[k]);
        double const t = detail::timed_all_reduce(comm, buf, "between-steps probe").seconds();
        if (it >= opts.warmup) probe_times[static_cast<std::size_t>(it - opts.warmup) * probe_sizes.size() + k] = t;
      }
      for (auto& p : params) p.zero_grad();
      auto const t0 = Clock::now();
      V loss = loss_of(ddp);
      backward_start = Clock::now();
      backward(loss);
      if (it < opts.warmup) continue;
      double* r = stamps.data() + static_cast<std::size_t>(it - opts.warmup) * row;
      r[0] = std::chrono::duration<double>(backward_start - t0).count();
      std::copy(ready.begin(), ready.end(), r + 1);
    }
    for (auto& p : params) p.zero_grad();
  }
  for (auto& [live, copy] : buffers) Kernels<S>::copy(copy.numel(), copy.data(), live.data());
  for (auto& [g, st] : generators) g->set_state(st);

  host_all_reduce(comm, std::span<double>(stamps), ReduceOp::kMax);
  host_all_reduce(comm, std::span<double>(probe_times), ReduceOp::kMax);  // each probe: the slowest rank's time
  for (std::size_t k = 0; k < probe_sizes.size(); ++k) {
    std::vector<double> t;
    for (int i = 0; i < opts.steps; ++i) t.push_back(probe_times[static_cast<std::size_t>(i) * probe_sizes.size() + k]);
    out.between_steps.push_back(
        {static_cast<std::size_t>(detail::probe_floats(probe_sizes[k])) * sizeof(float), detail::median_of(t)});
  }
  out.model = with_probe_samples(out.calibration.model, out.between_steps);
  auto const step = [&](int k) { return stamps.data() + static_cast<std::size_t>(k) * row; };
  auto const column = [&](std::size_t c) {
    std::vector<double> v;
    for (int k = 0; k < opts.steps; ++k) v.push_back(step(k)[c]);
    return v;
  };
  for (auto const& p : params) out.profile.numels.push_back(p.numel());
  out.profile.forward = detail::median_of(column(0));
  for (std::size_t i = 0; i < np; ++i) out.profile.ready.push_back(detail::median_of(column(i + 1)));
  std::vector<double> last;  // backward's compute per step: until its last gradient
  for (int k = 0; k < opts.steps; ++k) last.push_back(np == 0 ? 0.0 : *std::max_element(step(k) + 1, step(k) + row));
  out.profile.backward = detail::median_of(last);
  out.choice = choose_bucket_cap(out.profile, out.model, sizeof(T), opts.caps);
  return out;
}

}  // namespace ddp
