"""Minimal nvcc support for Bazel 4.2 without rules_cuda.

cuda_library(name, srcs = [*.cu], hdrs, deps, copts, cuda_archs) compiles each .cu
with nvcc (host compiler = the C++ toolchain's gcc/g++) into a PIC object and wraps
the objects in a cc_library that also depends on @cuda//:cudart, so cc_binary /
cc_test targets can depend on it like on any cc_library.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

NVCC = "/usr/local/cuda/bin/nvcc"

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cctx = cc_info.compilation_context

    args = [
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-Xcompiler",
        "-fPIC",
        "-I.",
        "-I" + ctx.bin_dir.path,
    ]
    for arch in ctx.attr.cuda_archs:
        args.append("-gencode=arch=compute_{a},code=[sm_{a},compute_{a}]".format(a = arch))

    # --cxxopt values (e.g. -std=c++20 from .bazelrc) also go to nvcc.
    args += ctx.fragments.cpp.cxxopts
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
        if not src.basename.endswith(".cu"):
            continue
        out = ctx.actions.declare_file("_cuda_objs/{}/{}.pic.o".format(ctx.label.name, src.basename[:-3]))
        ctx.actions.run(
            executable = NVCC,
            arguments = args + ["-c", src.path, "-o", out.path],
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
        "srcs": attr.label_list(allow_files = [".cu"]),
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
    cuda_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cuda_headers", "@cuda//:cccl"],
        copts = copts,
        defines = defines,
        **objs_kwargs
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objs"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        **kwargs
    )
