"""The compile reports that ship with the package: one per shipped TPU config, compiled from the config as
it is now (`python -m resnet_scaling.compile --shipped` regenerates them), so that the planner with no
argument plans every shipped system in seconds, without compiling."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from resnet_scaling import config as config_lib
from resnet_scaling.planning import shipped_reports

REPO = pathlib.Path(__file__).resolve().parents[2]
TPU_CONFIGS = shipped_reports.shipped_tpu_configs()


def test_the_shipped_tpu_configs_are_the_ones_with_a_topology():
    assert {"pod", "tpu_v2_8", "tpu_v5e_2slices"} <= set(TPU_CONFIGS)
    assert not {"demo", "default", "gpu_h100x8"} & set(TPU_CONFIGS)


@pytest.mark.parametrize("name", TPU_CONFIGS)
def test_each_shipped_tpu_config_has_a_report_compiled_from_it_as_it_is(name):
    config = config_lib.load_config(name)
    path = shipped_reports.report_path(name)
    assert path.is_file(), f"{path} is missing: python -m resnet_scaling.compile --shipped writes it."
    report = json.loads(path.read_text())
    assert shipped_reports.load_shipped_report(name, config) is not None, (
        f"configs/{name}.py changed since its report was compiled: regenerate the reports with "
        "python -m resnet_scaling.compile --shipped.")
    assert (report["system"], report["topology"], report["global_batch_size"]) == (
        config.system.name, config.system.topology, config.training.global_batch_size)
    assert report["estimated_step_sec"] is None or report["estimated_step_sec"] != 0
    # Every shipped TPU config trains ResNet-50 on ImageNet at 224 pixels: torchvision's published figures
    # for it are 25,557,032 parameters and 4.09 GFLOPS (multiply-adds) per image forward; a training step
    # is about 3 forward passes (the backward pass computes two products per forward one), 2 FLOPs each.
    assert (config.model.name, config.model.num_classes, config.data.image_size) == ("resnet50", 1000, 224)
    assert report["num_params"] == 25_557_032
    per_image_ratio = report["flops_per_step"] / report["global_batch_size"] / (3 * 2 * 4.09e9)
    assert 0.95 < per_image_ratio < 1.05, per_image_ratio


def test_the_hash_follows_the_settings_not_the_order_they_were_set_in():
    first, second = config_lib.get_base_config(), config_lib.get_base_config()
    first.seed, first.training.global_batch_size = 1, 2048
    second.training.global_batch_size, second.seed = 2048, 1
    assert config_lib.config_hash(first) == config_lib.config_hash(second)
    second.model.bn_group_size = 128
    assert config_lib.config_hash(first) != config_lib.config_hash(second)
    # A changed config's report is not used: the planner compiles it instead.
    changed = config_lib.load_config("pod")
    with changed.unlocked():
        changed.training.global_batch_size = 16_384
    assert shipped_reports.load_shipped_report("pod", changed) is None


def test_the_planner_with_no_argument_plans_every_shipped_system_in_seconds(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    result = subprocess.run([sys.executable, "-m", "resnet_scaling.planner"], cwd=tmp_path,
                            env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # In seconds because nothing is compiled: the shipped reports served (under 30 s on a quiet 2-core VM,
    # benchmarks/README.md; a bound on the wall clock here would measure the machine's load instead).
    assert "Compiling" not in result.stderr, result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("| ") and "---" not in line and not line.startswith("| system |")}
    systems = {n: config_lib.load_config(n).system.name for n in config_lib.shipped_config_names()}
    planned = {n: s for n, s in systems.items() if s}
    assert set(planned.values()) <= set(rows), sorted(set(planned.values()) - set(rows))
    # Every shipped system has a step, a time to target and a cost, each with its interval, and its notes
    # name the step's basis (calibrated, or uncalibrated where its generation has no published point).
    for system, line in rows.items():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        step, basis, time_to_target, cost = cells[3], cells[4], cells[9], cells[11]
        assert basis in ("calibrated", "uncalibrated"), line
        assert f"- {system}: {basis} step, " in result.stdout, system
        assert all(re.search(r"\(.+-.+\)", c) for c in (step, time_to_target, cost)), line
    for name in TPU_CONFIGS:  # libtpu's estimate (v2, v3, v5p) or the roofline (v4, v5e, v6e) is the base.
        cells = [c.strip() for c in rows[planned[name]].strip().strip("|").split("|")]
        assert cells[5].endswith(("(compiled)", "(roofline)")), cells
    unplanned = sorted(n for n, s in systems.items() if not s)
    assert f"- {', '.join(unplanned)}: not planned; these configs name no system" in result.stdout
