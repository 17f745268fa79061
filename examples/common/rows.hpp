// slice_rows: a copy of rows [from, from + count) of a row-major host tensor, for the examples that cut one
// synthetic batch per rank and step out of a whole data set.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ddp/ddp.hpp"

namespace ddp::examples {

inline Tensor<float> slice_rows(Tensor<float> const& t, std::int64_t from, std::int64_t count) {
  std::int64_t const w = t.numel() / t.shape()[0];
  Tensor<float> r(Shape{count, w});
  std::copy(t.data() + from * w, t.data() + (from + count) * w, r.data());
  return r;
}

}  // namespace ddp::examples
