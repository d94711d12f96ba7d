"""The `hcsim` program runs on mimalloc (hcsim/allocator.py): preloaded when installed and wanted, restarted
once, and with the same results to the last bit as on glibc's allocator."""

import json
import os
import subprocess
import sys

import pytest

from hcsim import allocator


def test_mimalloc_is_installed_with_hcsim():
    library = allocator.mimalloc_library()
    assert library is not None and library.name == "libmimalloc.so.3"


def test_the_environment_preloads_it_once_and_keeps_other_preloads():
    env = allocator.environment({"PATH": "/bin", "LD_PRELOAD": "/opt/other.so"})
    assert env["LD_PRELOAD"].split() == [str(allocator.mimalloc_library()), "/opt/other.so"]
    assert allocator.environment(env) == env  # already there: unchanged
    assert allocator.in_use(env) and not allocator.in_use({"PATH": "/bin"})


def test_hcsim_allocator_system_keeps_glibcs():
    env = {"PATH": "/bin", "HCSIM_ALLOCATOR": "system"}
    assert allocator.environment(env) == env


def test_a_preloaded_process_maps_mimalloc():
    maps = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], capture_output=True,
                          text=True, check=True, env=allocator.environment()).stdout
    assert "libmimalloc.so" in maps


@pytest.mark.parametrize("env, restarts", [({}, True), ({"HCSIM_ALLOCATOR": "system"}, False), (None, False)])
def test_the_program_restarts_itself_once_with_the_same_arguments(monkeypatch, env, restarts):
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, environ: calls.append((path, argv, environ)))
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "-X", "utf8", "/venv/bin/hcsim", "simulate", "--set",
                                           "xpus=8"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("HCSIM_ALLOCATOR", raising=False)
    if env is None:  # the restarted process: mimalloc preloaded already
        monkeypatch.setenv("LD_PRELOAD", str(allocator.mimalloc_library()))
    else:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    allocator.restart_with_mimalloc()
    if not restarts:
        assert calls == []
        return
    [(path, argv, environ)] = calls
    assert path == sys.executable
    assert argv == [sys.executable, "-X", "utf8", "/venv/bin/hcsim", "simulate", "--set", "xpus=8"]  # options kept
    assert allocator.in_use(environ)


def _simulate(allocator_name: str, settings: list[str]) -> dict:
    env = {**os.environ, "HCSIM_ALLOCATOR": allocator_name}
    env.pop("LD_PRELOAD", None)
    command = [sys.executable, "-m", "hcsim.cli", "simulate", "--json", "--set", "iterations=2"]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: v for k, v in result.items() if k not in ("wall_time_s", "setup_time_s", "peak_rss_mb")}


@pytest.mark.parametrize("settings", [
    ["xpus=64"],  # the default: LLaMA2-13B data parallel on the coherent fabric, ring steps beside each other
    ["workload=llama3-8b", "platform=dgx-h100", "xpus=32", "tp=2", "pp=2", "collective_model=flow"],
])
def test_results_are_the_same_to_the_last_bit_on_either_allocator(settings):
    on_mimalloc, on_glibc = _simulate("mimalloc", settings), _simulate("system", settings)
    assert on_mimalloc["iteration_time_s"] > 0
    assert on_mimalloc == on_glibc
