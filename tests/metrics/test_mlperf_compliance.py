"""Which runs' MLPerf logs MLPerf's compliance checker (ruleset 4.0.0) accepts, as the README says: those of
the shipped configs whose recipe MLPerf's ResNet rules know (SGD or LARS with a polynomial decay to 1e-4),
and the README's command that shows it on a CPU (configs/demo_mlperf.py, then the checker), run as a user
runs them. The demo's own recipe (SGD, cosine to 0) is refused for the reasons the README quotes.

tests/metrics/test_mlperf_log.py checks the log's events against the checker in-process on short runs.
"""

import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

import pytest
from mlperf_logging.compliance_checker import mlp_compliance

from resnet_scaling import config as config_lib
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.metrics import mlperf_log
from resnet_scaling.training import sections
from tests.helpers import users_compile, without_suite_cache

REPO = pathlib.Path(__file__).resolve().parents[2]
# The README's commands, word for word (README_WORKDIR becomes the test's folder).
README_WORKDIR = "/tmp/demo_mlperf"
TRAIN_COMMAND = f"python -m resnet_scaling.train --config=demo_mlperf --workdir={README_WORKDIR}"
CHECK_COMMAND = (f"python -m mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 "
                 f"--log_output {README_WORKDIR}/compliance_checker.log {README_WORKDIR}/mlperf_log.txt")
# The shipped configs whose recipes the checker accepts; the others' logs it refuses, whatever they reach.
ACCEPTED = ("demo_mlperf", "pod", "tpu_v2_128", "tpu_v2_256", "tpu_v5e_2slices", "tpu_v5p_128")
# What it says of the demo's log (the README quotes the second).
DEMO_REFUSALS = ("CHECK for 'sgd_opt_end_learning_rate' failed",
                 "Required EXACTLY_ONE occurrence of 'sgd_opt_learning_rate_decay_poly_power' but found 0")


def _log_of_a_launch_at_the_target(config, workdir):
    """What `MLPerfLog` writes for one launch of `config` that reaches 80% top-1 at its last step, written
    without training (an epoch a step: the batch is the training set), with the config's recipe keys."""
    num_devices = config.mesh.num_devices if config.mesh.num_devices > 0 else 8
    plan = plan_lib.derive(config, config.training.global_batch_size, num_devices=num_devices)
    schedule = plan_lib.LoopSchedule(plan.total_steps, plan.log_every_steps)  # One evaluation, at the end.
    log = mlperf_log.MLPerfLog(str(workdir), sections.read(config).report.mlperf, plan, schedule, write=True)
    log.init_start("1xcpu", time.time())
    log.run_start()
    for step in range(1, plan.total_steps + 1):
        log.before_step(step)
        log.after_step(step)
    log.eval_start(plan.total_steps)
    log.eval_stop(plan.total_steps, 0.8)
    log.run_stop()
    return workdir / mlperf_log.MLPERF_LOG_FILENAME


@pytest.mark.parametrize("name", config_lib.shipped_config_names())
def test_mlperfs_checker_accepts_the_logs_of_the_shipped_configs_with_mlperfs_recipes_only(name, tmp_path):
    checker = mlp_compliance.make_checker("training", "4.0.0", quiet=False, werror=False)
    valid = checker.check_file(str(_log_of_a_launch_at_the_target(config_lib.load_config(name), tmp_path)),
                               "training_4.0.0/common.yaml")
    messages = [*checker.not_overwritable, *checker.overwritable.values()]
    if name in ACCEPTED:
        assert valid and messages == [], messages
        return
    # SGD with a cosine or piecewise decay: no polynomial decay's power (nor MLPerf's end learning rate).
    assert not valid and any(DEMO_REFUSALS[1] in m for m in messages), messages
    if name == "demo":
        assert all(any(refusal in m for m in messages) for refusal in DEMO_REFUSALS), messages


def _command(text, workdir):
    words = shlex.split(text.replace(README_WORKDIR, str(workdir)))
    assert words[0] == "python"
    return [sys.executable, *words[1:]]


def _cli_env():
    # A user's environment: no fake devices, the repository importable as an installed package is.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return {**env, "PYTHONPATH": str(REPO)}


def test_the_readme_gives_these_commands_word_for_word():
    readme = (REPO / "README.md").read_text()
    assert TRAIN_COMMAND in readme and CHECK_COMMAND in readme


@pytest.mark.slow
def test_the_readmes_mlperf_command_trains_to_the_target_and_mlperfs_checker_accepts_its_log(tmp_path,
                                                                                            demo_dataset):
    workdir = tmp_path / "demo_mlperf"
    # The README's command; the generated JPEGs are the session's (conftest), not the user's cache.
    train = [*_command(TRAIN_COMMAND, workdir), f"--config.data.cache_dir={demo_dataset['cache_dir']}"]
    # Compiled as a user's run is (the suite's fast compiles make it 4x slower), in its own workdir.
    env = without_suite_cache(users_compile(_cli_env()))
    proc = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One line says the run reached the target and stops (not one per target, 0.76 and MLPerf's 0.759).
    reached = [line for line in proc.stderr.splitlines() if " Reached " in line]
    assert len(reached) == 1 and reached[0].endswith("the run stops (MLPerf mode)."), reached
    # It stopped in MLPerf mode at the first evaluation at MLPerf's target, within the checker's [0.759, 1)
    # (after the second epoch on the CPUs measured; the epoch depends on the CPU, as the demo's does).
    section = json.loads((workdir / "summary.json").read_text())["mlperf"]
    assert (section["mode"], section["status"]) == ("mlperf", "success")
    assert section["epochs_to_target"] in (1.0, 2.0, 3.0, 4.0), section
    events = [json.loads(line.removeprefix(":::MLLOG "))
              for line in (workdir / "mlperf_log.txt").read_text().splitlines()]
    accuracies = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert len(accuracies) == section["epochs_to_target"], accuracies
    assert all(a < 0.759 for a in accuracies[:-1]) and 0.759 <= accuracies[-1] < 1.0, accuracies

    # The README's check: exit status 0, and its last line says so, with no warning before it.
    proc = subprocess.run(_command(CHECK_COMMAND, workdir), cwd=tmp_path, env=_cli_env(), capture_output=True,
                          text=True, timeout=120)
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 0 and lines[-1] == "INFO - SUCCESS", lines
    assert not any(line.startswith(("WARNING", "ERROR")) for line in lines), lines
    # It also appends its lines to a file: beside the log (the checker's default, ./compliance_checker.log,
    # would leave one in whatever folder the user ran it from).
    assert (workdir / "compliance_checker.log").read_text().splitlines()[-1] == "INFO - SUCCESS"
    assert not (tmp_path / "compliance_checker.log").exists()
