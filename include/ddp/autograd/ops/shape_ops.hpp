// reshape and flatten: views that share storage; their gradients alias too when nothing else is there.
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

template <class T, MemorySpace S>
Variable<T, S> reshape(Variable<T, S> const& x, Shape s) {
  using K = Kernels<S>;
  if (s.numel() != x.numel())
    throw ShapeError(detail::cat("reshape: cannot view shape ", x.shape(), " (", x.numel(), " elements) as ", s, " (",
                                 s.numel(), " elements)"));
  return detail::record(
      "reshape", x.value().reshape(s),
      [x](Node<T, S>& self) {
        auto& xn = x.node();
        if (!xn.is_leaf && !xn.grad_defined) {
          // First contribution to an interior input: share our gradient's storage instead of copying.
          xn.grad = self.grad.reshape(xn.value.shape());
          xn.grad_defined = true;
          return;
        }
        T const beta = detail::grad_beta(xn);
        K::axpby(self.grad.numel(), T(1), self.grad.data(), beta, xn.grad.data());
      },
      x);
}

// (N, ...) -> (N, prod(...)): keeps the batch dimension, as torch.flatten(x, 1).
template <class T, MemorySpace S>
Variable<T, S> flatten(Variable<T, S> const& x) {
  Shape const& xs = x.shape();
  if (xs.rank() < 1) throw ShapeError("flatten: needs at least a batch dimension");
  return reshape(x, Shape{xs[0], xs.numel_from(1)});
}

}  // namespace ddp
