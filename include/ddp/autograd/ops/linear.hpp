// matmul, bmm (batched, with transposes), linear (y = x Wᵀ + b) and linear_residual (r + x Wᵀ + b), forward and
// backward through Kernels<Space>::gemm.
#pragma once

#include <array>

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

// a:(M,K) b:(K,N) -> (M,N)
template <class T, MemorySpace S>
Variable<T, S> matmul(Variable<T, S> const& a, Variable<T, S> const& b) {
  using K = Kernels<S>;
  if (a.shape().rank() != 2 || b.shape().rank() != 2 || a.shape()[1] != b.shape()[0])
    throw ShapeError(detail::cat("matmul: shapes ", a.shape(), " and ", b.shape(), " do not chain (need (M,K)·(K,N))"));
  std::int64_t const M = a.shape()[0], Kd = a.shape()[1], N = b.shape()[1];
  Tensor<T, S> y(Shape{M, N});
  K::gemm(Trans::kNo, Trans::kNo, M, N, Kd, T(1), a.value().data(), b.value().data(), T(0), y.data());
  return detail::record(
      "matmul", std::move(y),
      [a, b, M, N, Kd](Node<T, S>& self) {
        if (a.requires_grad()) {  // ga (M,K) = gy (M,N) · bᵀ
          auto& an = a.node();
          T const beta = detail::grad_beta(an);
          K::gemm(Trans::kNo, Trans::kYes, M, Kd, N, T(1), self.grad.data(), b.value().data(), beta, an.grad.data());
        }
        if (b.requires_grad()) {  // gb (K,N) = aᵀ · gy
          auto& bn = b.node();
          T const beta = detail::grad_beta(bn);
          K::gemm(Trans::kYes, Trans::kNo, Kd, N, M, T(1), a.value().data(), self.grad.data(), beta, bn.grad.data());
        }
      },
      a, b);
}

// Batched matrix product over the leading dimensions: a:(…, M, K) (or (…, K, M) with ta = kYes), b:(…, K, N) (or
// (…, N, K) with tb = kYes) -> (…, M, N), one GEMM per leading index (attention's q·kᵀ and att·v).
template <class T, MemorySpace S>
Variable<T, S> bmm(Variable<T, S> const& a, Variable<T, S> const& b, Trans ta = Trans::kNo, Trans tb = Trans::kNo) {
  using K = Kernels<S>;
  Shape const &as = a.shape(), &bs = b.shape();
  int const r = as.rank();
  bool lead_ok = r >= 2 && bs.rank() == r;
  for (int d = 0; lead_ok && d < r - 2; ++d) lead_ok = as[d] == bs[d];
  std::int64_t const M = lead_ok ? as[r - 2 + (ta == Trans::kYes)] : 0,
                     Ka = lead_ok ? as[r - 1 - (ta == Trans::kYes)] : 0;
  std::int64_t const Kb = lead_ok ? bs[r - 2 + (tb == Trans::kYes)] : 0,
                     N = lead_ok ? bs[r - 1 - (tb == Trans::kYes)] : 0;
  if (!lead_ok || Ka != Kb)
    throw ShapeError(detail::cat("bmm: shapes ", as, ta == Trans::kYes ? "ᵀ" : "", " and ", bs,
                                 tb == Trans::kYes ? "ᵀ" : "",
                                 " do not chain (need (…, M, K)·(…, K, N), same leading dims)"));
  std::int64_t const Kd = Ka, batch = M * Kd != 0 ? as.numel() / (M * Kd) : 0;
  std::array<std::int64_t, 4> dims{};
  for (int d = 0; d < r - 2; ++d) dims[static_cast<std::size_t>(d)] = as[d];
  dims[static_cast<std::size_t>(r - 2)] = M;
  dims[static_cast<std::size_t>(r - 1)] = N;
  Tensor<T, S> y(Shape::from_range(dims.begin(), dims.begin() + r));
  for (std::int64_t i = 0; i < batch; ++i)
    K::gemm(ta, tb, M, N, Kd, T(1), a.value().data() + i * M * Kd, b.value().data() + i * Kd * N, T(0),
            y.data() + i * M * N);
  return detail::record(
      "bmm", std::move(y),
      [a, b, ta, tb, batch, M, N, Kd](Node<T, S>& self) {
        T const* gy = self.grad.data();
        if (a.requires_grad()) {  // op(a) = gy·op(b)ᵀ: ga = gy·op(b)ᵀ, or (ta) its transpose op(b)·gyᵀ
          auto& an = a.node();
          T const beta = detail::grad_beta(an);
          T const* bv = b.value().data();
          for (std::int64_t i = 0; i < batch; ++i) {
            T* ga = an.grad.data() + i * M * Kd;
            if (ta == Trans::kNo)
              K::gemm(Trans::kNo, tb == Trans::kNo ? Trans::kYes : Trans::kNo, M, Kd, N, T(1), gy + i * M * N,
                      bv + i * Kd * N, beta, ga);
            else
              K::gemm(tb == Trans::kNo ? Trans::kNo : Trans::kYes, Trans::kYes, Kd, M, N, T(1), bv + i * Kd * N,
                      gy + i * M * N, beta, ga);
          }
        }
        if (b.requires_grad()) {  // op(b) = op(a)ᵀ·gy: gb = op(a)ᵀ·gy, or (tb) its transpose gyᵀ·op(a)
          auto& bn = b.node();
          T const beta = detail::grad_beta(bn);
          T const* av = a.value().data();
          for (std::int64_t i = 0; i < batch; ++i) {
            T* gb = bn.grad.data() + i * Kd * N;
            if (tb == Trans::kNo)
              K::gemm(ta == Trans::kNo ? Trans::kYes : Trans::kNo, Trans::kNo, Kd, N, M, T(1), av + i * M * Kd,
                      gy + i * M * N, beta, gb);
            else
              K::gemm(Trans::kYes, ta == Trans::kNo ? Trans::kNo : Trans::kYes, N, Kd, M, T(1), gy + i * M * N,
                      av + i * M * Kd, beta, gb);
          }
        }
      },
      a, b);
}

