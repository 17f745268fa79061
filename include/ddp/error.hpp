// ddp::Error, the one base of every exception ddp throws (besides std::bad_alloc when memory runs out), and
// its families: every exception class ddp defines is in this header.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

// Every error ddp raises derives from this. Messages name the thing (parameter, rank, file, shape) and,
// where there is one, what to do about it.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string const& what) : std::runtime_error(what) {}
};

// A shape or size that does not fit the operation (names both shapes).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A bad argument or option value (names the option).
class ArgumentError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file failed, or its content is invalid (names the file).
class IoError : public Error {
 public:
  using Error::Error;
};

// A collective failed, timed out, or a peer rank failed (names the rank and the operation).
class CommError : public Error {
 public:
  CommError(std::string const& what, int rank = -1) : Error(what), rank_(rank) {}
  // The rank that reported or caused the failure, or -1 when unknown.
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

// A data-parallel invariant broken across ranks (different models, bucket plans or collective orders, a
// parameter without a gradient): DistributedDataParallel raises it on every rank for the same cause.
class DdpError : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime, cuBLAS or cuDNN call failed (names the call and the library's message). Raised only by the
// CUDA builds (device_buffer.hpp, device_blas.hpp, device_conv_kernels.hpp).
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Builds a message from streamable parts: ddp::detail::cat("param ", name, " has shape ", shape).
template <class... Ts>
std::string cat(Ts const&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace ddp
