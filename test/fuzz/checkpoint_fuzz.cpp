// libFuzzer target: the checkpoint decoder on arbitrary bytes, as they are and with a consistent header (so that
// mutations reach every section). Built by tools/fuzz.sh with clang++-14 -fsanitize=fuzzer,address,undefined;
// its crashes are kept in test/fuzz/regressions/checkpoint and replayed by //test/fuzz:regressions_test.
#include <cstddef>
#include <cstdint>

#include "test/fuzz/fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  ddp::fuzz::checkpoint_one({data, size});
  return 0;
}
