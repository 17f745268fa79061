// libFuzzer target: the IDX reader (plain and gzip) on arbitrary bytes. Built by tools/fuzz.sh with clang++-14
// -fsanitize=fuzzer,address,undefined; its crashes are kept in test/fuzz/regressions/idx and replayed by
// //test/fuzz:regressions_test.
#include <cstddef>
#include <cstdint>

#include "test/fuzz/fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  ddp::fuzz::idx_one({data, size});
  return 0;
}
