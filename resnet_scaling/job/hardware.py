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
    """Published figures of one accelerator, matched by a lowercase substring of `jax.Device.device_kind`.

    Attributes:
      generation: the chip generation a step-time calibration covers ("TPU v3", "H100"; step_model.py).
      hbm_bytes_per_sec_per_chip: HBM bandwidth, the memory side of a roofline.
      link_bytes_per_sec_per_chip: what one chip sends into an all-reduce inside its slice or node (TPU:
        the pod's published all-reduce bandwidth over its chips, or half the bidirectional ICI; GPU: one
        direction of NVLink).
      network_bytes_per_sec_per_chip: the same between slices or nodes (TPU: DCN; GPU: InfiniBand).
      bandwidth_source: where the three bandwidths come from ("assumed" where no published figure was found).
    """

    kind_substring: str
    peak_tflops_per_device: float
    hbm_bytes_per_chip: int
    source: str
    devices_per_chip: int = 1  # JAX devices on one chip: the TensorCores of TPU v2 and v3.
    generation: str = ""
    hbm_bytes_per_sec_per_chip: float = 0.0
    link_bytes_per_sec_per_chip: float = 0.0
    network_bytes_per_sec_per_chip: float = 0.0
    bandwidth_source: str = ""

    @property
    def peak_flops_per_chip(self) -> float:
        return self.peak_tflops_per_device * 1e12 * self.devices_per_chip


GB = 1e9
_NVIDIA = "NVIDIA data sheets (HBM, NVLink per GPU one way); InfiniBand per GPU as in NVIDIA's DGX nodes"
_V100 = dict(generation="V100", hbm_bytes_per_sec_per_chip=900 * GB, link_bytes_per_sec_per_chip=150 * GB,
             network_bytes_per_sec_per_chip=6.25 * GB,
             bandwidth_source=_NVIDIA + " (DGX-1: four 100 Gb/s EDR ports per 8 GPUs)")
_A100 = dict(generation="A100", link_bytes_per_sec_per_chip=300 * GB, network_bytes_per_sec_per_chip=25 * GB,
             bandwidth_source=_NVIDIA + " (DGX A100: one 200 Gb/s HDR port per GPU)")
_H100 = dict(generation="H100", hbm_bytes_per_sec_per_chip=3350 * GB, link_bytes_per_sec_per_chip=450 * GB,
             network_bytes_per_sec_per_chip=50 * GB,
             bandwidth_source=_NVIDIA + " (DGX H100: one 400 Gb/s NDR port per GPU)")
_TPU_DOCS = "Cloud TPU system-architecture pages (docs.cloud.google.com/tpu/docs/v4, v5e, v5p, v6e)"
_V5E = dict(generation="TPU v5e", hbm_bytes_per_sec_per_chip=819 * GB, link_bytes_per_sec_per_chip=200 * GB,
            network_bytes_per_sec_per_chip=3.125 * GB,
            bandwidth_source=_TPU_DOCS + ": 51.2 TB/s all-reduce / 256 chips, 2 x 100 Gbps per 8 chips")
_V5P = dict(generation="TPU v5p", hbm_bytes_per_sec_per_chip=2765 * GB, link_bytes_per_sec_per_chip=600 * GB,
            network_bytes_per_sec_per_chip=6.25 * GB,
            bandwidth_source=_TPU_DOCS + ": 1200 GBps bidirectional ICI, 50 Gbps DCN per chip")

