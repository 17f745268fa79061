// relu, tanh, sigmoid (backward from the saved output) and gelu (backward from the saved input).
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// Unary op whose derivative is a function of its output y: fwd(n, x, y), bwd(n, y, gy, beta, gx).
template <class T, MemorySpace S, class Fwd, class Bwd>
Variable<T, S> unary_from_output(char const* op, Variable<T, S> const& x, Fwd fwd, Bwd bwd) {
  std::int64_t const n = x.numel();
  Tensor<T, S> y(x.shape());
  fwd(n, x.value().data(), y.data());
  return record(
      op, std::move(y),
      [x, n, bwd](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = grad_beta(xn);
        bwd(n, self.value.data(), self.grad.data(), beta, xn.grad.data());
      },
      x);
}
}  // namespace detail

// max(x, 0)
template <class T, MemorySpace S>
Variable<T, S> relu(Variable<T, S> const& x) {
  using K = Kernels<S>;
  return detail::unary_from_output<T, S>(
      "relu", x, [](auto... a) { K::relu_fwd(a...); }, [](auto... a) { K::relu_bwd(a...); });
}
template <class T, MemorySpace S>
Variable<T, S> tanh(Variable<T, S> const& x) {
  using K = Kernels<S>;
  return detail::unary_from_output<T, S>(
      "tanh", x, [](auto... a) { K::tanh_fwd(a...); }, [](auto... a) { K::tanh_bwd(a...); });
}
template <class T, MemorySpace S>
Variable<T, S> sigmoid(Variable<T, S> const& x) {
  using K = Kernels<S>;
  return detail::unary_from_output<T, S>(
      "sigmoid", x, [](auto... a) { K::sigmoid_fwd(a...); }, [](auto... a) { K::sigmoid_bwd(a...); });
}

// GELU (torch.nn.functional.gelu): approx kErf is the exact x·Φ(x), kTanh the tanh approximation.
template <class T, MemorySpace S>
Variable<T, S> gelu(Variable<T, S> const& x, GeluApprox approx = GeluApprox::kErf) {
  using K = Kernels<S>;
  std::int64_t const n = x.numel();
  Tensor<T, S> y(x.shape());
  K::gelu_fwd(n, approx, x.value().data(), y.data());
  return detail::record(
      "gelu", std::move(y),
      [x, n, approx](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::gelu_bwd(n, approx, x.value().data(), self.grad.data(), beta, xn.grad.data());
      },
      x);
}

}  // namespace ddp
