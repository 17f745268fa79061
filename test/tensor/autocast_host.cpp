// Compiled by //test/tensor:autocast_host_compile_test: with -DDDP_AUTOCAST_HOST, asking host tensors for mixed
// precision must be a compile error naming the fix (device tensors); without it, the device scope compiles.
#include "ddp/tensor/precision.hpp"

int main() {
#ifdef DDP_AUTOCAST_HOST
  ddp::basic_autocast<ddp::HostSpace> guard(ddp::Precision::kBf16);
#else
  ddp::autocast guard(ddp::Precision::kBf16);
#endif
  return ddp::matmul_precision() == ddp::Precision::kBf16 ? 0 : 1;
}
