#!/usr/bin/env python3
"""Prints, one a line, the installed Debian packages a bare GPU machine is
taken not to have, for tests/gpu/test_bare_build.sh to hide: the
development packages tools/install-deps.sh installs (its `packages=(...)`
names ending in -dev, and pkg-config) with everything they depend on,
less what a bare machine is taken to have: the Essential and required
packages, build-essential, cmake and python3, with all they depend on.

Derived from install-deps.sh, not from the kit's own list (gpu_deps.sh),
so that a dependency added there and forgotten in the kit is hidden, and
the bare build fails.

  bare_packages.py INSTALL_DEPS_SH"""
import re
import subprocess
import sys

BARE_MACHINE = ["build-essential", "cmake", "python3"]


def install_deps_packages(path):
    with open(path) as f:
        m = re.search(r"^packages=\((.*?)^\)", f.read(), re.S | re.M)
    if not m:
        sys.exit(f"bare_packages: no packages=( ... ) list in {path}")
    return [w for line in m.group(1).splitlines() for w in line.split("#")[0].split()]


def name_of(alternative):
    """The package of `name:arch (>= version)`."""
    return alternative.split("(")[0].strip().split(":")[0]


def installed():
    """name -> (essential or required, [[alternatives] of each dependency]),
    and virtual name -> the installed packages that provide it."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}\t${Package}\t"
                          "${Essential}\t${Priority}\t${Provides}\t${Pre-Depends}, ${Depends}\n"],
                         check=True, capture_output=True, text=True).stdout
    pkgs, provides = {}, {}
    for line in out.splitlines():
        status, name, essential, priority, prov, deps = line.split("\t")
        if not status.startswith("ii"):
            continue
        groups = [[name_of(a) for a in g.split("|")] for g in deps.split(",") if g.strip()]
        pkgs[name] = (essential == "yes" or priority == "required", groups)
        for p in prov.split(","):
            if p.strip():
                provides.setdefault(name_of(p), []).append(name)
    return pkgs, provides


def closure(start, pkgs, provides):
    """start (installed packages only) and every installed package it
    depends on (all installed alternatives of an `a | b` dependency)."""
    seen, todo = set(), list(start)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for group in pkgs[p][1]:
            for alt in group:
                todo += [q for q in [alt] + provides.get(alt, []) if q in pkgs]
    return seen


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: bare_packages.py INSTALL_DEPS_SH")
    pkgs, provides = installed()
    dev = [p for p in install_deps_packages(argv[1]) if p.endswith("-dev") or p == "pkg-config"]
    absent = [p for p in dev if p not in pkgs]
    if absent:
        sys.exit(f"bare_packages: not installed: {' '.join(absent)} (run tools/install-deps.sh)")
    # What a bare machine has that dpkg did not install here has nothing to take away.
    bare_start = ([p for p, (base, _) in pkgs.items() if base]
                  + [p for p in BARE_MACHINE if p in pkgs])
    bare = closure(bare_start, pkgs, provides)
    print("\n".join(sorted(closure(dev, pkgs, provides) - bare)))


if __name__ == "__main__":
    main(sys.argv)
