// conv2d (cross-correlation, zero padding) and max_pool2d over NCHW, forward and backward.
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct Conv2dArgs {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  ConvAlgorithm algorithm = ConvAlgorithm::kAuto;  // kernels.hpp: Winograd for 3×3 stride 1, or im2col
  // kRelu: relu(conv2d(x) + b) as one op, no separate pass over the output or its gradient. kReluMaxPool2:
  // max_pool2d(relu(conv2d(x) + b), 2) as one op, pooled while each image is in cache where the kernels can
  // (Winograd layers; elsewhere the ops are composed, with the same values).
  Epilogue epilogue = Epilogue::kNone;
};

namespace detail {
// Where a conv2d node's gradients go (null: not needed) and whether each accumulates (beta 1) or overwrites.
template <class T>
struct ConvGrads {
  T bx = 0, bw = 0, bb = 0;
  T *gx = nullptr, *gw = nullptr, *gb = nullptr;
};
template <class T, MemorySpace S>
ConvGrads<T> conv_grads(Variable<T, S> const& x, Variable<T, S> const& w, Variable<T, S> const& b) {
  ConvGrads<T> o;
  if (x.requires_grad()) o.bx = grad_beta(x.node()), o.gx = x.node().grad.data();
  if (w.requires_grad()) o.bw = grad_beta(w.node()), o.gw = w.node().grad.data();
  if (b.defined() && b.requires_grad()) o.bb = grad_beta(b.node()), o.gb = b.node().grad.data();
  return o;
}
}  // namespace detail

// x:(N,C,H,W) -> (N,C,(H-k)/s+1,(W-k)/s+1); stride 0 means stride = kernel. No padding. (Defined below.)
template <class T, MemorySpace S>
Variable<T, S> max_pool2d(Variable<T, S> const& x, std::int64_t kernel, std::int64_t stride = 0);

// x:(N,C,H,W) w:(O,C,k,k) b:(O) or undefined -> (N,O,OH,OW), OH = (H + 2p - k)/s + 1.
template <class T, MemorySpace S>
Variable<T, S> conv2d(Variable<T, S> const& x, Variable<T, S> const& w, Variable<T, S> const& b = {},
                      Conv2dArgs args = {}) {
  using K = Kernels<S>;
  Shape const &xs = x.shape(), &ws = w.shape();
  if (xs.rank() != 4 || ws.rank() != 4 || ws[1] != xs[1] || ws[2] != ws[3])
    throw ShapeError(detail::cat("conv2d: input ", xs, " and weight ", ws,
                                 " do not fit (need input (N,C,H,W) and weight (O,C,k,k))"));
  if (args.stride < 1 || args.padding < 0)
    throw ArgumentError(
        detail::cat("conv2d: stride must be >= 1 and padding >= 0 (got ", args.stride, ", ", args.padding, ")"));
  ConvGeometry g{.N = xs[0],
                 .C = xs[1],
                 .H = xs[2],
                 .W = xs[3],
                 .O = ws[0],
                 .k = ws[2],
                 .stride = args.stride,
                 .pad = args.padding,
                 .algorithm = args.algorithm,
                 .epilogue = args.epilogue};
  if (args.algorithm == ConvAlgorithm::kWinograd && (g.k != 3 || g.stride != 1))
    throw ArgumentError(detail::cat("conv2d: ConvAlgorithm::kWinograd needs a 3x3 kernel with stride 1 (got kernel ",
                                    g.k, ", stride ", g.stride, ")"));
  if (g.H + 2 * g.pad < g.k || g.W + 2 * g.pad < g.k)
    throw ShapeError(detail::cat("conv2d: kernel ", g.k, " is larger than the padded input ", xs));
  if (b.defined() && !(b.shape() == Shape{g.O}))
    throw ShapeError(detail::cat("conv2d: bias has shape ", b.shape(), ", expected [", g.O, "]"));
  if (args.epilogue != Epilogue::kNone && args.epilogue != Epilogue::kRelu && args.epilogue != Epilogue::kReluMaxPool2)
    throw ArgumentError(detail::cat("conv2d: unknown epilogue ", static_cast<int>(args.epilogue)));
  if (g.pool2() && !K::fuses_pool2(g)) {  // kernels that cannot pool in place: compose the ops
    Conv2dArgs a = args;
    a.epilogue = Epilogue::kRelu;
    return max_pool2d(conv2d(x, w, b, a), 2);
  }
  Tensor<T, S> y(g.pool2() ? Shape{g.N, g.O, g.OH() / 2, g.OW() / 2} : Shape{g.N, g.O, g.OH(), g.OW()});
  Tensor<std::uint8_t, S> codes;  // each pooling window's winner, for the backward
  if (g.pool2()) codes = Tensor<std::uint8_t, S>(Shape{y.numel()});
  K::conv2d_fwd(g, x.value().data(), w.value().data(), b.defined() ? b.value().data() : nullptr, y.data(),
                g.pool2() ? codes.data() : nullptr);
  auto bwd = [x, w, b, g, codes](Node<T, S>& self) {
    auto const o = detail::conv_grads(x, w, b);
    K::conv2d_bwd(g, x.value().data(), w.value().data(), self.value.data(), self.grad.data(), o.bx, o.gx, o.bw, o.gw,
                  o.bb, o.gb, g.pool2() ? codes.data() : nullptr);
  };
  char const* name = g.pool2() ? "conv2d+relu+max_pool2d" : g.relu() ? "conv2d+relu" : "conv2d";
  if (b.defined()) return detail::record(name, std::move(y), std::move(bwd), x, w, b);
  return detail::record(name, std::move(y), std::move(bwd), x, w);
}

// x:(N,C,H,W) -> (N,C,(H-k)/s+1,(W-k)/s+1); stride 0 means stride = kernel. No padding.
template <class T, MemorySpace S>
Variable<T, S> max_pool2d(Variable<T, S> const& x, std::int64_t kernel, std::int64_t stride) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (stride == 0) stride = kernel;
  if (xs.rank() != 4) throw ShapeError(detail::cat("max_pool2d: input must be (N,C,H,W), got ", xs));
  if (kernel < 1 || stride < 1 || kernel > xs[2] || kernel > xs[3])
    throw ArgumentError(detail::cat("max_pool2d: kernel ", kernel, " / stride ", stride, " invalid for input ", xs));
  ConvGeometry g{.N = xs[0], .C = xs[1], .H = xs[2], .W = xs[3], .O = xs[1], .k = kernel, .stride = stride, .pad = 0};
  Shape ys{g.N, g.C, g.OH(), g.OW()};
  Tensor<T, S> y(ys);
  Tensor<std::int32_t, S> idx(ys);
  K::maxpool_fwd(g, x.value().data(), y.data(), idx.data());
  return detail::record(
      "max_pool2d", std::move(y),
      [x, g, idx](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::maxpool_bwd(g, self.grad.data(), idx.data(), beta, xn.grad.data());
      },
      x);
}

}  // namespace ddp
