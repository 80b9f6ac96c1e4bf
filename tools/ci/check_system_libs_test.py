"""Tests of check_system_libs.py against a fake host: which package each file belongs to and
what the apt list's dependency closure holds are given, so each verdict can be checked."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_system_libs  # noqa: E402

PC = "/usr/lib/x86_64-linux-gnu/pkgconfig"
LIB = "/usr/lib/x86_64-linux-gnu"


class FakeSystem:
    def __init__(self, pc_files, owners, closure, libs, archive=None):
        self.pc_files = pc_files  # path -> text
        self.owner_of = owners  # path -> [package]
        self.closure = closure
        self.libs = libs  # -l names of `pkg-config --static --libs`
        self.archive = archive or {}  # module -> package (apt-file)
        self.asked_archive = []

    def pc_dirs(self):
        return [PC]

    def read(self, path):
        return self.pc_files[path]

    def static_libs(self, modules):
        return self.libs

    def apt_closure(self, packages):
        return self.closure

    def owners(self, paths):
        return {p: self.owner_of[p] for p in paths if p in self.owner_of}

    def library_dirs(self):
        return [LIB]

    def exists(self, path):
        return path in self.pc_files or path in self.owner_of

    def package_for_pc(self, module):
        self.asked_archive.append(module)
        return self.archive.get(module)


def grpc_host(closure):
    return FakeSystem(
        pc_files={
            f"{PC}/grpc++.pc": "Name: gRPC++\nRequires: grpc, absl_base = 20220623\nLibs: -lgrpc++\n",
            f"{PC}/grpc.pc": "Requires: absl_base\nRequires.private: zlib\n",
            f"{PC}/absl_base.pc": "Libs: -labsl_base\n",
            f"{PC}/zlib.pc": "Libs: -lz\n",
            f"{PC}/protobuf.pc": "Libs: -lprotobuf\n",
        },
        owners={
            f"{PC}/grpc++.pc": ["libgrpc++-dev"],
            f"{PC}/grpc.pc": ["libgrpc-dev"],
            f"{PC}/absl_base.pc": ["libabsl-dev"],
            f"{PC}/zlib.pc": ["zlib1g-dev"],
            f"{PC}/protobuf.pc": ["libprotobuf-dev"],
            f"{LIB}/libgrpc++.so": ["libgrpc++-dev"],
            f"{LIB}/libz.a": ["zlib1g-dev"],
            f"{LIB}/libprotobuf.so": ["libprotobuf-dev"],
        },
        closure=closure,
        libs=["grpc++", "z", "protobuf", "pthread"],
    )


class CheckTest(unittest.TestCase):
    def test_everything_in_the_closure_passes(self):
        host = grpc_host({"libgrpc++-dev", "libgrpc-dev", "libabsl-dev", "zlib1g-dev",
                          "libprotobuf-dev"})
        errors, summary = check_system_libs.check(["grpc++", "protobuf"], ["x"], host)
        self.assertEqual(errors, [])
        self.assertIn("5 pkg-config modules", summary)

    def test_installed_but_not_in_the_apt_list_names_module_and_package(self):
        host = grpc_host({"libgrpc++-dev", "libgrpc-dev", "libabsl-dev", "zlib1g-dev"})
        errors, _ = check_system_libs.check(["grpc++", "protobuf"], ["x"], host)
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("module 'protobuf'", errors[0])
        self.assertIn("'libprotobuf-dev'", errors[0])

    def test_a_required_module_is_followed(self):
        # zlib is only a Requires.private of grpc, two levels down from the WORKSPACE module.
        host = grpc_host({"libgrpc++-dev", "libgrpc-dev", "libabsl-dev", "libprotobuf-dev"})
        errors, _ = check_system_libs.check(["grpc++", "protobuf"], ["x"], host)
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("module 'zlib'", errors[0])
        self.assertIn("'zlib1g-dev'", errors[0])

    def test_a_module_not_installed_is_named_with_the_archive_package(self):
        host = grpc_host(set())
        del host.pc_files[f"{PC}/protobuf.pc"]
        del host.owner_of[f"{PC}/protobuf.pc"]
        host.archive = {"protobuf": "libprotobuf-dev"}
        host.closure = {"libgrpc++-dev", "libgrpc-dev", "libabsl-dev", "zlib1g-dev"}
        errors, _ = check_system_libs.check(["grpc++", "protobuf"], ["x"], host)
        self.assertEqual(host.asked_archive, ["protobuf"])
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("module 'protobuf' is not installed", errors[0])
        self.assertIn("'libprotobuf-dev'", errors[0])

    def test_a_file_of_no_package_is_reported(self):
        host = grpc_host({"libgrpc++-dev", "libgrpc-dev", "libabsl-dev", "zlib1g-dev",
                          "libprotobuf-dev"})
        del host.owner_of[f"{PC}/protobuf.pc"]
        host.pc_files[f"{PC}/protobuf.pc"] = "Libs: -lprotobuf\n"
        errors, _ = check_system_libs.check(["grpc++", "protobuf"], ["x"], host)
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("belongs to no Debian package", errors[0])


class ParseTest(unittest.TestCase):
    def test_workspace_modules(self):
        text = ('system_libs(\n    name = "system",\n    libs = {\n        "grpc++": "grpc++",\n'
                '        "absl_status": "absl_status absl_statusor",\n    },\n)\n')
        self.assertEqual(check_system_libs.workspace_modules(text),
                         ["grpc++", "absl_status", "absl_statusor"])

    def test_requires_with_versions_and_commas(self):
        self.assertEqual(check_system_libs.parse_requires(" grpc, absl_base = 20220623 zlib >= 1"),
                         ["grpc", "absl_base", "zlib"])

    def test_apt_closure_and_dpkg_output(self):
        self.assertEqual(check_system_libs.parse_apt_closure("libfoo-dev\n  Depends: libbar\n<virt>\n"),
                         {"libfoo-dev", "virt"})
        self.assertEqual(check_system_libs.parse_dpkg_search("libfoo-dev:amd64: /usr/x.pc\n"),
                         {"/usr/x.pc": ["libfoo-dev"]})

    def test_apt_list_skips_comments(self):
        self.assertEqual(check_system_libs.apt_list_packages("# c\nfoo\n\nbar # why\n"),
                         ["foo", "bar"])


if __name__ == "__main__":
    unittest.main()
