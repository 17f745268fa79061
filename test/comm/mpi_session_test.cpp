// ddp/comm/mpi/session.hpp: options are checked before MPI is touched.
#include "ddp/comm/mpi/session.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace std::chrono_literals;

namespace {
std::string construct_error(ddp::MpiSessionOptions options) {
  try {
    ddp::MpiSession session(options);
  } catch (ddp::ArgumentError const& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("MpiSessionOptions: a negative duration is an error naming the field, raised before MPI_Init") {
  CHECK(construct_error({.finalize_quiet = -1ms}).find("MpiSessionOptions::finalize_quiet must be >= 0 ms, got -1") !=
        std::string::npos);
  CHECK(construct_error({.finalize_timeout = -5ms})
            .find("MpiSessionOptions::finalize_timeout must be >= 0 ms (0: no limit), got -5") != std::string::npos);
  int initialized = 1;
  MPI_Initialized(&initialized);
  CHECK(initialized == 0);
}
