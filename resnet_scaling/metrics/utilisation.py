"""Utilisation: achieved TFLOP/s per device and MFU, from a step's FLOPs and its measured time.

MFU (as MaxText reports it): achieved FLOP/s over the device's dense peak in its fastest 16-bit format
(bfloat16, or float16 on V100; hardware.py's table), float32 runs too. FLOPs are XLA's count of the
compiled step (forward, backward, optimizer), not an analytic model count: rematerialisation counts too.
"""

from __future__ import annotations

from resnet_scaling.job.hardware import peak_tflops_per_device


def utilisation(flops_per_step_per_device: float | None, sec_per_step: float | None, num_devices: int,
                device_kind: str, measured_peak_tflops: float | None = None) -> dict[str, float | None]:
    """FLOPs per step, achieved TFLOP/s per device and MFU (None where an input is unknown).

    Args:
      flops_per_step_per_device: from `analysis.compiled.flops_per_device(compiled_step)`.
      sec_per_step: steady-state seconds per training step.
      num_devices: devices running the step.
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
