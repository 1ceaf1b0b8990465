"""Ahead-of-time compilation for GPUs this machine does not have (`planning.gpu_targets`, `planning.aot`,
`python -m resnet_scaling.compile --config=gpu_v100x8`).

Needs JAX's CUDA plugin and ptxas (the `gpu_compile` and `test` extras), not a GPU. One real compile, shared
by the tests of its module fixture: 8x V100 in float16 (the case study's VM), the GPU path's own program
(float16 with loss scaling, float16 pooling; the bfloat16 step is the TPU configs' program, compiled in
tests/planning/test_compile.py, and a second card would compile the same code for another target for
another half-minute). The oracles are published figures and counts by hand, not the compiler's.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from resnet_scaling.job import errors, native_noise
from resnet_scaling.planning import gpu_targets
from tests.helpers import launch_xla_flags, users_compile

REPO = pathlib.Path(__file__).resolve().parents[2]
GIB = 2**30
# ResNet-50 v1.5: 25,557,032 parameters (torchvision's resnet50, as the model's tests count them), of which
# the batch norms' scales and offsets are 2 per channel: the stem's 64, and per bottleneck block c, c and 4c
# (plus 4c for the first block's projection) with c = 64, 128, 256, 512 over 3, 4, 6, 3 blocks.
NUM_PARAMS = 25_557_032
BN_CHANNELS = 64 + sum(blocks * (c + c + 4 * c) + 4 * c
                       for c, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)))
# ResNet-50 v1.5's forward pass: 4.1 GMAC per 224x224 image (NVIDIA DeepLearningExamples, "ResNet50 v1.5":
# v1.5 moves the stride to the 3x3 convolution, 4.1 instead of v1's 3.8 GMAC, He et al. 2016 Table 1). The
# backward pass is twice the forward's (the input's and the weights' gradients), at 2 FLOPs per MAC.
PUBLISHED_FLOPS_PER_IMAGE = 3 * 4.1e9 * 2
# NVIDIA's data sheet: V100 SXM2 16 GB.
V100_BYTES = 16 * GIB


def _compile(name: str, out: pathlib.Path) -> tuple[dict, subprocess.CompletedProcess]:
    """The compile command on config `name`, as a user runs it (XLA's default optimisations, no fake
    devices); its JSON report and the finished process."""
    env = users_compile({**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": launch_xla_flags()})
    env.pop("JAX_PLATFORMS", None)
    result = subprocess.run([sys.executable, "-m", "resnet_scaling.compile", f"--config={name}",
                             f"--json_out={out}"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text()), result


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(its report, the command's process) for 8x V100: one compile for the module."""
    if not native_noise.cuda_plugin_installed():
        pytest.skip("ahead-of-time GPU compilation needs JAX's CUDA plugin: pip install -e '.[gpu_compile]'")
    return _compile("gpu_v100x8", tmp_path_factory.mktemp("gpu_v100x8") / "report.json")


@pytest.mark.slow
def test_the_step_fits_its_card_and_the_command_says_so_quietly(compiled):
    report, result = compiled
    assert report["platform"] == "gpu" and report["num_devices"] == 8
    assert 0 < report["memory_bytes"]["total"] < V100_BYTES
    assert "| memory per device: total" in result.stdout and "DOES NOT FIT" not in result.stdout
    # What the compiler cannot see without the card is stated as the memory left for it.
    assert "| card's memory left for what is chosen only on the card" in result.stdout
    # No line from the CUDA plugin's libraries about the missing driver (job/native_noise.py).
    assert "cudart_stub" not in result.stderr and "absl::InitializeLog" not in result.stderr, result.stderr


