"""The compile reports that ship with the package: one per shipped TPU config, compiled from the config as
it is now (`python -m resnet_scaling.compile --shipped` regenerates them), so that the planner with no
argument plans every shipped system in seconds, without compiling."""

import json
import pathlib
import re

import pytest

from resnet_scaling import config as config_lib
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.config import recipes
from resnet_scaling.planning import estimates, gpu_targets, shipped_reports

REPO = pathlib.Path(__file__).resolve().parents[2]
TPU_CONFIGS = shipped_reports.shipped_tpu_configs()
GPU_CONFIGS = shipped_reports.shipped_gpu_configs()


def test_the_shipped_tpu_configs_are_the_ones_with_a_topology_the_gpu_configs_name_a_card():
    assert {"pod", "tpu_v2_8", "tpu_v5e_2slices"} <= set(TPU_CONFIGS)
    assert not {"demo", "default", "gpu_h100x8"} & set(TPU_CONFIGS)
    assert set(GPU_CONFIGS) == {"gpu_v100", "gpu_v100x8", "gpu_a100x8", "gpu_h100x8", "gpu_h200x8"}
    assert shipped_reports.shipped_compiled_configs() == TPU_CONFIGS + GPU_CONFIGS


@pytest.mark.parametrize("name", TPU_CONFIGS + GPU_CONFIGS)
def test_each_shipped_config_has_a_report_compiled_from_it_as_it_is(name):
    config = config_lib.load_config(name)
    path = shipped_reports.report_path(name)
    assert path.is_file(), f"{path} is missing: python -m resnet_scaling.compile --shipped writes it."
    report = json.loads(path.read_text())
    assert shipped_reports.load_shipped_report(name, config_lib.config_hash(config)) is not None, (
        f"configs/{name}.py changed since its report was compiled: regenerate the reports with "
        "python -m resnet_scaling.compile --shipped.")
    topology = config.system.topology or gpu_targets.topology_name(config.mesh.num_devices)
    assert (report["system"], report["topology"], report["global_batch_size"]) == (
        config.system.name, topology, config.training.global_batch_size)
    # Every shipped step fits its chip or card.
    assert report["memory_bytes"]["total"] <= report["hbm_bytes_per_device"]
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
    assert shipped_reports.load_shipped_report("pod", config_lib.config_hash(changed)) is None


def test_a_gpu_row_takes_its_own_compiled_program_and_plans_no_batch_that_does_not_fit():
    config = recipes.resolve(config_lib.load_config("gpu_v100x8")).config
    report = shipped_reports.load_shipped_report("gpu_v100x8", config_lib.config_hash(config))
    reference_name = estimates.REFERENCE_CONFIG
    reference = shipped_reports.load_shipped_report(
        reference_name, config_lib.config_hash(config_lib.load_config(reference_name)))
    plan = plan_lib.derive(config, int(config.data.num_train_examples), int(config.mesh.num_devices))
    recipe = estimates.Recipe(float(config.training.num_epochs), float(config.eval.every_epochs), False)

    def system(gpu_report):
        return estimates.system_from_plan(config.system.name, config.system.device_kind, plan, recipe,
                                          reference, gpu_report)

    planned = system(report)
    assert planned.train.flops_per_chip == report["flops_per_device"]  # One GPU per chip.
    assert sum(c.bytes_per_chip for c in planned.train.collectives) == sum(
        row["num_bytes"] for row in report["collectives_by_group"])
    assert "compiled for 8 x Tesla V100-SXM2-16GB" in planned.train.source
    too_big = {**report, "memory_bytes": {**report["memory_bytes"], "total": 17 * 2**30}}
    refused = system(too_big)
    assert refused.train is None and "more than the card's 16 GiB" in refused.why_not


def test_the_planner_with_no_argument_plans_every_shipped_system_in_seconds(shipped_plan):
    result = shipped_plan
    assert result["returncode"] == 0, result["stderr"][-3000:]
    assert "Compiling" not in result["stderr"], result["stderr"]  # Nothing compiled: the reports served.
    # In seconds because nothing is compiled (under 30 s on a quiet 2-core VM, benchmarks/README.md; a bound
    # on the wall clock here would measure the machine's load instead).
    stdout = result["stdout"]
    table = stdout.split("\n\n")[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ") and "---" not in line and not line.startswith("| system |")}
    systems = {n: config_lib.load_config(n).system.name for n in config_lib.shipped_config_names()}
    planned = {n: s for n, s in systems.items() if s}
    assert set(planned.values()) == set(rows), sorted(set(planned.values()) ^ set(rows))
    # Every shipped system has a step, a time to target and a cost, each with its interval, and its notes
    # name the step's basis (calibrated, or uncalibrated where its generation has no published point).
    for system, line in rows.items():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        step, basis, time_to_target, cost = cells[3], cells[4], cells[8], cells[9]
        assert basis in ("calibrated", "uncalibrated"), line
        assert f"- {system}: {basis} step, " in stdout, system
        assert all(re.search(r"\(.+-.+\)", c) for c in (step, time_to_target, cost)), line
    written = {p["system"]: p for p in result["plan"]["predictions"]}
    for name in TPU_CONFIGS:  # libtpu's estimate (v2, v3, v5p) or the roofline (v4, v5e, v6e) is the base.
        assert written[planned[name]]["raw_step_sec"]["basis"] in ("compiled", "roofline"), name
    unplanned = sorted(n for n, s in systems.items() if not s)
    assert f"- {', '.join(unplanned)}: not planned; these configs name no system" in stdout
    # A table a person reads: no line of it wider than the widest row's own cells need (the 330).
    assert max(len(line) for line in table.splitlines()) < 200
