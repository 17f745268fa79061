// layer_norm: normalisation over the last dimension with an optional affine weight and bias, as
// torch.nn.functional.layer_norm (biased variance, eps inside the square root).
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct LayerNormArgs {
  double eps = 1e-5;
};

// x:(…, C) w:(C) or undefined, b:(C) or undefined -> (…, C). Mean and 1/std per row are kept for the backward.
template <class T, MemorySpace S>
Variable<T, S> layer_norm(Variable<T, S> const& x, Variable<T, S> const& w, Variable<T, S> const& b,
                          LayerNormArgs args = {}) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (xs.rank() < 1) throw ShapeError("layer_norm: needs at least one dimension");
  std::int64_t const cols = xs[xs.rank() - 1], rows = cols ? xs.numel() / cols : 0;
  for (auto const* p : {&w, &b})
    if (p->defined() && !(p->shape() == Shape{cols}))
      throw ShapeError(detail::cat("layer_norm: ", p == &w ? "weight" : "bias", " has shape ", p->shape(),
                                   "; the input's last dimension is ", cols, " (input shape ", xs, ")"));
  if (!(args.eps > 0)) throw ArgumentError(detail::cat("layer_norm: eps must be > 0, got ", args.eps));
  Tensor<T, S> y(xs), mean(Shape{rows}), rstd(Shape{rows});
  K::layer_norm_fwd(rows, cols, T(args.eps), x.value().data(), w.defined() ? w.value().data() : nullptr,
                    b.defined() ? b.value().data() : nullptr, y.data(), mean.data(), rstd.data());
  auto bwd = [x, w, b, mean, rstd, rows, cols](Node<T, S>& self) {
    T bx = 0, bw = 0, bb = 0;
    T *gx = nullptr, *gw = nullptr, *gb = nullptr;
    if (x.requires_grad()) bx = detail::grad_beta(x.node()), gx = x.node().grad.data();
    if (w.defined() && w.requires_grad()) bw = detail::grad_beta(w.node()), gw = w.node().grad.data();
    if (b.defined() && b.requires_grad()) bb = detail::grad_beta(b.node()), gb = b.node().grad.data();
    K::layer_norm_bwd(rows, cols, x.value().data(), mean.data(), rstd.data(), w.defined() ? w.value().data() : nullptr,
                      self.grad.data(), bx, gx, bw, gw, bb, gb);
  };
  if (w.defined() && b.defined()) return detail::record("layer_norm", std::move(y), std::move(bwd), x, w, b);
  if (w.defined()) return detail::record("layer_norm", std::move(y), std::move(bwd), x, w);
  if (b.defined()) return detail::record("layer_norm", std::move(y), std::move(bwd), x, b);
  return detail::record("layer_norm", std::move(y), std::move(bwd), x);
}

}  // namespace ddp
