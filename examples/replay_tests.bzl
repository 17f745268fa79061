"""replay_tests: one test per (fixture, run, backend, tensors) that runs //examples:replay and expects exit 0."""

def replay_tests(fixtures):
    for fixture, runs in fixtures.items():
        for run, world in runs.items():
            for tensors in ["host", "device"]:
                suffix = "" if tensors == "host" else "_device"
                args = ["--fixture", "test/fixtures/" + fixture, "--run", run, "--tensors", tensors]
                native.sh_test(
                    name = "replay_%s_%s_threads%s" % (fixture, run, suffix),
                    size = "small",
                    srcs = ["run_example_test.sh"],
                    args = ["$(rootpath :replay)"] + args,
                    data = [":replay", "//test:fixtures"],
                )
                native.sh_test(
                    name = "replay_%s_%s_mpi%s" % (fixture, run, suffix),
                    size = "small",
                    srcs = ["//test/tools:mpirun_test.sh"],
                    args = [str(world), "$(rootpath :replay)"] + args + ["--backend", "mpi"],
                    data = [":replay", "//test:fixtures"],
                    tags = ["mpi"],
                )
