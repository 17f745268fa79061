"""cluster_test: runs a binary under mpiexec across namespace hosts (tools/cluster/cluster.sh)."""

def cluster_test(name, hosts, ppn, binary, args = [], rate = None, expect = None, data = [], size = "small",
                 launcher = "mpiexec.sh", env = {}):
    """<name>_test: `cluster.sh --hosts H [--rate R] -- LAUNCHER PPN H*PPN binary args`, expecting exit 0
    (and, with expect, the extended regex in the output). launcher: mpiexec.sh (MPI) or glooexec.sh (no MPI:
    torchrun-style variables, rank 0 serving the store)."""
    cmd = ["tools/cluster/cluster.sh", "--hosts", str(hosts)]
    if rate:
        cmd += ["--rate", rate]
    cmd += ["--", "tools/cluster/" + launcher, str(ppn), str(hosts * ppn), "$(rootpath %s)" % binary] + args
    native.sh_test(
        name = name + "_test",
        size = size,
        srcs = ["cluster_test.sh"],
        args = (["test/cluster/expect_output.sh", "'%s'" % expect] if expect else []) + cmd,
        data = [binary, "//tools/cluster", "expect_output.sh"] + data,
        env = env,
        tags = ["local", "mpi", "netns"],
    )
