// dropout: zeroes each element with probability p and scales the rest by 1/(1-p) in training; identity in eval.
#pragma once

#include "ddp/autograd/mode.hpp"
#include "ddp/autograd/sample_key.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

namespace detail {

// y = x · mask, where mask[i] = 0 when element i's 32 random bits are < p·2³² and 1/(1-p) otherwise;
// fill(threshold, keep, mask) writes the mask with Kernels<S> (on the device for device tensors: the same
// bits give the same mask in every memory space).
template <class T, MemorySpace S, class Fill>
Variable<T, S> dropout_with(Variable<T, S> const& x, double p, Fill&& fill) {
  using K = Kernels<S>;
  std::int64_t const n = x.numel();
  T const keep_scale = T(1.0 / (1.0 - p));
  auto const threshold = static_cast<std::uint32_t>(p * 4294967296.0);  // drop when u32 < p·2³²
  Tensor<T, S> mask(x.shape());
  fill(threshold, keep_scale, mask.data());
  Tensor<T, S> y(x.shape());
  K::mul(n, x.value().data(), mask.data(), T(0), y.data());
  return detail::record(
      "dropout", std::move(y),
      [x, mask, n](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::mul(n, self.grad.data(), mask.data(), beta, xn.grad.data());
      },
      x);
}

}  // namespace detail

// The mask is drawn from `gen` (n values of its stream, in element order).
template <class T, MemorySpace S>
Variable<T, S> dropout(Variable<T, S> const& x, double p, Mode mode, Generator& gen) {
  if (!(p >= 0.0 && p < 1.0)) throw ArgumentError(detail::cat("dropout: p must be in [0, 1), got ", p));
  if (mode == Mode::kEval || p == 0.0) return x;
  GeneratorState const at = gen.state();
  auto const n = static_cast<std::uint64_t>(x.numel());
  gen.advance(n);  // as if the n values had been drawn one by one
  return detail::dropout_with(x, p, [&](std::uint32_t threshold, T keep, T* mask) {
    Kernels<S>::bernoulli_mask_stream(x.numel(), at.state, at.inc, threshold, keep, mask);
  });
}

// Counter-based: element j of row i (x's first dimension indexes samples) is kept or dropped by
// counter_u32(seed, key.step, key.first_sample + i, j), so a sample's mask depends only on the seed, the step
// and the sample's global index: the same on any rank, in any micro-batch (deterministic training).
template <class T, MemorySpace S>
Variable<T, S> dropout(Variable<T, S> const& x, double p, Mode mode, std::uint64_t seed, SampleKey key) {
  if (!(p >= 0.0 && p < 1.0)) throw ArgumentError(detail::cat("dropout: p must be in [0, 1), got ", p));
  if (mode == Mode::kEval || p == 0.0) return x;
  std::int64_t const rows = x.shape().rank() == 0 ? 1 : x.shape()[0];
  std::int64_t const per_row = rows == 0 ? 0 : x.numel() / rows;
  return detail::dropout_with(x, p, [&](std::uint32_t threshold, T keep, T* mask) {
    Kernels<S>::bernoulli_mask_counter(rows, per_row, seed, key.step, key.first_sample, threshold, keep, mask);
  });
}

}  // namespace ddp
