// The Dataset concept (size + collate a batch from sample indices), Batch<Target>, and the in-memory TensorDataset.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "ddp/error.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// One mini-batch: inputs x (B, sample dims...) and targets y, (B) class ids when Target is int32 (cross-entropy)
// or (B) / (B, k) values when Target is float (regression). Rows of x and y correspond.
template <TensorElement Target>
struct Batch {
  using target_type = Target;
  Tensor<float> x;
  Tensor<Target> y;

  // Number of samples (the leading dimension of x).
  std::int64_t size() const { return x.rank() > 0 ? x.size(0) : 0; }
};

// A dataset: a size and a way to gather the samples at some indices into one Batch.
//   d.size()         number of samples, N
//   d.collate(idx)   Batch<target_type> with x.size(0) == y.size(0) == idx.size(), row i = sample idx[i];
//                    throws ArgumentError for an index outside [0, N)
// Samplers produce the indices and DataLoader cuts them into batches, so a Dataset never sees epochs or ranks.
template <class D>
concept Dataset = requires(D const& d, std::span<std::int64_t const> idx) {
  typename D::target_type;
  requires TensorElement<typename D::target_type>;
  { d.size() } -> std::convertible_to<std::int64_t>;
  { d.collate(idx) } -> std::same_as<Batch<typename D::target_type>>;
};

template <Dataset D>
using batch_t = Batch<typename D::target_type>;

namespace detail {

// `s` with its leading dimension replaced by `n`, or dropped when n < 0.
inline Shape with_leading(Shape const& s, std::int64_t n) {
  std::array<std::int64_t, Shape::kMaxRank> dims{};
  for (int d = 0; d < s.rank(); ++d) dims[static_cast<std::size_t>(d)] = s[d];
  if (n >= 0) {
    dims[0] = n;
    return Shape::from_range(dims.begin(), dims.begin() + s.rank());
  }
  return Shape::from_range(dims.begin() + 1, dims.begin() + s.rank());
}

// Copies rows idx[0..B) of `src` (N, ...) into a new (B, ...) tensor; `what` names the dataset in errors.
template <TensorElement T>
Tensor<T> gather_rows(Tensor<T> const& src, std::span<std::int64_t const> idx, char const* what) {
  std::int64_t const n = src.size(0);
  std::int64_t const row = src.shape().numel_from(1);
  Tensor<T> out(with_leading(src.shape(), static_cast<std::int64_t>(idx.size())));
  for (std::size_t i = 0; i < idx.size(); ++i) {
    std::int64_t const k = idx[i];
    if (k < 0 || k >= n)
      throw ArgumentError(
          detail::cat(what, ": sample index ", k, " (position ", i, " of the batch) is outside [0, ", n, ")"));
    if (row) std::memcpy(out.data() + static_cast<std::int64_t>(i) * row, src.data() + k * row, sizeof(T) * row);
  }
  return out;
}

}  // namespace detail

// In-memory dataset over x (N, ...) and y (N) or (N, k), like torch.utils.data.TensorDataset. Shares the
// tensors' storage (no copy at construction). collate() is O(B · sample size), allocates one x and one y
// tensor, is const and safe to call from several threads at once (it only reads x and y).
template <TensorElement Target>
class TensorDataset {
 public:
  using target_type = Target;

  TensorDataset(Tensor<float> x, Tensor<Target> y) : x_(std::move(x)), y_(std::move(y)) {
    if (x_.rank() < 1)
      throw ShapeError(detail::cat("TensorDataset: x must have a leading sample dimension, got shape ", x_.shape()));
    if (y_.rank() < 1 || y_.rank() > 2)
      throw ShapeError(detail::cat("TensorDataset: y must have shape (N) or (N, k), got ", y_.shape()));
    if (x_.size(0) != y_.size(0))
      throw ShapeError(detail::cat("TensorDataset: x has shape ", x_.shape(), " but y has shape ", y_.shape(),
                                   "; their first dimensions (sample counts ", x_.size(0), " and ", y_.size(0),
                                   ") must match"));
  }

  std::int64_t size() const noexcept { return x_.size(0); }
  Tensor<float> const& x() const noexcept { return x_; }
  Tensor<Target> const& y() const noexcept { return y_; }
  // Shape of one sample (x's shape without the leading N).
  Shape sample_shape() const { return detail::with_leading(x_.shape(), -1); }

  Batch<Target> collate(std::span<std::int64_t const> idx) const {
    return {detail::gather_rows(x_, idx, "TensorDataset"), detail::gather_rows(y_, idx, "TensorDataset")};
  }

 private:
  Tensor<float> x_;
  Tensor<Target> y_;
};

static_assert(Dataset<TensorDataset<std::int32_t>>);
static_assert(Dataset<TensorDataset<float>>);

}  // namespace ddp
