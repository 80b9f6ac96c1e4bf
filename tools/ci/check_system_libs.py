#!/usr/bin/env python3
"""Checks that every system library the build takes from pkg-config comes from a Debian
package that tools/ci/apt-packages.txt installs.

A machine that once had a package installed by hand builds fine even when the apt list
lacks it; a fresh machine then fails. So this check does not ask "is it installed?" but
"is the package that owns it in the dependency closure of the apt list?":

  1. the pkg-config modules named in WORKSPACE's system_libs(...) block, plus every module
     they require (Requires and Requires.private, recursively);
  2. the package owning each module's .pc file (dpkg -S), and the package owning each
     library they link (-lX of `pkg-config --static --libs`: libX.so or libX.a);
  3. each owner must be in `apt-cache depends --recurse` of the apt list's packages.

Exits 1 naming each module and the package the apt list misses; 0 with one summary line.
Run by tools/setup.sh after the apt step and before the build (so by .ci/run too).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

GLIBC_LIBS = {"c", "m", "dl", "rt", "pthread", "util", "resolv", "anl", "gcc_s", "stdc++"}


def run(cmd):
    """Runs cmd; returns (exit code, stdout)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc.returncode, proc.stdout


def workspace_modules(workspace_text):
    """The pkg-config modules of WORKSPACE's system_libs(libs = {...}) block."""
    block = re.search(r"system_libs\((.*?)\n\)", workspace_text, re.S)
    if not block:
        raise ValueError("WORKSPACE has no system_libs(...) block")
    modules = []
    for value in re.findall(r'"[^"]+"\s*:\s*"([^"]+)"', block.group(1)):
        modules.extend(value.split())
    return modules


def apt_list_packages(text):
    return [line.split("#")[0].strip() for line in text.splitlines()
            if line.split("#")[0].strip()]


def parse_requires(value):
    """Module names of a .pc file's Requires value ("grpc, absl_base = 20220623 zlib")."""
    names, tokens, skip = [], value.replace(",", " ").split(), False
    for token in tokens:
        if skip:
            skip = False
        elif token in ("=", "<", ">", "<=", ">=", "!="):
            skip = True
        else:
            names.append(token)
    return names


def pc_requires(pc_text):
    """Modules named by a .pc file's Requires and Requires.private lines."""
    names = []
    for line in pc_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Requires", "Requires.private"):
            names.extend(parse_requires(value))
    return names


def parse_apt_closure(text):
    """Package names of `apt-cache depends --recurse` output (unindented lines)."""
    names = set()
    for line in text.splitlines():
        if line and not line[0].isspace():
            names.add(line.strip().strip("<>").split(":")[0])
    return names


def parse_dpkg_search(text):
    """{path: package} from `dpkg -S path...` output ("libfoo-dev:amd64: /usr/lib/...")."""
    owners = {}
    for line in text.splitlines():
        if ": " not in line:
            continue
        packages, path = line.split(": ", 1)
        # "diversion by" lines and multi-owner lines ("a, b: path") both occur.
        if packages.startswith("diversion"):
            continue
        owners[path.strip()] = [p.strip().split(":")[0] for p in packages.split(",")]
    return owners


def link_names(libs_text):
    return [t[2:] for t in libs_text.split() if t.startswith("-l") and not t.startswith("-l:")]


class System:
    """The host queries, kept in one place so tests can replace them."""

    def pc_dirs(self):
        _, out = run(["pkg-config", "--variable", "pc_path", "pkg-config"])
        return [d for d in out.strip().split(":") if d]

    def read(self, path):
        with open(path) as f:
            return f.read()

    def static_libs(self, modules):
        """The -l names of `pkg-config --static --libs` over every module at once."""
        rc, out = run(["pkg-config", "--static", "--libs", *modules])
        return link_names(out) if rc == 0 else []

    def apt_closure(self, packages):
        _, out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                      "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                      *packages])
        return parse_apt_closure(out)

    def owners(self, paths):
        if not paths:
            return {}
        _, out = run(["dpkg", "-S", *paths])
        return parse_dpkg_search(out)

    def library_dirs(self):
        _, out = run(["gcc", "-print-search-dirs"])
        for line in out.splitlines():
            if line.startswith("libraries: ="):
                return [os.path.realpath(d) for d in line[len("libraries: ="):].split(":") if d]
        return ["/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu"]

    def exists(self, path):
        return os.path.exists(path)

    def package_for_pc(self, module):
        """The package providing MODULE.pc in the archive (apt-file), or None.

        Only asked for a module that is not installed, so the slow index download (~30 s)
        happens only when the check is about to fail anyway.
        """
        if not shutil.which("apt-file"):
            if os.geteuid() != 0:
                return None
            run(["apt-get", "install", "-y", "-qq", "apt-file"])
            run(["apt-file", "update"])
        if not shutil.which("apt-file"):
            return None
        rc, out = run(["apt-file", "search", "-x", f"/pkgconfig/{re.escape(module)}\\.pc$"])
        if rc != 0 or not out.strip():
            run(["apt-file", "update"])
            rc, out = run(["apt-file", "search", "-x", f"/pkgconfig/{re.escape(module)}\\.pc$"])
        packages = sorted({line.split(":")[0] for line in out.splitlines() if ":" in line})
        return packages[0] if packages else None


