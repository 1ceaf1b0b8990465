"""Throughput flags per backend (`resnet_scaling.job.xla_flags`): merging, detection, and that XLA and libtpu
know every flag (an unknown one aborts a backend's start-up)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from resnet_scaling.job import xla_flags


def test_tpu_flags_go_to_libtpu_and_keep_the_users_choices():
    env = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=false --my_flag=1"}
    added = xla_flags.apply_throughput_flags("tpu", env)
    flags = env["LIBTPU_INIT_ARGS"].split()
    assert "--xla_tpu_enable_async_collective_fusion=false" in flags  # the user's value stays
    assert "--xla_tpu_enable_async_collective_fusion=true" not in flags
    assert "--my_flag=1" in flags
    assert set(xla_flags.TPU_FLAGS) - set(flags) == {"--xla_tpu_enable_async_collective_fusion=true"}
    assert added == {"LIBTPU_INIT_ARGS": " ".join(
        f for f in xla_flags.TPU_FLAGS if not f.startswith("--xla_tpu_enable_async_collective_fusion="))}
    assert "XLA_FLAGS" not in env


def test_gpu_flags_append_to_xla_flags_and_cpu_gets_none():
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/dump"}
    xla_flags.apply_throughput_flags("gpu", env)
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/dump", *xla_flags.GPU_FLAGS]
    assert xla_flags.apply_throughput_flags("gpu", env) == {}  # idempotent
    cpu_env = {}
    assert xla_flags.apply_throughput_flags("cpu", cpu_env) == {} and cpu_env == {}


@pytest.mark.parametrize("env, device_files, expected", [
    ({"JAX_PLATFORMS": "cpu"}, ["accel0"], "cpu"),
    ({"JAX_PLATFORMS": "cuda,cpu"}, [], "gpu"),
    ({}, ["accel0", "accel1"], "tpu"),
    ({}, ["vfio"], "tpu"),
    ({}, ["nvidia0", "nvidiactl"], "gpu"),
    ({}, ["null"], "cpu"),
])
def test_detect_backend(tmp_path, env, device_files, expected):
    for name in device_files:
        (tmp_path / name).touch()
    assert xla_flags.detect_backend(env, dev_dir=str(tmp_path)) == expected


def _starts(env_overrides: dict[str, str], code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", **env_overrides}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_xla_knows_every_gpu_flag():
    """XLA parses XLA_FLAGS on any backend; the CPU client refuses unknown names, so this checks names."""
    code = "import jax; print(jax.devices()[0].platform)"
    assert _starts({"XLA_FLAGS": " ".join(xla_flags.GPU_FLAGS)}, code).returncode == 0
    assert _starts({"XLA_FLAGS": "--xla_gpu_not_a_real_flag=1"}, code).returncode != 0  # the check works


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the tpu extra)")
def test_libtpu_knows_every_tpu_flag():
    code = ("from jax.experimental import topologies\n"
            "print(len(topologies.get_topology_desc(platform='tpu', topology_name='v2:2x2',"
            " chips_per_host_bounds=(2, 2, 1), num_slices=1).devices))")
    result = _starts({"LIBTPU_INIT_ARGS": " ".join(xla_flags.TPU_FLAGS)}, code)
    assert result.returncode == 0 and result.stdout.strip() == "8", result.stderr[-2000:]
    assert _starts({"LIBTPU_INIT_ARGS": "--xla_tpu_not_a_real_flag=1"}, code).returncode != 0
