// dropout: zeroes each element with probability p and scales the rest by 1/(1-p) in training; identity in eval.
#pragma once

#include "ddp/autograd/mode.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/host_allocator.hpp"
#include "ddp/tensor/kernels.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp {

// The mask is drawn from `gen` on the host (portable: same seed, same mask on every platform).
template <class T, MemorySpace S>
Variable<T, S> dropout(Variable<T, S> const& x, double p, Mode mode, Generator& gen) {
  using K = Kernels<S>;
  if (!(p >= 0.0 && p < 1.0)) throw ArgumentError(detail::cat("dropout: p must be in [0, 1), got ", p));
  if (mode == Mode::kEval || p == 0.0) return x;
  std::int64_t const n = x.numel();
  T const keep_scale = T(1.0 / (1.0 - p));
  auto const threshold = static_cast<std::uint32_t>(p * 4294967296.0);  // drop when u32 < p·2³²
  Tensor<T> host_mask(x.shape());
  {
    detail::HostBuffer<std::uint32_t> u(static_cast<std::size_t>(n));
    gen.fill_u32(u.data(), n);  // the same values as n calls of next_u32()
    T* m = host_mask.data();
    for (std::int64_t i = 0; i < n; ++i) m[i] = u.data()[i] < threshold ? T(0) : keep_scale;
  }
  Tensor<T, S> mask;
  if constexpr (std::same_as<S, HostSpace>) {
    mask = host_mask;
  } else {
    mask = Tensor<T, S>(x.shape());
    K::from_host(n, host_mask.data(), mask.data());
  }
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

}  // namespace ddp
