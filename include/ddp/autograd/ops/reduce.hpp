// sum and mean over all elements (-> one-element tensor of shape [1]).
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
template <class T, MemorySpace S>
Variable<T, S> scaled_sum(char const* op, Variable<T, S> const& x, T s) {
  using K = Kernels<S>;
  std::int64_t const n = x.numel();
  Tensor<T, S> y(Shape{1});
  T const v = s * K::sum(n, x.value().data());
  K::from_host(std::int64_t{1}, &v, y.data());
  return record(
      op, std::move(y),
      [x, n, s](Node<T, S>& self) {
        T g;
        K::to_host(std::int64_t{1}, self.grad.data(), &g);
        auto& xn = x.node();
        T const beta = grad_beta(xn);
        K::add_scalar(n, s * g, beta, xn.grad.data());
      },
      x);
}
}  // namespace detail

// Σ x -> shape [1]
template <class T, MemorySpace S>
Variable<T, S> sum(Variable<T, S> const& x) {
  return detail::scaled_sum<T, S>("sum", x, T(1));
}
// (1/n) Σ x -> shape [1]; the mean of nothing is 0.
template <class T, MemorySpace S>
Variable<T, S> mean(Variable<T, S> const& x) {
  return detail::scaled_sum<T, S>("mean", x, x.numel() ? T(1) / T(x.numel()) : T(0));
}

}  // namespace ddp
