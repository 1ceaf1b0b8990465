"""What the library knows about accelerators: one table of peak FLOP/s and HBM per device kind.

For MFU (metrics.utilisation) and AOT reports' memory (aot.py). Peaks: dense, in the chip's fastest 16-bit
format (bfloat16; float16 on V100), as MaxText reports MFU. TPU v2/v3 chips are 2 JAX devices (TensorCores):
peaks per core, `hbm_bytes_per_device` halves the HBM; from v4 on, a device is a chip. Sources: Cloud TPU
system-architecture pages, NVIDIA data sheets.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Sequence
from typing import Any

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """Published figures of one accelerator, matched by a lowercase substring of `jax.Device.device_kind`."""

    kind_substring: str
    peak_tflops_per_device: float
    hbm_bytes_per_chip: int
    source: str
    devices_per_chip: int = 1  # JAX devices on one chip: the TensorCores of TPU v2 and v3.


# The first match wins: "v5 lite" before "v5", "h100 pcie" before "h100", 32 GB before 16 GB V100s.
DEVICE_SPECS: tuple[DeviceSpec, ...] = (
    DeviceSpec("v100-sxm2-32gb", 125.0, 32 * GIB, "NVIDIA V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core"),
    DeviceSpec("v100", 125.0, 16 * GIB, "NVIDIA V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core"),
    DeviceSpec("a100-sxm4-80gb", 312.0, 80 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
    DeviceSpec("a100 80gb", 312.0, 80 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
    DeviceSpec("a100", 312.0, 40 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
    DeviceSpec("h100 pcie", 756.0, 80 * GIB, "NVIDIA H100 datasheet: PCIe 756 TFLOP/s bf16 dense"),
    DeviceSpec("h100", 989.0, 80 * GIB, "NVIDIA H100 datasheet: SXM 989 TFLOP/s bf16 dense"),
    DeviceSpec("h200", 989.0, 141 * 10**9, "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense, 141 GB"),
    DeviceSpec("tpu v2", 22.5, 16 * GIB, "Cloud TPU docs: v2 chip 45 TFLOP/s bf16, 2 cores, 16 GiB",
               devices_per_chip=2),
    DeviceSpec("tpu v3", 61.5, 32 * GIB, "Cloud TPU docs: v3 chip 123 TFLOP/s bf16, 2 cores, 32 GiB",
               devices_per_chip=2),
    DeviceSpec("tpu v4", 275.0, 32 * GIB, "Cloud TPU docs: v4 chip 275 TFLOP/s bf16, 32 GiB"),
    DeviceSpec("tpu v5 lite", 197.0, 16 * GIB, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16, 16 GiB"),
    DeviceSpec("tpu v5e", 197.0, 16 * GIB, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16, 16 GiB"),
    DeviceSpec("tpu v5p", 459.0, 95 * GIB, "Cloud TPU docs: v5p chip 459 TFLOP/s bf16, 95 GiB"),
    DeviceSpec("tpu v5", 459.0, 95 * GIB, "Cloud TPU docs: v5p chip (jax names it 'TPU v5'), 95 GiB"),
    DeviceSpec("tpu v6 lite", 918.0, 32 * GIB, "Cloud TPU docs: v6e chip 918 TFLOP/s bf16, 32 GiB"),
)


def device_spec(device_kind: str) -> DeviceSpec | None:
    """The table's row for a `jax.Device.device_kind`, or None (CPUs, kinds not in the table)."""
    kind = device_kind.lower()
    return next((spec for spec in DEVICE_SPECS if spec.kind_substring in kind), None)


def peak_tflops_per_device(device_kind: str, measured: float | None = None) -> float | None:
    """The dense 16-bit peak TFLOP/s of one JAX device of `device_kind`, or `measured` if given.

    None for CPUs and unknown kinds (no published peak; pass a measured figure to get an MFU).
    """
    if measured is not None:
        return float(measured)
    spec = device_spec(device_kind)
    return None if spec is None else spec.peak_tflops_per_device


def devices_per_chip(device_kind: str) -> int:
    """JAX devices on one chip of `device_kind` (2 for TPU v2 and v3; 1 for other and unknown kinds)."""
    spec = device_spec(device_kind)
    return 1 if spec is None else spec.devices_per_chip


def chip_count(devices: Sequence[Any]) -> int:
    """The chips that hold `devices`: TPU devices sharing `coords` (and slice) are cores of one chip."""
    return len({(getattr(d, "slice_index", 0), tuple(getattr(d, "coords", (d.id,)))) for d in devices})


def hbm_bytes_per_device(devices: Sequence[Any], device_kind: str = "") -> int | None:
    """HBM one device of `devices` can use, or None for a device kind not in the table.

    Args:
      device_kind: overrides the devices' own kind (config.system.device_kind), when set.
    """
    spec = device_spec(device_kind or devices[0].device_kind)
    if spec is None:
        return None
    return spec.hbm_bytes_per_chip * chip_count(devices) // len(devices)


def host_cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """The host CPU's model name as `lscpu` prints it ("AMD EPYC 7B13"), which benchmarks record (one 2-core
    VM can run twice as fast as another); from `cpuinfo`, else `platform.processor()` or the machine."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model name") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
