"""The warning set ddp's headers are held to, applied to the translation units that instantiate them widely.

GCC's common warnings, with ddp's headers on -I (Bazel's `includes` makes them -isystem, which hides their
warnings; -Iinclude is searched first) and third-party headers still on -isystem: what a careful user's -Werror
build sees. The examples (host, device on Thrust's CPU system, MPI), the nn and device tests and the NCCL
backend compiled by g++ are built with it, so a warning in a header fails the build itself, with no second
compile. -Wuninitialized stays a warning, not an error: GCC 12.1-12.2's AVX-512 intrinsics make their
"undefined" vectors by self-initialisation (`__m512 __Y = __Y;` in avx512fintrin.h, GCC bug 105593), which
-march=native on an AVX-512 host reports inside every Eigen kernel; Clang's front end checks ddp's own reads of
uninitialised values in //test/tools:clang_test.
"""

DDP_WARNING_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Wshadow",
    "-Wnon-virtual-dtor",
    "-Woverloaded-virtual",
    "-Werror",
    "-Wno-error=uninitialized",
]
