// add (with trailing-dims / scalar broadcasting), sub, mul, scale: forward and backward.
#pragma once

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// How b broadcasts against a: same shape, b is a's trailing dims (e.g. a bias row), or b is one element.
enum class Broadcast { kSame, kTrailing, kScalar };

inline Broadcast broadcast_kind(char const* op, Shape const& a, Shape const& b) {
  if (a == b) return Broadcast::kSame;
  if (b.numel() == 1 && a.numel() != 1) return Broadcast::kScalar;
  if (b.rank() <= a.rank()) {
    bool trailing = true;
    for (int i = 0; i < b.rank(); ++i) trailing &= b[b.rank() - 1 - i] == a[a.rank() - 1 - i];
    if (trailing) return Broadcast::kTrailing;
  }
  throw ShapeError(
      detail::cat(op, ": shapes ", a, " and ", b,
                  " do not broadcast (second must equal the first, its trailing dims, or be one element)"));
}

// y = a + sb * b with b broadcast over a.
template <class T, MemorySpace S>
Variable<T, S> add_scaled(char const* op, Variable<T, S> const& a, Variable<T, S> const& b, T sb) {
  using K = Kernels<S>;
  Broadcast const kind = broadcast_kind(op, a.shape(), b.shape());
  std::int64_t const n = a.numel(), cols = b.numel(), rows = cols ? n / cols : 0;
  Tensor<T, S> y(a.shape());
  if (kind == Broadcast::kSame) {
    K::add(n, T(1), a.value().data(), sb, b.value().data(), y.data());
  } else {
    // Broadcasting: y = a, then y[r, :] += sb * b (a scalar is the 1-column case).
    K::copy(n, a.value().data(), y.data());
    if (sb == T(1)) {
      K::add_row_broadcast(rows, cols, b.value().data(), y.data());
    } else {
      Tensor<T, S> sbv(b.shape());
      K::axpby(cols, sb, b.value().data(), T(0), sbv.data());
      K::add_row_broadcast(rows, cols, sbv.data(), y.data());
    }
  }
  return record(
      op, std::move(y),
      [a, b, sb, kind, n, rows, cols](Node<T, S>& self) {
        if (b.requires_grad()) {
          auto& bn = b.node();
          T const beta = grad_beta(bn);
          if (kind == Broadcast::kSame) {
            K::axpby(n, sb, self.grad.data(), beta, bn.grad.data());
          } else if (sb == T(1)) {
            K::sum_rows(rows, cols, self.grad.data(), beta, bn.grad.data());
          } else {
            Tensor<T, S> tmp(b.shape());
            K::sum_rows(rows, cols, self.grad.data(), T(0), tmp.data());
            K::axpby(cols, sb, tmp.data(), beta, bn.grad.data());
          }
        }
        if (a.requires_grad()) pass_grad(self, a.node());  // a's gradient is y's: lent when it can be, so last
      },
      a, b);
}
}  // namespace detail

// a + b; b may be a's shape, its trailing dims (a bias) or one element.
template <class T, MemorySpace S>
Variable<T, S> add(Variable<T, S> const& a, Variable<T, S> const& b) {
  return detail::add_scaled<T, S>("add", a, b, T(1));
}
// a - b; broadcasting as add.
template <class T, MemorySpace S>
Variable<T, S> sub(Variable<T, S> const& a, Variable<T, S> const& b) {
  return detail::add_scaled<T, S>("sub", a, b, T(-1));
}

// Element-wise a * b (same shapes).
template <class T, MemorySpace S>
Variable<T, S> mul(Variable<T, S> const& a, Variable<T, S> const& b) {
  using K = Kernels<S>;
  if (!(a.shape() == b.shape()))
    throw ShapeError(detail::cat("mul: shapes ", a.shape(), " and ", b.shape(), " differ (element-wise product)"));
  std::int64_t const n = a.numel();
  Tensor<T, S> y(a.shape());
  K::mul(n, a.value().data(), b.value().data(), T(0), y.data());
  return detail::record(
      "mul", std::move(y),
      [a, b, n](Node<T, S>& self) {
        if (a.requires_grad()) {
          auto& an = a.node();
          T const beta = detail::grad_beta(an);
          K::mul(n, self.grad.data(), b.value().data(), beta, an.grad.data());
        }
        if (b.requires_grad()) {
          auto& bn = b.node();
          T const beta = detail::grad_beta(bn);
          K::mul(n, self.grad.data(), a.value().data(), beta, bn.grad.data());
        }
      },
      a, b);
}

// c * x for a constant c.
template <class T, MemorySpace S>
Variable<T, S> scale(Variable<T, S> const& x, T c) {
  using K = Kernels<S>;
  std::int64_t const n = x.numel();
  Tensor<T, S> y(x.shape());
  K::axpby(n, c, x.value().data(), T(0), y.data());
  return detail::record(
      "scale", std::move(y),
      [x, c, n](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::axpby(n, c, self.grad.data(), beta, xn.grad.data());
      },
      x);
}

template <class T, MemorySpace S>
Variable<T, S> operator+(Variable<T, S> const& a, Variable<T, S> const& b) {
  return add(a, b);
}
template <class T, MemorySpace S>
Variable<T, S> operator-(Variable<T, S> const& a, Variable<T, S> const& b) {
  return sub(a, b);
}
template <class T, MemorySpace S>
Variable<T, S> operator*(Variable<T, S> const& a, Variable<T, S> const& b) {
  return mul(a, b);
}

}  // namespace ddp
