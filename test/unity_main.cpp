// main() of the unity test binaries (test/tools/defs.bzl: unity_binary). `binary PROGRAM ARGS...` runs one of
// the programs compiled into the binary (an MPI test's own main(), renamed by test/tools/unity.sh) as if it
// were started as PROGRAM ARGS...; any other command line runs the binary's doctest cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

namespace ddp_unity {
struct Program {
  char const* name;
  int (*main)(int, char**);
};
extern Program const kPrograms[];  // null-terminated; written by test/tools/unity.sh
}  // namespace ddp_unity

int main(int argc, char** argv) {
  if (argc > 1)
    for (auto const* p = ddp_unity::kPrograms; p->name != nullptr; ++p)
      if (std::strcmp(argv[1], p->name) == 0) return p->main(argc - 1, argv + 1);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