# The first match wins: "v5 lite" before "v5", "h100 pcie" before "h100", 32 GB before 16 GB V100s.
DEVICE_SPECS: tuple[DeviceSpec, ...] = (
    DeviceSpec("v100-sxm2-32gb", 125.0, 32 * GIB, "NVIDIA V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core",
               **_V100),
    DeviceSpec("v100", 125.0, 16 * GIB, "NVIDIA V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core", **_V100),
    DeviceSpec("a100-sxm4-80gb", 312.0, 80 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense",
               hbm_bytes_per_sec_per_chip=2039 * GB, **_A100),
    DeviceSpec("a100 80gb", 312.0, 80 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense",
               hbm_bytes_per_sec_per_chip=2039 * GB, **_A100),
    DeviceSpec("a100", 312.0, 40 * GIB, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense",
               hbm_bytes_per_sec_per_chip=1555 * GB, **_A100),
    DeviceSpec("h100 pcie", 756.0, 80 * GIB, "NVIDIA H100 datasheet: PCIe 756 TFLOP/s bf16 dense",
               **{**_H100, "hbm_bytes_per_sec_per_chip": 2000 * GB, "link_bytes_per_sec_per_chip": 300 * GB}),
    DeviceSpec("h100", 989.0, 80 * GIB, "NVIDIA H100 datasheet: SXM 989 TFLOP/s bf16 dense", **_H100),
    DeviceSpec("h200", 989.0, 141 * 10**9, "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense, 141 GB",
               **{**_H100, "generation": "H200", "hbm_bytes_per_sec_per_chip": 4800 * GB}),
    DeviceSpec("tpu v2", 22.5, 16 * GIB, "Cloud TPU docs: v2 chip 45 TFLOP/s bf16, 2 cores, 16 GiB",
               devices_per_chip=2, generation="TPU v2", hbm_bytes_per_sec_per_chip=700 * GB,
               link_bytes_per_sec_per_chip=62 * GB, network_bytes_per_sec_per_chip=1.25 * GB,
               bandwidth_source="HBM: Jouppi et al., CACM 2020 (700 GB/s); ICI, DCN: assumed"),
    DeviceSpec("tpu v3", 61.5, 32 * GIB, "Cloud TPU docs: v3 chip 123 TFLOP/s bf16, 2 cores, 32 GiB",
               devices_per_chip=2, generation="TPU v3", hbm_bytes_per_sec_per_chip=900 * GB,
               link_bytes_per_sec_per_chip=82 * GB, network_bytes_per_sec_per_chip=1.25 * GB,
               bandwidth_source="HBM: Jouppi et al., CACM 2020 (900 GB/s); ICI, DCN: assumed"),
    DeviceSpec("tpu v4", 275.0, 32 * GIB, "Cloud TPU docs: v4 chip 275 TFLOP/s bf16, 32 GiB",
               generation="TPU v4",
               hbm_bytes_per_sec_per_chip=1200 * GB, link_bytes_per_sec_per_chip=275 * GB,
               network_bytes_per_sec_per_chip=3.125 * GB,
               bandwidth_source=_TPU_DOCS + ": 1.1 PB/s all-reduce over 4,096 chips; DCN assumed as v5e's"),
    DeviceSpec("tpu v5 lite", 197.0, 16 * GIB, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16, 16 GiB", **_V5E),
    DeviceSpec("tpu v5e", 197.0, 16 * GIB, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16, 16 GiB", **_V5E),
    DeviceSpec("tpu v5p", 459.0, 95 * GIB, "Cloud TPU docs: v5p chip 459 TFLOP/s bf16, 95 GiB", **_V5P),
    DeviceSpec("tpu v5", 459.0, 95 * GIB, "Cloud TPU docs: v5p chip (jax names it 'TPU v5'), 95 GiB", **_V5P),
    DeviceSpec("tpu v6 lite", 918.0, 32 * GIB, "Cloud TPU docs: v6e chip 918 TFLOP/s bf16, 32 GiB",
               generation="TPU v6e",
               hbm_bytes_per_sec_per_chip=1638 * GB, link_bytes_per_sec_per_chip=400 * GB,
               network_bytes_per_sec_per_chip=3.125 * GB,
               bandwidth_source=_TPU_DOCS + ": 102.4 TB/s all-reduce over 256 chips; DCN assumed as v5e's"),
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
