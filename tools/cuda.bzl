"""Minimal nvcc support for Bazel 4.2 without rules_cuda.

cuda_library(name, srcs = [*.cu, *.cpp], hdrs, deps, copts, cuda_archs) compiles each
source with nvcc (host compiler = the C++ toolchain's gcc/g++) into a PIC object and
wraps the objects in a cc_library that also depends on @cuda//:cudart, so cc_binary /
cc_test targets can depend on it like on any cc_library. A .cpp source is compiled as
CUDA (-x cu): the same file g++ builds for Thrust's CPU system runs on the GPU. On a machine
without the toolkit (tools/cuda_repo.bzl) both targets are incompatible: `bazel build //...`
skips them and everything that depends on them.

DDP_NVCC_COPTS: what ddp's device code needs from nvcc (constexpr host functions in
device code, Eigen kept host-only, optimised host code).
"""


load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@cuda//:defs.bzl", _CUDA_ONLY = "CUDA_ONLY", _NVCC = "NVCC")

DDP_NVCC_COPTS = [
    "-O3",
    "--expt-relaxed-constexpr",
    "-DEIGEN_NO_CUDA",
    "-Xcudafe",
    "--diag_suppress=20012",  # Eigen/Thrust: __host__ __device__ annotations on defaulted members
]

# GPU test binaries: the same with the host side at -O1. Their host code only drives and checks the device code,
# and g++ at -O3 on the host side was about half of each test unit's nvcc time.
DDP_NVCC_TEST_COPTS = ["-O1" if c == "-O3" else c for c in DDP_NVCC_COPTS]

NVCC = _NVCC

# target_compatible_with for a target that needs the toolkit without depending on @cuda (tools/cuda_repo.bzl).
CUDA_ONLY = _CUDA_ONLY

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cctx = cc_info.compilation_context

    args = [
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-Xcompiler",
        "-fPIC",
        # Intermediate files next to the object, not in /tmp: in Bazel's sandboxes every nvcc runs as pid 2,
        # so two at once named their /tmp/tmpxft_00000002_* files alike and one failed ("cudafe1.cpp: No such
        # file or directory").
        "--objdir-as-tempdir",
        "-I.",
        "-I" + ctx.bin_dir.path,
    ]
    for arch in ctx.attr.cuda_archs:
        args.append("-gencode=arch=compute_{a},code=[sm_{a},compute_{a}]".format(a = arch))

    # --cxxopt values (e.g. -std=c++20 from .bazelrc) also go to nvcc.
    args += ctx.fragments.cpp.cxxopts

    # The SIMD level (.bazelrc's --config=native|avx2|avx512|portable) goes to the host compiler as well: a binary
    # links nvcc's objects with g++'s (the main job's host job, doctest's main), and Eigen's inline functions
    # differ by level (aligned_malloc's alignment, the packet types), so mixed levels would break the One
    # Definition Rule where the linker keeps one copy of each.
    for c in ctx.fragments.cpp.copts:
        if c.startswith("-march="):
            args += ["-Xcompiler", c]
    for d in cctx.defines.to_list() + cctx.local_defines.to_list() + ctx.attr.defines:
        args.append("-D" + d)
    for i in cctx.includes.to_list() + cctx.quote_includes.to_list():
        args.append("-I" + i)
    for i in cctx.system_includes.to_list():
        args += ["-isystem", i]
    args += ctx.attr.copts

    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cctx.headers])
    outs = []
    for src in ctx.files.srcs:
        if src.basename.endswith(".cu"):
            stem, lang = src.basename[:-3], []
        elif src.basename.endswith(".cpp"):
            stem, lang = src.basename[:-4], ["-x", "cu"]
        else:
            continue
        out = ctx.actions.declare_file("_cuda_objs/{}/{}.pic.o".format(ctx.label.name, stem))
        ctx.actions.run(
            executable = NVCC,
            arguments = args + lang + ["-c", src.path, "-o", out.path],
            inputs = inputs,
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc {}".format(src.short_path),
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu", ".cpp"]),
        "hdrs": attr.label_list(allow_files = [".h", ".hpp", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
        "cuda_archs": attr.string_list(default = ["80", "90"]),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], defines = [], cuda_archs = None, **kwargs):
    objs_kwargs = {}
    if cuda_archs != None:
        objs_kwargs["cuda_archs"] = cuda_archs
    if "testonly" in kwargs:
        objs_kwargs["testonly"] = kwargs["testonly"]

    # Without the toolkit (tools/cuda_repo.bzl) both are incompatible, and so is everything that depends on them.
    kwargs["target_compatible_with"] = kwargs.get("target_compatible_with", []) + CUDA_ONLY
    cuda_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cuda_headers", "@cuda//:cccl"],
        copts = copts,
        defines = defines,
        target_compatible_with = kwargs["target_compatible_with"],
        **objs_kwargs
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objs"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        **kwargs
    )
