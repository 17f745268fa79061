"""Test helpers: run a binary under mpirun with several world sizes."""

def mpi_test(name, binary, nps = [2, 4], args = [], size = "small", tags = [], **kwargs):
    """One sh_test per world size: <name>_np<N> runs `mpirun -n N <binary> <args>`."""
    for np in nps:
        native.sh_test(
            name = "%s_np%d" % (name, np),
            size = size,
            srcs = ["//test/tools:mpirun_test.sh"],
            args = [str(np), "$(rootpath %s)" % binary] + args,
            data = [binary],
            tags = ["mpi"] + tags,
            **kwargs
        )
