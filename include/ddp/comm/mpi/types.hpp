// The MPI datatype and operation for ddp's element types and reductions.
#pragma once

#include <mpi.h>

#include <concepts>
#include <cstdint>

#include "ddp/comm/communicator.hpp"

namespace ddp::detail {

template <CommElement T>
inline MPI_Datatype mpi_type() noexcept {
  if constexpr (std::same_as<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::same_as<T, std::int32_t>)
    return MPI_INT32_T;
  else
    return MPI_INT64_T;
}

inline MPI_Op mpi_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;  // kAvg: sum, then one scaling pass (MPI has no average)
  }
}

}  // namespace ddp::detail
