"""The device catalog: accelerators described by FLOP/s and memory only.

Built-in devices live in ``platforms/devices.yaml``; users add their own
(FPGA, ASIC, anything measured) in YAML files of the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hcsim.config import REPO_ROOT, Fields, load_yaml
from hcsim.errors import ConfigError

__all__ = ["Device", "load_catalog", "builtin_catalog", "peak_flops", "PRECISIONS"]

PRECISIONS = ("fp32", "fp16")
BUILTIN_CATALOG = REPO_ROOT / "platforms" / "devices.yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """An accelerator: FLOP/s at each precision, memory in bytes, memory bandwidth in B/s."""

    name: str
    fp32_flops: float
    fp16_flops: float
    memory: float
    memory_bandwidth: float

    def __post_init__(self) -> None:
        for field in ("fp32_flops", "fp16_flops", "memory", "memory_bandwidth"):
            if not getattr(self, field) > 0:
                raise ConfigError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)!r}")

    def flops(self, precision: str) -> float:
        """FLOP/s at `precision` ("fp32" or "fp16"; bf16 counts as fp16)."""
        return self.fp16_flops if precision in ("fp16", "bf16") else self.fp32_flops


def peak_flops(xpu: dict, precision: str) -> float:
    """Peak FLOP/s of an XPU node (platform graph attributes) at `precision` (bf16 counts as fp16)."""
    return float(xpu["fp16_flops"] if precision in ("fp16", "bf16") else xpu["fp32_flops"])


def load_catalog(path: str | Path) -> dict[str, Device]:
    """Read a device catalog YAML (``devices: {NAME: {fp32, fp16, memory, memory_bandwidth}}``)."""
    top = Fields(load_yaml(path), f"{path}: ")
    entries = top.raw("devices")
    catalog: dict[str, Device] = {}
    if not isinstance(entries, dict):
        top.problems.append(f"{path}: devices: expected a mapping of device name to figures")
        entries = {}
    for name, data in entries.items():
        fields = Fields(data, f"{path}: devices.{name}", top.problems)
        figures = dict(
            fp32_flops=fields.quantity("fp32", "flops"),
            fp16_flops=fields.quantity("fp16", "flops"),
            memory=fields.quantity("memory", "size"),
            memory_bandwidth=fields.quantity("memory_bandwidth", "bandwidth"),
        )
        fields.check_unknown()
        if None not in figures.values():
            catalog[str(name)] = Device(name=str(name), **figures)
    top.done()
    return catalog


def builtin_catalog() -> dict[str, Device]:
    """The catalog shipped in ``platforms/devices.yaml``."""
    return load_catalog(BUILTIN_CATALOG)
