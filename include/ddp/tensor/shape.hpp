// Shape: up to 4 dimensions, row-major; the one shape type tensors, layers and errors use.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>

#include "ddp/error.hpp"

namespace ddp {

class Shape {
 public:
  static constexpr int kMaxRank = 4;

  constexpr Shape() noexcept = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    if (dims.size() > kMaxRank)
      throw ShapeError(detail::cat("shape has ", dims.size(), " dims; ddp tensors have at most 4"));
    for (auto d : dims) {
      if (d < 0) throw ShapeError(detail::cat("negative dimension ", d, " in shape"));
      dims_[rank_++] = d;
    }
  }
  template <class It>
  static Shape from_range(It first, It last) {
    Shape s;
    for (; first != last; ++first) {
      if (s.rank_ == kMaxRank) throw ShapeError("shape has more than 4 dims; ddp tensors have at most 4");
      if (*first < 0) throw ShapeError(detail::cat("negative dimension ", *first, " in shape"));
      s.dims_[s.rank_++] = static_cast<std::int64_t>(*first);
    }
    return s;
  }

  constexpr int rank() const noexcept { return rank_; }
  constexpr std::int64_t operator[](int i) const noexcept { return dims_[i]; }
  // Negative indices count from the back, as in PyTorch.
  std::int64_t dim(int i) const {
    int j = i < 0 ? i + rank_ : i;
    if (j < 0 || j >= rank_) throw ShapeError(detail::cat("dim ", i, " out of range for shape ", str()));
    return dims_[j];
  }
  constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Product of dims [from, rank).
  constexpr std::int64_t numel_from(int from) const noexcept {
    std::int64_t n = 1;
    for (int i = from; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  friend constexpr bool operator==(Shape const& a, Shape const& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::ostringstream os;
    os << *this;
    return os.str();
  }
  friend std::ostream& operator<<(std::ostream& os, Shape const& s) {
    os << '[';
    for (int i = 0; i < s.rank_; ++i) os << (i ? ", " : "") << s.dims_[i];
    return os << ']';
  }

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace ddp
