# Sourced by clang_test.sh: compile against ddp's source tree as a user would.
# source_tree_root FILE: sets `root` to the first directory above FILE's real path (runfiles are symlinks into
# the source tree) that holds include/ddp/ddp.hpp, and `real` to that path; fails the test if there is none.
source_tree_root() {
  real="$(readlink -f "$1")"
  root="$(dirname "$real")"
  while [ "$root" != / ] && [ ! -f "$root/include/ddp/ddp.hpp" ]; do root="$(dirname "$root")"; done
  [ -f "$root/include/ddp/ddp.hpp" ] || { echo "FAIL: no include/ddp/ddp.hpp above $real"; exit 1; }
}
# ddp's headers on -I (Bazel's `includes` makes them -isystem, which hides their warnings); Eigen and MPICH on
# -isystem, where Debian puts them (Thrust and CUDA: the caller adds @cuda's directories, tools/cuda_repo.bzl).
# Relative to the root.
source_tree_includes=(-I include -I . -isystem /usr/include/eigen3 -isystem /usr/include/x86_64-linux-gnu/mpich)
