// embedding: a lookup of rows of a table by integer ids (forward a gather, backward a scatter-add), as
// torch.nn.functional.embedding.
#pragma once

#include <array>

#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

namespace detail {
// ids' shape with `dim` appended: (…) -> (…, dim).
inline Shape append_dim(Shape const& s, std::int64_t dim) {
  if (s.rank() >= 4)
    throw ShapeError(cat("embedding: ids of shape ", s, " have 4 dimensions; at most 3 are supported"));
  std::array<std::int64_t, 4> d{};
  for (int i = 0; i < s.rank(); ++i) d[static_cast<std::size_t>(i)] = s[i];
  d[static_cast<std::size_t>(s.rank())] = dim;
  return Shape::from_range(d.begin(), d.begin() + s.rank() + 1);
}
}  // namespace detail

// table:(rows, dim) ids:(…) int32 in [0, rows) -> (…, dim). The gradient of the table adds the rows of the
// output gradient into the rows their ids name, in index order: bitwise reproducible whatever the thread count
// (and, used together with another op on the same table, e.g. a tied output head, added to that op's gradient).
// Host ids are checked here (an ArgumentError naming the position and the id); device ids are checked by the
// kernel and a bad one is reported at the next host read (device_errors.hpp), its output row NaN.
template <class T, MemorySpace S>
Variable<T, S> embedding(Variable<T, S> const& table, Tensor<std::int32_t, S> const& ids) {
  using K = Kernels<S>;
  if (table.shape().rank() != 2)
    throw ShapeError(detail::cat("embedding: the table has shape ", table.shape(), "; expected (num_embeddings, dim)"));
  std::int64_t const rows = table.shape()[0], dim = table.shape()[1], n = ids.numel();
  if constexpr (std::same_as<S, HostSpace>) {
    for (std::int64_t i = 0; i < n; ++i)
      if (ids[i] < 0 || ids[i] >= rows)
        throw ArgumentError(detail::cat("embedding: id ", ids[i], " at position ", i, " is outside [0, ", rows,
                                        ") (the table has ", rows, " rows)"));
  }
  Tensor<T, S> y(detail::append_dim(ids.shape(), dim));
  K::embedding_fwd(n, rows, dim, table.value().data(), ids.data(), y.data());
  return detail::record(
      "embedding", std::move(y),
      [table, ids, n, rows, dim](Node<T, S>& self) {
        auto& tn = table.node();
        T const beta = detail::grad_beta(tn);
        K::embedding_bwd(n, rows, dim, ids.data(), self.grad.data(), beta, tn.grad.data());
      },
      table);
}

}  // namespace ddp
