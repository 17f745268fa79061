"""Test helpers: unity test binaries, one test target per source, and mpirun with several world sizes."""

def unity_source(name, tests = [], mains = {}):
    """Generates `<name>.cpp`: the sources as one translation unit (test/tools/unity.sh), for unity_binary or a
    cuda_library. tests: doctest sources; mains: {program name: source} of programs with their own main()."""
    cmd = ["$(location //test/tools:unity.sh)", "$@"]
    if tests:
        cmd += ["--tests"] + ["$(location %s)" % t for t in tests]
    if mains:
        cmd += ["--mains"] + ["%s=$(location %s)" % (p, s) for p, s in mains.items()]
    native.genrule(
        name = name,
        testonly = True,
        srcs = tests + mains.values(),
        outs = [name + ".cpp"],
        cmd = " ".join(cmd),
        tools = ["//test/tools:unity.sh"],
    )

def unity_binary(name, tests = [], mains = {}, deps = [], **kwargs):
    """A testonly cc_binary compiled as one translation unit from several sources (unity_source).

    tests: doctest sources; run them with unity_tests (one test target per source).
    mains: {program name: source} of programs with their own main() (MPI tests); `name PROGRAM ARGS...` runs
      one, so mpi_test(binary = name, args = [PROGRAM, ...]).
    A package's tests share most of their template instantiations (models, DDP, optimizers, backends), so one
    unit compiles them several times faster than one unit per file. File-local names (in anonymous
    namespaces) must therefore be distinct across the sources of one binary.
    """
    unity_source(name = name + "_unity", tests = tests, mains = mains)
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = [name + "_unity"],
        deps = deps + ["//test:unity_main"],
        **kwargs
    )

def unity_tests(binary, tests, size = "small", data = [], **kwargs):
    """One sh_test per doctest source compiled into `binary` (a unity_binary): tests = {test name: source}.

    Each runs only its own source's cases (doctest's --source-file filter) and fails if none ran.
    """
    for name, src in tests.items():
        native.sh_test(
            name = name,
            size = size,
            srcs = ["//test/tools:doctest_file.sh"],
            args = ["$(rootpath %s)" % binary, native.package_name() + "/" + src],
            data = [binary] + data,
            **kwargs
        )

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
