// reshape and flatten: views that share storage (their gradients alias too when nothing else is there); transpose
// and slice_last: copies that swap two axes or take a range of the last dimension (attention's heads and q, k, v).
#pragma once

#include <array>
#include <utility>
#include <vector>

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

// x with dimensions i and j swapped (torch.transpose(x, i, j)), as a contiguous copy. Rank at most 4.
template <class T, MemorySpace S>
Variable<T, S> transpose(Variable<T, S> const& x, int i, int j) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (i < 0) i += xs.rank();
  if (j < 0) j += xs.rank();
  if (i < 0 || j < 0 || i >= xs.rank() || j >= xs.rank())
    throw ShapeError(detail::cat("transpose: dimensions ", i, " and ", j, " of a tensor of shape ", xs));
  if (i == j) return x;
  if (i > j) std::swap(i, j);
  AxisSwap sw;
  for (int d = 0; d < xs.rank(); ++d) {
    std::int64_t const n = xs[d];
    if (d < i)
      sw.pre *= n;
    else if (d == i)
      sw.di = n;
    else if (d < j)
      sw.mid *= n;
    else if (d == j)
      sw.dj = n;
    else
      sw.post *= n;
  }
  std::array<std::int64_t, 4> dims{};
  for (int d = 0; d < xs.rank(); ++d) dims[static_cast<std::size_t>(d)] = xs[d];
  std::swap(dims[static_cast<std::size_t>(i)], dims[static_cast<std::size_t>(j)]);
  Tensor<T, S> y(Shape::from_range(dims.begin(), dims.begin() + xs.rank()));
  K::swap_axes(sw, x.value().data(), T(0), y.data());
  AxisSwap const back{.pre = sw.pre, .di = sw.dj, .mid = sw.mid, .dj = sw.di, .post = sw.post};
  return detail::record(
      "transpose", std::move(y),
      [x, back](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        K::swap_axes(back, self.grad.data(), beta, xn.grad.data());
      },
      x);
}

// Elements [start, start + length) of the last dimension: (…, C) -> (…, length), a copy (torch's x.narrow(-1,
// start, length), or one piece of split). Its backward adds into that range of x's gradient, zeroing the rest when
// it is the first contribution.
template <class T, MemorySpace S>
Variable<T, S> slice_last(Variable<T, S> const& x, std::int64_t start, std::int64_t length) {
  using K = Kernels<S>;
  Shape const& xs = x.shape();
  if (xs.rank() < 1) throw ShapeError("slice_last: needs at least one dimension");
  std::int64_t const cols = xs[xs.rank() - 1], rows = cols ? xs.numel() / cols : 0;
  if (start < 0 || length < 0 || start + length > cols)
    throw ShapeError(detail::cat("slice_last: elements [", start, ", ", start + length,
                                 ") of a last dimension of size ", cols, " (shape ", xs, ")"));
  std::array<std::int64_t, 4> dims{};
  for (int d = 0; d < xs.rank(); ++d) dims[static_cast<std::size_t>(d)] = xs[d];
  dims[static_cast<std::size_t>(xs.rank() - 1)] = length;
  Tensor<T, S> y(Shape::from_range(dims.begin(), dims.begin() + xs.rank()));
  K::copy_rows(rows, length, x.value().data() + start, cols, T(0), y.data(), length);
  return detail::record(
      "slice_last", std::move(y),
      [x, rows, cols, start, length](Node<T, S>& self) {
        auto& xn = x.node();
        T const beta = detail::grad_beta(xn);
        if (beta == T(0) && length != cols) K::fill(rows * cols, T(0), xn.grad.data());
        K::copy_rows(rows, length, self.grad.data(), length, length == cols ? beta : T(1), xn.grad.data() + start,
                     cols);
      },
      x);
}

// The last dimension cut into n equal pieces (torch.split(x, C / n, -1)).
template <class T, MemorySpace S>
std::vector<Variable<T, S>> split_last(Variable<T, S> const& x, std::int64_t n) {
  std::int64_t const cols = x.shape().rank() ? x.shape()[x.shape().rank() - 1] : 0;
  if (n <= 0 || cols % n != 0)
    throw ShapeError(detail::cat("split_last: a last dimension of size ", cols, " does not split into ", n,
                                 " equal pieces (shape ", x.shape(), ")"));
  std::vector<Variable<T, S>> out;
  for (std::int64_t k = 0; k < n; ++k) out.push_back(slice_last(x, k * (cols / n), cols / n));
  return out;
}

}  // namespace ddp
