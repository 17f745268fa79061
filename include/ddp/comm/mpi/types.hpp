// The MPI datatype and operation for ddp's element types and reductions. bfloat16 and float16 travel as
// MPI_UINT16_T under user-defined operations (MpiHalfOps) that add (max, min) each pair in float and round.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <concepts>
#include <cstdint>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/detail/reduce.hpp"
#include "ddp/error.hpp"

namespace ddp::detail {

template <CommElement T>
inline MPI_Datatype mpi_type() noexcept {
  if constexpr (std::same_as<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::same_as<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::same_as<T, std::int64_t>)
    return MPI_INT64_T;
  else
    return MPI_UINT16_T;  // bfloat16, float16: the operation (MpiHalfOps) knows the format
}

inline MPI_Op mpi_builtin_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;  // kAvg: sum, then one scaling pass (MPI has no average)
  }
}

// MPI user function: inout[i] = Op(in[i], inout[i]) on 16-bit floats, computed in float (MPI_User_function).
template <HalfFloat H, class Op>
void mpi_half_fn(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  auto const* a = static_cast<H const*>(in);
  auto* b = static_cast<H*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Op::apply(a[i], b[i]);
}

// The user-defined operations for bfloat16 and float16 (sum, max, min), created for one backend's lifetime
// (MPI_Op_create after MPI_Init; freed before MPI_Finalize).
class MpiHalfOps {
 public:
  MpiHalfOps() {
    create<bfloat16>(0);
    create<float16>(3);
  }
  MpiHalfOps(MpiHalfOps const&) = delete;
  MpiHalfOps& operator=(MpiHalfOps const&) = delete;
  ~MpiHalfOps() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& o : ops_)
      if (o != MPI_OP_NULL) MPI_Op_free(&o);
  }

  // The operation for element type T (kAvg: the sum; the caller scales).
  template <CommElement T>
  MPI_Op op(ReduceOp r) const noexcept {
    if constexpr (!HalfFloat<T>) {
      return mpi_builtin_op(r);
    } else {
      std::size_t const base = std::same_as<T, bfloat16> ? 0 : 3;
      return ops_[base + (r == ReduceOp::kMax ? 1 : r == ReduceOp::kMin ? 2 : 0)];
    }
  }

 private:
  template <HalfFloat H>
  void create(std::size_t base) {
    make(&mpi_half_fn<H, PlusOp>, base);
    make(&mpi_half_fn<H, MaxOp>, base + 1);
    make(&mpi_half_fn<H, MinOp>, base + 2);
  }
  void make(MPI_User_function* fn, std::size_t k) {
    if (int rc = MPI_Op_create(fn, /*commute=*/1, &ops_[k]); rc != MPI_SUCCESS)
      throw CommError(cat("ddp mpi: MPI_Op_create for the 16-bit float reductions failed (code ", rc, ")"));
  }

  MPI_Op ops_[6] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace ddp::detail
