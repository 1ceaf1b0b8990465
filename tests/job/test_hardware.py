"""The one table of accelerator figures (`job/hardware.py`): peaks for MFU, HBM for AOT reports."""

import types

import pytest

from resnet_scaling import metrics
from resnet_scaling.job import hardware

GIB = 2**30


@pytest.mark.parametrize("device_kind, peak, hbm_per_chip", [
    ("Tesla V100-SXM2-16GB", 125.0, 16 * GIB), ("Tesla V100-SXM2-32GB", 125.0, 32 * GIB),
    ("NVIDIA A100-SXM4-40GB", 312.0, 40 * GIB), ("NVIDIA A100-SXM4-80GB", 312.0, 80 * GIB),
    ("NVIDIA H100 80GB HBM3", 989.0, 80 * GIB), ("NVIDIA H100 PCIe", 756.0, 80 * GIB),
    ("NVIDIA H200", 989.0, 141 * 10**9), ("TPU v2", 22.5, 16 * GIB), ("TPU v3", 61.5, 32 * GIB),
    ("TPU v4", 275.0, 32 * GIB), ("TPU v5 lite", 197.0, 16 * GIB), ("TPU v5", 459.0, 95 * GIB),
    ("TPU v5p", 459.0, 95 * GIB), ("TPU v6 lite", 918.0, 32 * GIB)])
def test_one_row_gives_both_the_peak_and_the_hbm(device_kind, peak, hbm_per_chip):
    spec = hardware.device_spec(device_kind)
    assert (spec.peak_tflops_per_device, spec.hbm_bytes_per_chip) == (peak, hbm_per_chip)
    assert metrics.peak_tflops_per_device(device_kind) == peak  # What MFU divides by.
    one_device_per_chip = [types.SimpleNamespace(device_kind=device_kind, id=0)]
    assert hardware.hbm_bytes_per_device(one_device_per_chip) == hbm_per_chip  # What AOT compares with.


def test_unknown_devices_have_no_figures():
    assert hardware.device_spec("cpu") is None
    assert hardware.peak_tflops_per_device("cpu") is None
    assert hardware.peak_tflops_per_device("cpu", measured=0.5) == 0.5
    assert hardware.hbm_bytes_per_device([types.SimpleNamespace(device_kind="cpu", id=0)]) is None


def test_the_host_cpu_model_is_the_cpuinfo_model_name(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 7B13\n")
    assert hardware.host_cpu_model(cpuinfo) == "AMD EPYC 7B13"
    # No cpuinfo (macOS, or a model-less one): still a non-empty name, from the platform module.
    assert hardware.host_cpu_model(tmp_path / "missing") != ""


@pytest.mark.parametrize("device_kind, devices_per_chip", [
    ("TPU v2", 2), ("TPU v3", 2), ("TPU v4", 1), ("TPU v5 lite", 1), ("TPU v5", 1),
    ("Tesla V100-SXM2-16GB", 1), ("NVIDIA H200", 1), ("cpu", 1)])
def test_tpu_v2_and_v3_chips_hold_two_jax_devices_and_the_others_one(device_kind, devices_per_chip):
    # Oracle: the Cloud TPU architecture pages (v2 and v3 chips have 2 TensorCores, each a JAX device;
    # from v4 on one device is one chip) and NVIDIA's (one device per GPU).
    assert hardware.devices_per_chip(device_kind) == devices_per_chip
