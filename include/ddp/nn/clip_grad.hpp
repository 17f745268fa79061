// Gradient clipping before the optimizer step, as torch.nn.utils.clip_grad_norm_ and clip_grad_value_: the
// gradients of a set of parameters (an optimizer's arena, e.g. ddp.parameters(), or a model's
// named_parameters()) are rescaled or clamped in place.
//
// Under DistributedDataParallel, call it after backward: the gradients are then the averaged ones, bitwise equal
// on every rank (threads, MPI), so every rank computes the same norm, clips alike and raises alike, with no
// communication. Inside no_sync() the gradients are each rank's own, and so is the clipping (as in PyTorch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp::nn {

// What clip_grad_norm does when the total norm is NaN or infinite.
enum class NonFiniteNorm {
  kScale,  // scale anyway, as PyTorch by default (error_if_nonfinite=False): by 0 for an infinite norm, by NaN for
           // a NaN one
  kRaise,  // throw DdpError naming the parameters whose gradient norm is not finite; no gradient is changed
           // (PyTorch's error_if_nonfinite=True)
};

struct ClipGradNormOptions {
  double norm_type = 2.0;  // p of the p-norm: > 0, or std::numeric_limits<double>::infinity() for max |g|
  NonFiniteNorm non_finite = NonFiniteNorm::kScale;
};

namespace detail {
// One parameter's gradient, as clipping sees it.
template <class T>
struct GradSlice {
  std::string const* name;
  T* data;
  std::int64_t numel;
};

// The gradients that exist: parameters without one (frozen, or unused on every rank under DDP) are left out,
// as PyTorch leaves out p.grad is None. Shared parameters count once.
template <class T, MemorySpace S>
std::vector<GradSlice<T>> grads_of(ParameterArena<T, S> const& arena) {
  std::vector<GradSlice<T>> out;
  for (auto const& e : arena.entries())
    if (e.var.has_grad()) out.push_back({&e.name, e.var.grad().data(), e.numel});
  return out;
}
template <class T, MemorySpace S>
std::vector<GradSlice<T>> grads_of(std::vector<NamedParameter<T, S>> const& params) {
  std::vector<GradSlice<T>> out;
  for (auto const& p : params) {
    if (!p.var.has_grad()) continue;
    T* const data = p.var.grad().data();
    if (std::any_of(out.begin(), out.end(), [&](GradSlice<T> const& g) { return g.data == data; })) continue;
    out.push_back({&p.name, data, p.var.numel()});
  }
  return out;
}

inline void check_norm_args(double max_norm, double norm_type) {
  if (!std::isfinite(max_norm) || max_norm < 0)
    throw ArgumentError(ddp::detail::cat("clip_grad_norm: max_norm must be a finite number >= 0, got ", max_norm));
  if (!(norm_type > 0))  // also NaN
    throw ArgumentError(ddp::detail::cat("clip_grad_norm: norm_type must be > 0 or infinity, got ", norm_type));
}

// PyTorch's order: each gradient's norm (into `norms`), then the norm of those norms (all of it in T).
template <class T, MemorySpace S>
T total_norm(std::vector<GradSlice<T>> const& grads, T p, std::vector<T>& norms) {
  norms.clear();
  norms.reserve(grads.size());
  for (auto const& g : grads) norms.push_back(Kernels<S>::norm(g.numel, g.data, p));
  return norms.empty() ? T(0) : Kernels<HostSpace>::norm(static_cast<std::int64_t>(norms.size()), norms.data(), p);
}

template <class T, MemorySpace S>
T clip_grad_norm(std::vector<GradSlice<T>> const& grads, double max_norm, ClipGradNormOptions const& opts) {
  check_norm_args(max_norm, opts.norm_type);
  if (grads.empty()) return T(0);
  T const p = static_cast<T>(opts.norm_type);
  std::vector<T> norms;
  T const total = total_norm<T, S>(grads, p, norms);
  if (!std::isfinite(total) && opts.non_finite == NonFiniteNorm::kRaise) {
    std::string bad;
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (!std::isfinite(norms[i]))
        bad += ddp::detail::cat(bad.empty() ? "" : ", ", *grads[i].name, " (", norms[i], ")");
    if (bad.empty()) bad = "none (their combination overflowed)";
    throw DdpError(ddp::detail::cat("clip_grad_norm: the total norm of order ", opts.norm_type, " of the gradients is ",
                                    total, ", so they cannot be clipped; gradient norms that are not finite: ", bad,
                                    ". No gradient was changed (NonFiniteNorm::kScale scales them anyway)."));
  }
  T const coef = static_cast<T>(max_norm) / (total + T(1e-6));
  // PyTorch multiplies by min(coef, 1) always; a factor of 1 changes nothing, and a NaN factor (NaN norm) is applied.
  if (!(coef >= T(1)))
    for (auto const& g : grads) Kernels<S>::axpby(g.numel, coef, g.data, T(0), g.data);
  return total;
}

inline void check_value_arg(double clip_value) {
  if (!std::isfinite(clip_value) || clip_value < 0)
    throw ArgumentError(ddp::detail::cat("clip_grad_value: clip_value must be a finite number >= 0, got ", clip_value));
}

template <class T, MemorySpace S>
void clip_grad_value(std::vector<GradSlice<T>> const& grads, double clip_value) {
  check_value_arg(clip_value);
  T const v = static_cast<T>(clip_value);
  for (auto const& g : grads) Kernels<S>::clamp(g.numel, -v, v, g.data);
}
}  // namespace detail

// Scales the gradients so that their total p-norm (the p-norm of all their elements together, computed as the
// p-norm of the per-parameter p-norms, in PyTorch's order) is at most max_norm: each gradient is multiplied by
// max_norm / (total + 1e-6) when that is below 1. Returns the total norm before clipping (0 when no parameter has
// a gradient). ArgumentError for a negative or non-finite max_norm or a norm_type that is not > 0.
template <class T, MemorySpace S>
T clip_grad_norm(ParameterArena<T, S>& params, double max_norm, ClipGradNormOptions const& opts = {}) {
  return detail::clip_grad_norm<T, S>(detail::grads_of(params), max_norm, opts);
}
template <class T, MemorySpace S>
T clip_grad_norm(std::vector<NamedParameter<T, S>> const& params, double max_norm,
                 ClipGradNormOptions const& opts = {}) {
  return detail::clip_grad_norm<T, S>(detail::grads_of(params), max_norm, opts);
}

// The total p-norm clip_grad_norm would clip by, without changing any gradient (for logs: the norm before
// clipping, or the plain norm of a run that does not clip). ArgumentError for a norm_type that is not > 0.
template <class T, MemorySpace S>
T grad_norm(ParameterArena<T, S>& params, ClipGradNormOptions const& opts = {}) {
  detail::check_norm_args(0.0, opts.norm_type);
  std::vector<T> norms;
  return detail::total_norm<T, S>(detail::grads_of(params), static_cast<T>(opts.norm_type), norms);
}

// Clamps every gradient element into [-clip_value, clip_value] (NaN stays NaN). ArgumentError for a negative or
// non-finite clip_value.
template <class T, MemorySpace S>
void clip_grad_value(ParameterArena<T, S>& params, double clip_value) {
  detail::clip_grad_value<T, S>(detail::grads_of(params), clip_value);
}
template <class T, MemorySpace S>
void clip_grad_value(std::vector<NamedParameter<T, S>> const& params, double clip_value) {
  detail::clip_grad_value<T, S>(detail::grads_of(params), clip_value);
}

}  // namespace ddp::nn
