"""cuda_library: compile .cu files with the system nvcc and wrap them in a cc_library.

    load("//tools/bazel:cuda.bzl", "cuda_library")
    cuda_library(
        name = "kernels",
        srcs = ["vec_add.cu"],
        hdrs = ["vec_add.h"],          # plain C++ API header, usable from .cc code
        deps = ["//some:cc_lib"],      # headers/defines of CcInfo deps reach nvcc
    )

* Each .cu is compiled by its own action (`nvcc -c -Xcompiler -fPIC`), host
  compiler = the C++ toolchain's gcc (-ccbin), so object files are ABI
  compatible with the rest of the build. Whole-program mode (no -rdc), so no
  device-link step is needed.
* GPU code: --//tools/bazel:cuda_archs=sm_90,compute_75 (default) -> SASS for sm_90 +
  PTX for compute_75 that the driver JIT-compiles for any newer GPU. `archs = ["sm_90a"]` on
  one cuda_library replaces that list for its own .cu files (sm_XYa: the architecture-specific
  features, such as Hopper's wgmma; the code runs only on that exact compute capability).
* When CUDA is disabled (--config=cpu, or nvcc not found at configure time)
  the targets are marked incompatible and `bazel build //...` / `bazel test
  //...` silently skip them (and everything depending on them).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH", "NVCC")

_ArchsInfo = provider(fields = ["archs"])

def _string_list_flag_impl(ctx):
    return _ArchsInfo(archs = ctx.build_setting_value)

string_list_flag = rule(
    implementation = _string_list_flag_impl,
    build_setting = config.string_list(flag = True),
)

def _gencode_flags(archs):
    flags = []
    for a in archs:
        a = a.strip()
        if a.startswith("sm_"):
            flags.append("-gencode=arch=compute_%s,code=sm_%s" % (a[3:], a[3:]))
        elif a.startswith("compute_"):
            flags.append("-gencode=arch=%s,code=%s" % (a, a))
        elif a:
            fail("bad CUDA arch %r (want sm_XY or compute_XY)" % a)
    return flags

def _cuda_objects_impl(ctx):
    if not CUDA_FOUND:
        fail("CUDA was requested (--//tools/bazel:enable_cuda=true / --config=cuda) but nvcc " +
             "was not found under %s. Install the toolkit, set CUDA_PATH, or build with --config=cpu." % CUDA_PATH)
    cc_toolchain = find_cpp_toolchain(ctx)
    merged = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cctx = merged.compilation_context

    mode = ctx.var.get("COMPILATION_MODE", "fastbuild")
    mode_flags = {"opt": ["-O3", "-DNDEBUG"], "dbg": ["-g", "-O0"], "fastbuild": ["-O2"]}[mode]

    objs = []
    for src in ctx.files.srcs:
        stem = src.basename.rsplit(".", 1)[0]
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(["-x", "cu", "-std=" + ctx.attr.std, "-c", src.path, "-o", obj.path])
        args.add_all(["-Xcompiler", "-fPIC"])
        args.add_all(mode_flags)
        archs = ctx.attr.archs if ctx.attr.archs else ctx.attr._archs[_ArchsInfo].archs
        args.add_all(_gencode_flags(archs))
        args.add_all(["-I.", "-I" + ctx.bin_dir.path])
        args.add_all(cctx.includes, before_each = "-I")
        args.add_all(cctx.quote_includes, before_each = "-I")
        args.add_all(cctx.system_includes, before_each = "-isystem")
        args.add_all(cctx.defines, format_each = "-D%s")
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cctx.headers, cc_toolchain.all_files]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".hpp", ".cuh", ".inc"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "std": attr.string(default = "c++17"),
        "archs": attr.string_list(),
        "_archs": attr.label(default = "//tools/bazel:cuda_archs"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_compatible():
    """target_compatible_with value: incompatible unless CUDA is enabled."""
    return select({
        "//tools/bazel:cuda_enabled": [],
        "//conditions:default": ["//tools/bazel:cuda_disabled"],
    })

def if_cuda(if_true, if_false = []):
    return select({
        "//tools/bazel:cuda_enabled": if_true,
        "//conditions:default": if_false,
    })

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], std = "c++17", cudart = "@local_cuda//:cudart", visibility = None, archs = [], **kwargs):
    cuda_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"],
        copts = copts,
        std = std,
        archs = archs,
        target_compatible_with = cuda_compatible(),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + [cudart],
        # Never build a lib<name>.so for the nvcc objects: with dynamic test linking
        # (cc_test default) the .so would carry undefined cuda* symbols that gold
        # will not resolve from libcudart_static.a -> "symbol lookup error".
        linkstatic = True,
        target_compatible_with = cuda_compatible(),
        visibility = visibility,
        **kwargs
    )
