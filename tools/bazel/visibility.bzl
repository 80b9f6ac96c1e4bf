"""Who may depend on what (docs/architecture.md, Layout).

common/ and tokenizer/ are public: both daemons, the tools and the tests link them. The
coordinator's and the worker's own libraries are visible to their own tree, the tests and
the tools that are clients of that side; a target the other side needs names that package
in its own `visibility`, so each crossing of the seam is written down at the target.
"""

# Coordinator libraries: the coordinator tree, the tests, and the admin tool (a client of
# the coordinator's admin service that also plans placements offline).
COORDINATOR_INTERNAL = [
    "//coordinator:__subpackages__",
    "//tests:__subpackages__",
    "//tools/admin:__pkg__",
]

# Worker libraries: the worker tree, the kernels' tests (the CPU backend is their host
# reference), the tests, and the tools that run the model in-process (bench, demo model,
# checkpoint and GPU tools).
WORKER_INTERNAL = [
    "//worker:__subpackages__",
    "//kernels:__subpackages__",
    "//tests:__subpackages__",
    "//tools:__subpackages__",
]