namespace detail {
// y = [r +] x Wᵀ [+ b]: linear() and linear_residual(), one body. r (undefined for linear) has y's shape.
template <class T, MemorySpace S>
Variable<T, S> linear_op(char const* op, Variable<T, S> const& r, Variable<T, S> const& x, Variable<T, S> const& w,
                         Variable<T, S> const& b) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (w.shape().rank() != 2 || xs.rank() < 1 || xs[xs.rank() - 1] != w.shape()[1])
    throw ShapeError(cat(op, ": input of shape ", xs, " does not match weight of shape ", w.shape(),
                         " (need input (..., ", w.shape().rank() == 2 ? w.shape()[1] : -1, "))"));
  std::int64_t const in = w.shape()[1], out = w.shape()[0], rows = xs.numel_from(0) / (in ? in : 1);
  if (b.defined() && !(b.shape() == Shape{out}))
    throw ShapeError(cat(op, ": bias has shape ", b.shape(), ", expected [", out, "]"));
  Shape const ys = [&] {
    std::array<std::int64_t, 4> d{};
    for (int i = 0; i < xs.rank(); ++i) d[i] = xs[i];
    d[xs.rank() - 1] = out;
    return Shape::from_range(d.begin(), d.begin() + xs.rank());
  }();
  if (r.defined() && !(r.shape() == ys))
    throw ShapeError(cat(op, ": residual has shape ", r.shape(), " but the product has shape ", ys));
  Tensor<T, S> y(ys);
  // y starts as the residual and/or the bias in every row, and the product adds onto it (beta 1), as torch's addmm
  // does: one pass over y instead of two (a GEMM with beta 0 zeroes y first, then the sum is added).
  T y_beta = T(0);
  if (rows > 0 && (r.defined() || b.defined())) {
    if (r.defined() && b.defined())
      K::add_row_broadcast(rows, out, r.value().data(), b.value().data(), y.data());
    else if (r.defined())
      K::copy(rows * out, r.value().data(), y.data());
    else
      K::copy_rows(rows, out, b.value().data(), 0, T(0), y.data(), out);
    y_beta = T(1);
  }
  K::gemm(Trans::kNo, Trans::kYes, rows, out, in, T(1), x.value().data(), w.value().data(), y_beta, y.data());
  auto bwd = [r, x, w, b, rows, in, out](Node<T, S>& self) {
    T const* gy = self.grad.data();
    if (w.requires_grad()) {  // gW (out,in) = gyᵀ (out,rows) · x (rows,in)
      auto& wn = w.node();
      T const beta = grad_beta(wn);
      K::gemm(Trans::kYes, Trans::kNo, out, in, rows, T(1), gy, x.value().data(), beta, wn.grad.data());
    }
    if (b.defined() && b.requires_grad()) {  // gb = column sums of gy
      auto& bn = b.node();
      T const beta = grad_beta(bn);
      K::sum_rows(rows, out, gy, beta, bn.grad.data());
    }
    if (x.requires_grad()) {  // gx (rows,in) = gy (rows,out) · W (out,in)
      auto& xn = x.node();
      T const beta = grad_beta(xn);
      K::gemm(Trans::kNo, Trans::kNo, rows, in, out, T(1), gy, w.value().data(), beta, xn.grad.data());
    }
    // gr = gy: lent when it can be (pass_grad), so last, after every read of gy above.
    if (r.defined() && r.requires_grad()) pass_grad(self, r.node());
  };
  if (r.defined() && b.defined()) return record(op, std::move(y), std::move(bwd), x, w, b, r);
  if (r.defined()) return record(op, std::move(y), std::move(bwd), x, w, r);
  if (b.defined()) return record(op, std::move(y), std::move(bwd), x, w, b);
  return record(op, std::move(y), std::move(bwd), x, w);
}
}  // namespace detail

// x:(..., in) W:(out, in) b:(out) or undefined -> (..., out). Leading dims are flattened into rows.
template <class T, MemorySpace S>
Variable<T, S> linear(Variable<T, S> const& x, Variable<T, S> const& w, Variable<T, S> const& b = {}) {
  return detail::linear_op<T, S>("linear", {}, x, w, b);
}

// r + linear(x, W, b), r of the product's shape, as one op: a pre-LN transformer block's residual update
// h = x + proj(y), folded in the way torch.addmm(input, …) folds its input. y starts as r plus the bias and the
// product adds onto it, so the sum takes no pass over memory of its own; the backward hands y's gradient to r by
// lending it (detail::pass_grad) where it can, instead of copying it. The same value as add(r, linear(x, W, b)) up
// to the order of the float additions.
template <class T, MemorySpace S>
Variable<T, S> linear_residual(Variable<T, S> const& r, Variable<T, S> const& x, Variable<T, S> const& w,
                               Variable<T, S> const& b = {}) {
  if (!r.defined()) throw ArgumentError("linear_residual: the residual r is undefined");
  return detail::linear_op<T, S>("linear_residual", r, x, w, b);
}

}  // namespace ddp
