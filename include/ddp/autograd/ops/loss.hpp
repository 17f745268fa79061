// log_softmax, mse_loss, cross_entropy (from logits, fused), nll_loss: forward and backward.
#pragma once

#include <string>
#include <vector>

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// (rows, cols) view of x over its last dimension. Callers name the two (`rc.first`, `rc.second`) rather than
// bind them (`auto [rows, cols]`): their backward lambdas capture them, which Clang < 16 cannot do for bindings.
inline std::pair<std::int64_t, std::int64_t> rows_cols(char const* op, Shape const& s) {
  if (s.rank() < 1) throw ShapeError(detail::cat(op, ": needs at least one dimension, got ", s));
  std::int64_t const cols = s[s.rank() - 1];
  return {cols ? s.numel() / cols : 0, cols};
}

template <MemorySpace S>
void check_targets(char const* op, Tensor<std::int32_t, S> const& target, std::int64_t rows, std::int64_t cols) {
  if (!(target.shape() == Shape{rows}))
    throw ShapeError(
        detail::cat(op, ": targets have shape ", target.shape(), ", expected [", rows, "] (one class id per row)"));
  // Device targets are checked by the loss kernels themselves, and a bad id is reported at the next host read
  // (device_errors.hpp): reading them back here would make every step wait for the device.
  if constexpr (!std::same_as<S, HostSpace>) return;
  std::int32_t const* ids = target.data();
  for (std::int64_t r = 0; r < rows; ++r)
    if (ids[r] < 0 || ids[r] >= cols)
      throw ArgumentError(detail::cat(op, ": target ", ids[r], " at row ", r, " is not a class id in [0, ", cols, ")"));
}

template <class T, MemorySpace S>
T scalar_grad(Node<T, S> const& self) {
  T g;
  Kernels<S>::to_host(std::int64_t{1}, self.grad.data(), &g);
  return g;
}

template <class T, MemorySpace S>
Tensor<T, S> scalar_tensor(T v) {
  Tensor<T, S> y(Shape{1});
  Kernels<S>::from_host(std::int64_t{1}, &v, y.data());
  return y;
}
}  // namespace detail

// log of softmax over the last dimension.
template <class T, MemorySpace S>
Variable<T, S> log_softmax(Variable<T, S> const& x) {
  using K = Kernels<S>;
  auto const rc = detail::rows_cols("log_softmax", x.shape());
  std::int64_t const rows = rc.first, cols = rc.second;
  Tensor<T, S> y(x.shape());
  K::log_softmax_fwd(rows, cols, x.value().data(), y.data());
  return detail::record(
      "log_softmax", std::move(y),
      [x, rows, cols](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::log_softmax_bwd(rows, cols, self.value.data(), self.grad.data(), beta, xn.grad.data());
      },
      x);
}

// mean((pred - target)²) over all elements; target is a constant.
template <class T, MemorySpace S>
Variable<T, S> mse_loss(Variable<T, S> const& pred, Tensor<T, S> const& target) {
  using K = Kernels<S>;
  if (!(pred.shape() == target.shape()))
    throw ShapeError(
        detail::cat("mse_loss: prediction has shape ", pred.shape(), " but target has shape ", target.shape()));
  std::int64_t const n = pred.numel();
  T const loss = K::mse_fwd(n, pred.value().data(), target.data());
  return detail::record(
      "mse_loss", detail::scalar_tensor<T, S>(loss),
      [pred, target, n](Node<T, S>& self) {
        auto& pn = pred.node();
        T const beta = detail::grad_beta(pn);
        K::mse_bwd(n, pred.value().data(), target.data(), detail::scalar_grad(self), beta, pn.grad.data());
      },
      pred);
}

// Mean cross-entropy of logits (rows, C) against int32 class ids (rows); log_softmax + nll fused.
template <class T, MemorySpace S>
Variable<T, S> cross_entropy(Variable<T, S> const& logits, Tensor<std::int32_t, S> const& target) {
  using K = Kernels<S>;
  auto const rc = detail::rows_cols("cross_entropy", logits.shape());
  std::int64_t const rows = rc.first, cols = rc.second;
  detail::check_targets("cross_entropy", target, rows, cols);
  Tensor<T, S> probs(logits.shape());
  Tensor<T, S> loss(Shape{1});  // stays where the tensors are: on a device, nothing is read back here
  K::cross_entropy_fwd(rows, cols, logits.value().data(), target.data(), probs.data(), loss.data());
  return detail::record(
      "cross_entropy", std::move(loss),
      [logits, target, probs, rows, cols](Node<T, S>& self) {
        auto& ln = logits.node();
        T const beta = detail::grad_beta(ln);
        K::cross_entropy_bwd(rows, cols, probs.data(), target.data(), self.grad.data(), beta, ln.grad.data());
      },
      logits);
}

// Mean negative log-likelihood of log-probabilities (rows, C) against int32 class ids.
template <class T, MemorySpace S>
Variable<T, S> nll_loss(Variable<T, S> const& logp, Tensor<std::int32_t, S> const& target) {
  using K = Kernels<S>;
  auto const rc = detail::rows_cols("nll_loss", logp.shape());
  std::int64_t const rows = rc.first, cols = rc.second;
  detail::check_targets("nll_loss", target, rows, cols);
  T const loss = K::nll_fwd(rows, cols, logp.value().data(), target.data());
  return detail::record(
      "nll_loss", detail::scalar_tensor<T, S>(loss),
      [logp, target, rows, cols](Node<T, S>& self) {
        auto& ln = logp.node();
        T const beta = detail::grad_beta(ln);
        K::nll_bwd(rows, cols, target.data(), detail::scalar_grad(self), beta, ln.grad.data());
      },
      logp);
}

}  // namespace ddp
