"""Ahead-of-time compilation for a TPU topology (`resnet_scaling.aot`, `python -m resnet_scaling.compile`).

Needs libtpu (the `tpu` and `test` extras), not a TPU: 'v2:2x2' describes 4 TPU v2 chips = 8 devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

# Compiling needs no TPU: let this process and the command's subprocess both load libtpu.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
pytest.importorskip("libtpu", reason="ahead-of-time TPU compilation needs libtpu: pip install -e '.[tpu]'")

from resnet_scaling import aot, hardware  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

TOPOLOGY = "v2:2x2"
NUM_SCALAR_METRICS = 3  # loss, top-1 and top-5 are means over the global batch


@pytest.fixture(scope="module")
def devices():
    return aot.topology_devices(TOPOLOGY)


def _config(**overrides):
    config = tiny_config(data__source="synthetic", data__num_train_examples=64, **overrides)
    config.system.device_kind = "TPU v2"
    return config


def test_topology_has_the_devices_of_4_v2_chips(devices):
    assert len(devices) == 8
    assert {d.device_kind for d in devices} == {"TPU v2"}
    assert {d.platform for d in devices} == {"tpu"}


def test_per_device_batch_norm_step_communicates_only_gradients_and_bn_statistics(devices):
    """With per-device BN groups the step's only communication is one all-reduce of every gradient, the
    running BN statistics and the scalar metrics: nothing else crosses devices."""
    report = aot.build_report(_config(model__bn_group_size=0), devices, TOPOLOGY)
    assert report.num_devices == 8 and report.per_device_batch_size == 2 and report.bn_group_size == 2
    # One all-reduce: no BN reduction sits in the forward or backward pass, so XLA combines everything.
    assert report.collectives == {"all-reduce": {"count": 1, **{
        k: report.collectives["all-reduce"][k] for k in ("num_elements", "num_bytes")}}}
    assert report.largest_collectives[0]["group_size"] == 8
    all_reduced = report.collectives["all-reduce"]["num_elements"]
    expected = report.num_params + report.num_batch_stats + NUM_SCALAR_METRICS
    # XLA reduces identical gradients once: the biases of the two BNs that feed one residual sum (the
    # downsample branch's and the block's last) get the same gradient, 16 + 32 + 64 channels here.
    assert expected - (16 + 32 + 64) <= all_reduced <= expected
    assert report.memory_bytes["argument"] > 0 and report.memory_bytes["temp"] > 0
    # The state is donated: the new state is written into the old one's buffers.
    assert report.memory_bytes["alias"] > 0
    assert report.hbm_bytes_per_device == 8 * 2**30
    assert report.flops_per_device > 0
    assert report.flops_per_step == pytest.approx(8 * report.flops_per_device)


def test_global_batch_norm_adds_the_backward_statistics(devices):
    """Whole-batch BN also all-reduces each layer's backward sums (which double as the BN parameters'
    gradients), so between params + stats and params + 2 x stats values move."""
    report = aot.build_report(_config(), devices, TOPOLOGY)
    assert report.bn_group_size is None
    assert set(report.collectives) == {"all-reduce"}
    all_reduced = report.collectives["all-reduce"]["num_elements"]
    lower = report.num_params + report.num_batch_stats
    assert lower <= all_reduced <= lower + report.num_batch_stats + NUM_SCALAR_METRICS
    assert all(c["group_size"] == 8 for c in report.largest_collectives)


def test_compile_command_prints_the_report_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    config_file = tmp_path / "tiny.py"
    config_file.write_text(
        "from tests.helpers import tiny_config\n"
        "def get_config():\n"
        "    config = tiny_config(data__source='synthetic', data__num_train_examples=64)\n"
        f"    config.system.topology = {TOPOLOGY!r}\n"
        "    return config\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": repo}
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, "-m", "resnet_scaling.compile", f"--config={config_file}", f"--json_out={out}",
         "--config.model.bn_group_size=0"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| all-reduce |" in result.stdout and "8 x TPU v2" in result.stdout
    report = json.loads(out.read_text())
    assert report["topology"] == TOPOLOGY and report["num_devices"] == 8
    assert report["memory_bytes"]["total"] > 0 and report["flops_per_device"] > 0


def _system_configs():
    import importlib.util
    import pathlib

    for path in sorted((pathlib.Path(__file__).resolve().parents[1] / "configs").glob("[!_]*.py")):
        spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config()
        if config.system.topology:
            yield pytest.param(config, id=path.stem)


@pytest.mark.parametrize("config", list(_system_configs()))
def test_config_topologies_are_valid_and_match_the_mesh(config):
    """Every TPU config's topology is one libtpu knows, with the config's device kind and mesh size."""
    devices = aot.topology_devices(config.system.topology, config.system.chips_per_host_bounds,
                                   config.system.num_slices)
    assert devices[0].device_kind == config.system.device_kind
    if config.mesh.num_devices > 0:
        assert len(devices) == config.mesh.num_devices


def test_hbm_per_device_splits_a_chip_between_its_cores(devices):
    assert hardware.hbm_bytes_per_device(devices) == 8 * 2**30  # a v2 chip's 16 GiB over its 2 cores
    one_per_chip = [types.SimpleNamespace(device_kind="TPU v5", coords=(i, 0, 0), id=i) for i in range(4)]
    assert hardware.hbm_bytes_per_device(one_per_chip) == 95 * 2**30
    assert hardware.hbm_bytes_per_device(devices, "some future chip") is None
