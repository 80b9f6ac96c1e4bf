"""runtime_test: a cc_test of tests/runtime, run against the real daemons and the CLI.

Each test starts the coordinator and workers (and `deepinfer`) from its runfiles on loopback and
talks to them through tests/testing; the fixture model it serves is named per test.
"""

# The binaries every runtime test starts.
RUNTIME_BINARIES = [
    "//coordinator:deepinfer-coordinator",
    "//coordinator/cli:deepinfer",
    "//worker:deepinfer-worker",
]

_RUNTIME_DEPS = [
    "//tests/testing:batch_jobs",
    "//tests/testing:subprocess",
    "@system//:absl_strings",
    "@system//:gmock_main",
    "@system//:nlohmann_json",
]

def runtime_test(name, size, fixtures = ["//tests/fixtures:dsv3_qlora_rope"], data = [], deps = []):
    """A cc_test from `name`.cc with the runtime binaries, `fixtures` and the test libraries.

    Args:
      name: the test, and its source without ".cc".
      size: the test size.
      fixtures: the fixture models it serves.
      data: further runfiles.
      deps: further libraries.
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = [name + ".cc"],
        data = RUNTIME_BINARIES + fixtures + data,
        deps = _RUNTIME_DEPS + deps,
    )
