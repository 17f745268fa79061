// detail::describe(exception_ptr): the message of a captured exception, for errors that one rank reports on
// behalf of another (spawn's group failure, MpiSession's setup agreement).
#pragma once

#include <exception>
#include <string>

namespace ddp::detail {

inline std::string describe(std::exception_ptr const& e) {
  try {
    std::rethrow_exception(e);
  } catch (std::exception const& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace ddp::detail
