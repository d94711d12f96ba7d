"""Runs on mimalloc: the `hcsim` program starts itself again with mimalloc preloaded.

SimGrid allocates and frees a few small objects per activity (the activity, its action, its solver variable,
heap nodes, the route's link list, callbacks), and glibc's allocator spends a fifth to two fifths of a large
run in ``malloc`` and ``free`` once the heap holds millions of them. mimalloc (the ``cmeel-mimalloc`` wheel,
a declared dependency) halves that: LLaMA2-13B data parallel on 4,096 XPUs 22.8 s -> 14.0 s, Llama-3 405B on
16,384 H100 45 s -> 33 s (docs/performance.md). Only the allocator changes, never an address-dependent
order: results are the same to the last bit (the suite and the committed experiments were run both ways).

A shared library's ``malloc`` is bound when the program starts, so mimalloc has to be preloaded
(``LD_PRELOAD``): :func:`restart_with_mimalloc` replaces the process with the same command line and mimalloc
in its environment, once, before anything ran; processes it spawns (sweeps' points, plan's simulations)
inherit the environment. ``HCSIM_ALLOCATOR=system`` keeps glibc's allocator.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

__all__ = ["mimalloc_library", "environment", "restart_with_mimalloc", "in_use"]

_SONAME = "libmimalloc.so.3"


def mimalloc_library() -> Path | None:
    """The installed libmimalloc (the cmeel-mimalloc wheel's, in site-packages' cmeel.prefix), if any."""
    if not sys.platform.startswith("linux"):
        return None
    for key in ("platlib", "purelib"):
        path = Path(sysconfig.get_paths()[key]) / "cmeel.prefix" / "lib" / _SONAME
        if path.is_file():
            return path
    return None


def in_use(env=None) -> bool:
    """True when `env` (default: this process's environment) preloads mimalloc."""
    return _SONAME in (env if env is not None else os.environ).get("LD_PRELOAD", "")


def environment(env=None) -> dict[str, str]:
    """`env` (default: this process's environment) with mimalloc preloaded, unless HCSIM_ALLOCATOR=system or
    mimalloc is not installed (then `env` as it is)."""
    env = dict(os.environ if env is None else env)
    library = mimalloc_library()
    if env.get("HCSIM_ALLOCATOR", "mimalloc") == "system" or library is None or in_use(env):
        return env
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    return env


def restart_with_mimalloc() -> None:
    """Replace this process by the same command line (the interpreter's options included: sys.orig_argv) with
    mimalloc preloaded, unless it is preloaded already, not wanted or not installed (then return)."""
    env = environment()
    if not in_use(env) or in_use():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
