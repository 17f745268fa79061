"""static_cc_library: a cc_library with sources that only executables link, compiled once.

`bazel build //...` (and so `bazel test //...`) builds every target's default outputs, and a cc_library's include
a PIC archive and a .so next to its static archive: each of its sources is compiled twice, with and without -fPIC.
For a library that every user links into an executable (doctest's mains, the main job's host job) the PIC copy is
never linked. linkstatic drops the .so, -supports_pic the PIC objects: one object per source.
"""

def static_cc_library(name, features = [], **kwargs):
    native.cc_library(
        name = name,
        features = features + ["-supports_pic"],
        linkstatic = True,
        **kwargs
    )
