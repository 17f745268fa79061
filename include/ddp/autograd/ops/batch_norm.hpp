// batch_norm2d over (N, C, H, W): batch statistics and running-estimate updates in training, running
// statistics in evaluation (PyTorch's semantics: biased variance to normalise, unbiased for the estimate).
#pragma once

#include "ddp/autograd/mode.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

struct BatchNormArgs {
  double momentum = 0.1;
  double eps = 1e-5;
};

// gamma, beta: (C) parameters; running_mean, running_var: (C) buffers, updated in place in training.
template <class T, MemorySpace S>
Variable<T, S> batch_norm2d(Variable<T, S> const& x, Variable<T, S> const& gamma, Variable<T, S> const& beta,
                            Tensor<T, S> const& running_mean, Tensor<T, S> const& running_var, Mode mode,
                            BatchNormArgs args = {}) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (xs.rank() != 4) throw ShapeError(detail::cat("batch_norm2d: input must be (N,C,H,W), got ", xs));
  std::int64_t const N = xs[0], C = xs[1], HW = xs[2] * xs[3];
  Shape const cs{C};
  if (!(gamma.shape() == cs) || !(beta.shape() == cs) || !(running_mean.shape() == cs) || !(running_var.shape() == cs))
    throw ShapeError(detail::cat("batch_norm2d: input has ", C, " channels but gamma/beta/running stats have shapes ",
                                 gamma.shape(), ", ", beta.shape(), ", ", running_mean.shape(), ", ",
                                 running_var.shape()));
  bool const training = mode == Mode::kTrain;
  if (training && N * HW < 2)
    throw ShapeError(detail::cat("batch_norm2d: training needs more than one value per channel, got input ", xs));
  Tensor<T, S> y(xs), mean(cs), invstd(cs);
  if (training) {
    Tensor<T, S> var_unbiased(cs);
    K::batchnorm_fwd_train(N, C, HW, x.value().data(), gamma.value().data(), beta.value().data(), T(args.eps), y.data(),
                           mean.data(), invstd.data(), var_unbiased.data());
    T const m = T(args.momentum);
    K::axpby(C, m, mean.data(), T(1) - m, running_mean.data());
    K::axpby(C, m, var_unbiased.data(), T(1) - m, running_var.data());
  } else {
    K::copy(C, running_mean.data(), mean.data());
    K::rsqrt_eps(C, running_var.data(), T(args.eps), invstd.data());
    K::batchnorm_fwd_eval(N, C, HW, x.value().data(), gamma.value().data(), beta.value().data(), mean.data(),
                          invstd.data(), y.data());
  }
  return detail::record(
      "batch_norm2d", std::move(y),
      [x, gamma, beta, mean, invstd, training, N, C, HW](Node<T, S>& self) {
        T bx = 0, bg = 0, bb = 0;
        T *gx = nullptr, *gg = nullptr, *gb = nullptr;
        if (x.requires_grad()) bx = detail::grad_beta(x.node()), gx = x.node().grad.data();
        if (gamma.requires_grad()) bg = detail::grad_beta(gamma.node()), gg = gamma.node().grad.data();
        if (beta.requires_grad()) bb = detail::grad_beta(beta.node()), gb = beta.node().grad.data();
        K::batchnorm_bwd(training, N, C, HW, x.value().data(), gamma.value().data(), mean.data(), invstd.data(),
                         self.grad.data(), bx, gx, bg, gg, bb, gb);
      },
      x, gamma, beta);
}

}  // namespace ddp
