// softmax over the last dimension of scaled scores, optionally causal: the normalisation step of attention.
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct SoftmaxArgs {
  double scale = 1.0;                     // softmax(scale · x); > 0
  SoftmaxMask mask = SoftmaxMask::kNone;  // kCausal: x is (…, T, T) scores, key j > query i gets probability 0
};

// x:(…, C) -> (…, C), each row summing to 1 over its unmasked entries. The backward uses the saved output.
template <class T, MemorySpace S>
Variable<T, S> softmax(Variable<T, S> const& x, SoftmaxArgs args = {}) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (xs.rank() < 1) throw ShapeError("softmax: needs at least one dimension");
  if (!(args.scale > 0)) throw ArgumentError(detail::cat("softmax: scale must be > 0, got ", args.scale));
  std::int64_t const cols = xs[xs.rank() - 1], rows = cols ? xs.numel() / cols : 0;
  if (args.mask == SoftmaxMask::kCausal && (xs.rank() < 2 || xs[xs.rank() - 2] != cols))
    throw ShapeError(detail::cat("softmax: a causal mask needs square (…, T, T) scores, got shape ", xs));
  Tensor<T, S> y(xs);
  T const scale = T(args.scale);
  K::softmax_fwd(rows, cols, scale, args.mask, x.value().data(), y.data());
  return detail::record(
      "softmax", std::move(y),
      [x, rows, cols, scale](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::softmax_bwd(rows, cols, scale, self.value.data(), self.grad.data(), beta, xn.grad.data());
      },
      x);
}

}  // namespace ddp