def check(modules, apt_packages, system):
    """Returns (errors, summary): errors name each module and what the apt list misses."""
    errors = []
    closure = system.apt_closure(apt_packages)
    if not closure:
        return ["apt-cache depends returned nothing for tools/ci/apt-packages.txt"], ""

    # Modules and everything they require, read from the .pc files themselves.
    pc_dirs = system.pc_dirs()
    seen, pending, missing_modules = {}, list(modules), []
    while pending:
        module = pending.pop()
        if module in seen or module in missing_modules:
            continue
        path = next((os.path.join(d, module + ".pc") for d in pc_dirs
                     if system.exists(os.path.join(d, module + ".pc"))), None)
        if path is None:
            missing_modules.append(module)
            continue
        seen[module] = path
        pending.extend(pc_requires(system.read(path)))
    for module in missing_modules:
        package = system.package_for_pc(module)
        if package:
            errors.append(f"pkg-config module '{module}' is not installed: it comes from package "
                          f"'{package}', which tools/ci/apt-packages.txt does not install: add "
                          f"'{package}' to it")
        else:
            errors.append(f"pkg-config module '{module}' is not installed, and no package providing "
                          f"{module}.pc was found (apt-file search {module}.pc): add that package "
                          "to tools/ci/apt-packages.txt")

    # The files the build reads: each module's .pc, and every library the modules link.
    files = {path: f"pkg-config module '{module}'" for module, path in seen.items()}
    lib_dirs = system.library_dirs()
    if not missing_modules:
        for lib in sorted(set(system.static_libs(modules)) - GLIBC_LIBS):
            for directory in lib_dirs:
                for name in (f"lib{lib}.so", f"lib{lib}.a"):
                    path = os.path.join(directory, name)
                    if system.exists(path) and path not in files:
                        files[path] = f"library -l{lib}"
    owners = system.owners(sorted(files))

    reported = set()
    # The .pc files first: a module is the clearest name for what is missing.
    for path, what in sorted(files.items(), key=lambda kv: (not kv[0].endswith(".pc"), kv[1])):
        packages = owners.get(path)
        if packages is None:
            # Several library dirs are searched; only the .pc file must have an owner.
            if path.endswith(".pc"):
                errors.append(f"{what}: {path} belongs to no Debian package (installed by hand?)")
            continue
        if not any(p in closure for p in packages):
            key = packages[0]
            if key in reported:
                continue
            reported.add(key)
            errors.append(f"{what} comes from package '{packages[0]}' "
                          f"({path}), which tools/ci/apt-packages.txt does not install: add "
                          f"'{packages[0]}' to it")
    summary = (f"{len(seen)} pkg-config modules ({len(modules)} named in WORKSPACE), {len(files)} "
               f"files, all from packages in the closure of tools/ci/apt-packages.txt "
               f"({len(closure)} packages)")
    return errors, summary


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=os.path.join(root, "WORKSPACE"))
    parser.add_argument("--apt-list", default=os.path.join(root, "tools/ci/apt-packages.txt"))
    args = parser.parse_args()
    with open(args.workspace) as f:
        modules = workspace_modules(f.read())
    with open(args.apt_list) as f:
        packages = apt_list_packages(f.read())
    errors, summary = check(modules, packages, System())
    for error in errors:
        print(f"check_system_libs: {error}", file=sys.stderr)
    if errors:
        print(f"check_system_libs: {len(errors)} problem(s); the build would fail on a fresh "
              "machine", file=sys.stderr)
        return 1
    print(f"check_system_libs: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