@pytest.mark.slow
def test_only_gradients_and_bn_statistics_move_no_activation_is_gathered(compiled):
    """8x V100 in float16 all-gathered the max pool's input to the global batch (495 + 119 MiB a step)
    before models/ pooled float16 as strided maxima (bfloat16 never did)."""
    report, _ = compiled
    assert set(report["collectives"]) == {"all-reduce"}, report["collectives"]
    assert max(c["num_bytes"] for c in report["largest_collectives"]) < 64 * 2**20
    sixteen_bit = [row for row in report["collectives_by_group"] if row["dtype"] == "f16"]
    # Every convolution and the classifier reduce their gradients in the compute dtype, 2 bytes each; the
    # batch norms' scales and offsets (float32 parameters) theirs in float32.
    assert sum(row["num_elements"] for row in sixteen_bit) == NUM_PARAMS - 2 * BN_CHANNELS
    assert sum(row["num_bytes"] for row in sixteen_bit) == 2 * (NUM_PARAMS - 2 * BN_CHANNELS)
    assert all(row["group_size"] == 8 for row in report["collectives_by_group"])


@pytest.mark.slow
def test_flops_per_image_are_the_published_three_forward_passes(compiled):
    report, _ = compiled
    per_image = report["flops_per_step"] / report["global_batch_size"]
    assert report["flops_source"] == "convolutions and dots of the lowered module"
    # The stem's input gradient is not computed (0.24 GFLOP less); padding and rounding in the published
    # 4.1: within 3%.
    assert per_image == pytest.approx(PUBLISHED_FLOPS_PER_IMAGE, rel=0.03)
    assert 20e9 < per_image < 28e9


def test_every_shipped_gpu_config_names_a_card_with_a_description():
    from resnet_scaling import config as config_lib
    from resnet_scaling.planning import shipped_reports

    for name in shipped_reports.shipped_gpu_configs():
        kind = config_lib.load_config(name).system.device_kind
        assert f'device_description_str: "{kind}' in gpu_targets.target_config(kind), name


def test_an_unknown_card_is_one_line_naming_the_known_ones():
    with pytest.raises(gpu_targets.UnknownGpuError) as raised:
        gpu_targets.target_config("NVIDIA B200")
    message = str(raised.value)
    assert "\n" not in message and "'NVIDIA B200'" in message
    for card in ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-40GB",
                 "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200 141GB HBM3e"):
        assert card in message


def test_without_the_plugin_one_line_names_the_extra(monkeypatch):
    monkeypatch.setattr(native_noise, "cuda_plugin_installed", lambda: False)
    with pytest.raises(errors.MissingExtraError) as raised:
        gpu_targets.gpu_devices("Tesla V100-SXM2-16GB", 8)
    assert "\n" not in str(raised.value) and "pip install 'resnet_scaling[gpu_compile]'" in str(raised.value)


def test_each_description_keeps_its_source_and_the_cards_memory():
    """The shipped descriptions say where they come from, and describe the memory NVIDIA's data sheets
    give each card (a GB-sized card reports a little less than its nominal GiB: 16 GB is 15.8 GiB)."""
    nominal_gib = {"v100.txtpb": 16, "v100_32gb.txtpb": 32, "a100_sxm_40.txtpb": 40, "a100_sxm_80.txtpb": 80,
                   "h100_sxm.txtpb": 80, "h200.txtpb": 141}
    for filename, gib in nominal_gib.items():
        text = (gpu_targets.TARGETS_DIR / filename).read_text()
        assert "# Source: github.com/openxla/xla, xla/backends/gpu/target_config/specs/" in text
        assert "Apache License, Version 2.0" in text
        memory = int(next(line.split(":")[1] for line in text.splitlines()
                          if line.strip().startswith("device_memory_size:")))
        assert 0.9 * gib * GIB < memory <= gib * GIB * 1.0 + 1, filename


def test_topology_names_count_hosts_of_eight():
    assert [gpu_targets.topology_name(n) for n in (1, 8, 16)] == ["1x1x1", "1x1x8", "1x2x8"]
    with pytest.raises(errors.RunError):
        gpu_targets.topology_name(12)
