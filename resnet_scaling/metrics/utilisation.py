"""Utilisation: FLOPs per step from XLA's cost analysis, achieved TFLOP/s per device, and MFU.

MFU (model FLOPs utilisation) is achieved FLOP/s over the device's dense peak in its fastest
16-bit format (bfloat16, or float16 on V100), as MaxText reports it; a float32 run is measured against
that same peak. The FLOPs are XLA's count of the compiled step (forward, backward and optimizer), not an
analytic model count, so rematerialisation would count too.
"""

from __future__ import annotations

from typing import Any

# (substring of jax.Device.device_kind, lowercase; dense peak TFLOP/s per JAX device; source).
# Order matters: the first match wins ("v5 lite" before "v5", "h100 pcie" before "h100").
# TPU v2 and v3 expose each TensorCore as a JAX device, so their rows are per core (chip = 2 cores);
# from v4 on, one JAX device is one chip (megacore).
PEAK_TFLOPS_PER_DEVICE: tuple[tuple[str, float, str], ...] = (
    ("v100", 125.0, "NVIDIA V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor core"),
    ("a100", 312.0, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
    ("h100 pcie", 756.0, "NVIDIA H100 datasheet: PCIe 756 TFLOP/s bf16 dense"),
    ("h100", 989.0, "NVIDIA H100 datasheet: SXM 989 TFLOP/s bf16 dense"),
    ("h200", 989.0, "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense (same core as H100 SXM)"),
    ("tpu v2", 22.5, "Cloud TPU docs: v2 chip 45 TFLOP/s bf16, 2 cores"),
    ("tpu v3", 61.5, "Cloud TPU docs: v3 chip 123 TFLOP/s bf16, 2 cores"),
    ("tpu v4", 275.0, "Cloud TPU docs: v4 chip 275 TFLOP/s bf16"),
    ("tpu v5 lite", 197.0, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16"),
    ("tpu v5e", 197.0, "Cloud TPU docs: v5e chip 197 TFLOP/s bf16"),
    ("tpu v5p", 459.0, "Cloud TPU docs: v5p chip 459 TFLOP/s bf16"),
    ("tpu v5", 459.0, "Cloud TPU docs: v5p chip 459 TFLOP/s bf16 (jax names v5p 'TPU v5')"),
)


def peak_tflops_per_device(device_kind: str, measured: float | None = None) -> float | None:
    """The dense 16-bit peak TFLOP/s of one JAX device of `device_kind`, or `measured` if given.

    CPUs and unknown devices return None (no published peak; pass a measured figure to get an MFU).
    """
    if measured is not None:
        return float(measured)
    kind = device_kind.lower()
    for substring, tflops, _ in PEAK_TFLOPS_PER_DEVICE:
        if substring in kind:
            return tflops
    return None


def flops_per_device(compiled: Any) -> float | None:
    """FLOPs of one step of a compiled (per-device, SPMD-partitioned) program, or None if unknown.

    `cost_analysis()` returns a dict, a list of dicts (one per program) or None, depending on the jax
    version and backend; some backends raise.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements cost analysis.
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = cost.get("flops") if isinstance(cost, dict) else None
    return float(flops) if flops is not None and flops > 0 else None


def utilisation(flops_per_step_per_device: float | None, sec_per_step: float | None, num_devices: int,
                device_kind: str, measured_peak_tflops: float | None = None) -> dict[str, float | None]:
    """FLOPs per step, achieved TFLOP/s per device and MFU (None where an input is unknown).

    Args:
      flops_per_step_per_device: from `flops_per_device(compiled)`.
      sec_per_step: steady-state seconds per training step.
      num_devices: devices running the step (the step's FLOPs are per-device FLOPs x devices).
      device_kind: `jax.Device.device_kind`, for the peak table.
      measured_peak_tflops: a measured peak per device (CPUs), overriding the table.
    """
    peak = peak_tflops_per_device(device_kind, measured_peak_tflops)
    achieved = None
    if flops_per_step_per_device and sec_per_step:
        achieved = flops_per_step_per_device / sec_per_step / 1e12
    return {
        "flops_per_step": flops_per_step_per_device * num_devices if flops_per_step_per_device else None,
        "flops_per_step_per_device": flops_per_step_per_device,
        "tflops_per_sec_per_device": achieved,
        "peak_tflops_per_device": peak,
        "mfu": achieved / peak if achieved is not None and peak else None,
    }
