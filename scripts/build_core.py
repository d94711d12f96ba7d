#!/usr/bin/env python3
"""Build hcsim's C++ engine core, hcsim/engine/core/_core*.so, against the installed SimGrid 4.1, and the two
extensions without SimGrid: the route search, hcsim/platform/_routes*.so, and the vertex numbering,
hcsim/workload/_order*.so.

    .venv/bin/python scripts/build_core.py   # build, or say it is up to date; what `make` runs

The core is the engine: a build that fails says which step failed, why and what to install, and exits 1,
so `make demo` and `make test` (and CI) stop there instead of running without it.

Where SimGrid comes from: `pip install simgrid==4.1` (scripts/setup.sh) installs libsimgrid.so.4.1 in
site-packages but no C++ header. The headers come from the same release's source distribution
(`pip download simgrid==4.1 --no-binary :all: --no-deps`, served from pip's cache after the first time):
its include/ is copied to build/simgrid-4.1/include, with the two headers SimGrid's CMake would generate
(simgrid/config.h: no public header reads its feature flags; simgrid/version.h: 4.1.0, which the
extension checks against the library at import). The extension links libsimgrid.so.4.1 where it is
installed, with an RPATH to that folder, and hcsim also preloads the library before importing the
extension (hcsim/engine/simgrid_loader.py): nobody sets LD_LIBRARY_PATH.

The compiler is $CXX (default g++), C++17, pybind11 < 3 (the one SimGrid's Python module was built
with, constraints.txt); at most --jobs (default 2) translation units at once. A build is skipped when
build/core/inputs.sha256 matches the sources, flags, compiler, pybind11, Python and libsimgrid.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "hcsim" / "engine" / "core"
# extensions of their own (no SimGrid): the route search, the vertex numbering; each named by its source's stem
STANDALONE = [ROOT / "hcsim" / "platform" / "routes.cpp", ROOT / "hcsim" / "workload" / "order.cpp"]
BUILD = ROOT / "build" / "core"
SIMGRID_VERSION = (4, 1, 0)
HEADERS = ROOT / "build" / f"simgrid-{SIMGRID_VERSION[0]}.{SIMGRID_VERSION[1]}" / "include"
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DNDEBUG", "-Wall"]

CONFIG_H = """/* simgrid/config.h, written by hcsim's scripts/build_core.py in place of the one SimGrid's CMake
   generates: the installed package ships no header. No public SimGrid 4.1 header reads these flags. */
#ifndef SIMGRID_PUBLIC_CONFIG_H
#define SIMGRID_PUBLIC_CONFIG_H
#include <xbt/base.h>
#define SIMGRID_HAVE_MALLOCATOR 1
#define SIMGRID_HAVE_MC 0
#define SIMGRID_HAVE_NS3 0
#define SIMGRID_HAVE_EIGEN3 0
#define SIMGRID_HAVE_JSON 0
#endif
"""


class BuildError(Exception):
    """A step of the build failed; the message says which and why."""


def log(message: str) -> None:
    print(f"build_core: {message}", flush=True)


def extension_path() -> Path:
    return CORE / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"


def standalone_path(source: Path) -> Path:
    """Where the extension built from `source` (no SimGrid) goes: beside it, named _<its stem>."""
    return source.parent / f"_{source.stem}{sysconfig.get_config_var('EXT_SUFFIX')}"


def built_paths() -> list[Path]:
    return [extension_path(), *map(standalone_path, STANDALONE)]


def simgrid_library() -> Path:
    sys.path.insert(0, str(ROOT))
    from hcsim.engine.simgrid_loader import library_path

    library = library_path()
    if library is None:
        raise BuildError("libsimgrid.so.4.1 is not installed in this environment; run `make setup` first")
    return library


def fetch_headers() -> None:
    """SimGrid's include/ from its source distribution, plus the two headers CMake generates."""
    if (HEADERS / "simgrid" / "s4u.hpp").exists() and (HEADERS / "simgrid" / "config.h").exists():
        return
    version = ".".join(map(str, SIMGRID_VERSION[:2]))
    log(f"fetching SimGrid {version}'s C++ headers (pip download simgrid=={version} --no-binary :all:)")
    env = dict(os.environ)
    constraints = ROOT / "constraints.txt"
    env.setdefault("PIP_CONSTRAINT", str(constraints))  # its metadata step builds with pybind11 < 3 as well
    env.setdefault("PIP_BUILD_CONSTRAINT", str(constraints))
    with tempfile.TemporaryDirectory(prefix="hcsim-simgrid-") as folder:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"simgrid=={version}", "--no-binary",
                               ":all:", "--no-deps", "-d", folder], capture_output=True, text=True, env=env)
        archives = sorted(Path(folder).glob("simgrid-*.tar.gz"))
        if done.returncode or not archives:
            raise BuildError(f"pip download simgrid=={version} failed: "
                             f"{(done.stderr.strip().splitlines() or ['no archive'])[-1]}")
        prefix = f"simgrid-{version}/include/"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            if not members:
                raise BuildError(f"{archives[0].name} has no {prefix}")
            try:
                archive.extractall(folder, members, filter="data")
            except TypeError:  # Python before 3.11.4: no extraction filters (the members are checked above)
                archive.extractall(folder, members)
        staged = Path(folder) / prefix
        (staged / "simgrid" / "config.h").write_text(CONFIG_H)
        template = (staged / "simgrid" / "version.h.in").read_text()
        for key, value in {"@GIT_VERSION@": "unknown", "@SIMGRID_VERSION_MAJOR@": str(SIMGRID_VERSION[0]),
                           "@SIMGRID_VERSION_MINOR@": str(SIMGRID_VERSION[1]),
                           "@SIMGRID_VERSION_PATCH@": str(SIMGRID_VERSION[2]), "@CMAKE_INSTALL_PREFIX@": "",
                           "@SIMGRID_VERSION_STRING@": f"SimGrid version {version}"}.items():
            template = template.replace(key, value)
        (staged / "simgrid" / "version.h").write_text(template)
        if HEADERS.exists():
            shutil.rmtree(HEADERS)
        HEADERS.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), HEADERS)


def compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX", "g++")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise BuildError(f"no C++ compiler {cxx!r} ({err}); install g++ (apt-get install g++) or set CXX") from err
    return cxx, version.splitlines()[0] if version else cxx


def pybind11_module():
    try:
        import pybind11
    except ImportError as err:
        raise BuildError(f"pybind11 is not installed ({err}); run `make setup` (it installs pybind11<3)") from err
    return pybind11


def inputs_digest(cxx_version: str, library: Path) -> str:
    pybind11 = pybind11_module()
    digest = hashlib.sha256()
    for path in sorted([*CORE.glob("*.cpp"), *CORE.glob("*.hpp"), *STANDALONE]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    stat = library.stat()
    for part in (*FLAGS, cxx_version, pybind11.__version__, sysconfig.get_config_var("EXT_SUFFIX"),
                 str(library), str(stat.st_size), str(stat.st_mtime_ns), str(HEADERS)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def compile_and_link(cxx: str, library: Path, jobs: int) -> None:
    pybind11 = pybind11_module()
    includes = [f"-I{HEADERS}", f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    objects = BUILD / "obj"
    objects.mkdir(parents=True, exist_ok=True)
    sources = [*sorted(CORE.glob("*.cpp")), *STANDALONE]
    commands = [[cxx, *FLAGS, *includes, "-c", str(source), "-o", str(objects / f"{source.stem}.o")]
                for source in sources]
    log(f"compiling {len(sources)} translation units with {cxx}, {jobs} at a time")
    running: list[tuple[subprocess.Popen, Path]] = []
    failures: list[str] = []
    for command, source in zip(commands, sources):
        while len(running) >= jobs:
            failures += _reap(running.pop(0))
        running.append((subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                        source))
    for job in running:
        failures += _reap(job)
    if failures:
        raise BuildError("compilation failed:\n" + "\n".join(failures))
    core = [str(objects / f"{s.stem}.o") for s in sources if s not in STANDALONE]
    _link(cxx, extension_path(), [*core, f"-L{library.parent}", f"-l:{library.name}", f"-Wl,-rpath,{library.parent}"])
    for source in STANDALONE:
        _link(cxx, standalone_path(source), [str(objects / f"{source.stem}.o")])


def _link(cxx: str, output: Path, inputs: list[str]) -> None:
    partial = output.with_suffix(".partial")
    done = subprocess.run([cxx, "-shared", *inputs, "-o", str(partial)], capture_output=True, text=True)
    if done.returncode:
        raise BuildError(f"linking {output.name} failed:\n{done.stdout}{done.stderr}")
    os.replace(partial, output)


def _reap(job: tuple[subprocess.Popen, Path]) -> list[str]:
    process, source = job
    out, _ = process.communicate()
    return [f"{source.relative_to(ROOT)}:\n{out[-4000:]}"] if process.returncode else []


def check_import() -> None:
    """Import the new extension in a fresh interpreter (no SimGrid Engine is created)."""
    done = subprocess.run([sys.executable, "-c", "import hcsim.engine.core as c; c.load(); "
                           "import hcsim.platform._routes, hcsim.workload._order"], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise BuildError(f"the built extension does not import: {done.stderr.strip()[-2000:]}")


def build(force: bool, jobs: int) -> bool:
    """Build unless up to date; True when it built."""
    library = simgrid_library()
    cxx, cxx_version = compiler()
    fetch_headers()
    digest = inputs_digest(cxx_version, library)
    stamp = BUILD / "inputs.sha256"
    if not force and all(path.exists() for path in built_paths()) and stamp.exists() \
            and stamp.read_text().strip() == digest:
        log(f"up to date: {extension_path().relative_to(ROOT)}")
        return False
    stamp.unlink(missing_ok=True)
    compile_and_link(cxx, library, jobs)
    check_import()
    stamp.write_text(digest + "\n")
    log(f"built {extension_path().relative_to(ROOT)}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="translation units compiled at once (default: 2 at most)")
    args = parser.parse_args()
    try:
        build(args.force, max(1, args.jobs))
    except BuildError as err:
        for path in built_paths():
            path.unlink(missing_ok=True)
        log(f"failed: {err}\nbuild_core: the C++ engine core is hcsim's engine and must be built. It needs what "
            "SimGrid's build needs: g++ (C++17), the Python headers (python3-dev) and SimGrid 4.1 installed by "
            "`make setup`; install what is missing (as root: apt-get install -y g++ python3-dev), then: make core")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
