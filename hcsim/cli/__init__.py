"""The `hcsim` command: one subcommand module per layer, each with ``register(subparsers)``.

Errors hcsim raises on purpose (HcsimError) are printed in one line and exit 2;
anything else is a bug and keeps its traceback. Output piped to a reader that
closes early (``| head``) ends the command quietly (exit 141, as SIGPIPE would).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from hcsim.allocator import restart_with_mimalloc
from hcsim.errors import HcsimError, shadowed_package

try:
    from hcsim import __version__
except ImportError as _error:  # a folder named hcsim shadows the package: say so, not "cannot import name"
    raise shadowed_package(_error) from _error

__all__ = ["main", "path_arg"]


def path_arg(text: str):
    """An output path option's value (--out, -o): an empty one is refused, not read as the current folder."""
    from pathlib import Path

    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder or file name (leave the option out for its "
                                         "default)")
    return Path(text)

SUBCOMMANDS = ("simulate", "platform", "workload", "sweep", "plan", "validate", "calibrate", "catalog")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcsim",
        description="Simulate distributed AI training on heterogeneous, cache-coherent computing systems (on SimGrid).",
    )
    parser.add_argument("--version", action="version", version=f"hcsim {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"hcsim.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"hcsim.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program (not a call from Python): on mimalloc, restarted once (hcsim.allocator)
        restart_with_mimalloc()
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.ERROR if args.quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 1
    try:
        code = args.run(args) or 0
        sys.stdout.flush()
        return code
    except HcsimError as err:
        print(f"hcsim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hcsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`hcsim ... | head`): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
