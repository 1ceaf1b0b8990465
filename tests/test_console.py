"""What a user sees: the demo's console (short, ending with the headline), the config file, the
TensorBoard tags, and progress for library users who configured no logging."""

import json
import os
import pathlib
import subprocess
import sys

from resnet_scaling import trainer
from tests.helpers import random_arrays, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def _cli_env():
    # A user's environment: no fake devices, the repository importable as an installed package is.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return {**env, "PYTHONPATH": str(REPO)}


def test_the_demo_command_prints_under_60_lines_and_ends_with_the_headline(tmp_path):
    """The README's demo command, run by its short name from another directory, as a user would."""
    workdir = tmp_path / "demo"
    command = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
               f"--config.data.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(command, cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) < 60, "\n".join(lines)
    messages = [line.split("] ", 1)[-1] for line in lines]
    headline_start = max(i for i, m in enumerate(messages) if m.startswith("Done: step 563 of 563"))
    headline = messages[headline_start:]
    assert headline[1].startswith("  top-1: final 9") and "images/sec in the steady state" in headline[2]
    assert headline[3].startswith("  time to 76.00% top-1: ") and "not reached" not in headline[3]
    assert headline[4].startswith("  goodput: ") and "over 1 launch(es); badput: " in headline[4]
    assert {m.split(":")[0].strip() for m in headline[5:]} == {
        "summary", "TensorBoard", "checkpoints", "best weights", "exported weights"}
    assert all(pathlib.Path(m.split(": ", 1)[1]).exists() for m in headline[5:])
    assert not any("checkpoint_manager" in line or "E0000" in line or "oneDNN" in line for line in lines)
    assert sum("what a step frees is kept for the next" in m for m in messages) == 1
    summary = json.loads((workdir / "summary.json").read_text())
    assert f"final {100 * summary['accuracy']['final_eval_top1']:.2f}%" in headline[1]
    assert json.loads((workdir / "config.json").read_text())["model"]["name"] == "resnet18"


def test_print_config_and_verbosity_bring_back_what_is_hidden(tmp_path):
    args = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={tmp_path / 'run'}",
            f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.num_train_examples=128",
            "--config.data.num_eval_examples=64", "--config.training.num_train_steps=2",
            "--config.eval.global_batch_size=64", "--config.training.tensorboard=false"]
    quiet = subprocess.run(args, cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=300)
    loud = subprocess.run([*args, "--print_config", "--verbosity=0", "--nokeep_freed_memory"], cwd=tmp_path,
                          env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and loud.returncode == 0, loud.stderr[-3000:]
    kept = "what a step frees is kept for the next"  # CPU runs by default (host_memory.py).
    assert kept in quiet.stdout + quiet.stderr and kept not in loud.stdout + loud.stderr
    assert "asynchronous CPU dispatch is on" not in quiet.stderr  # Set before JAX's backend started.
    assert "crop_area_range" not in quiet.stdout + quiet.stderr and "crop_area_range" in loud.stdout
    assert "checkpoint_manager.py" not in quiet.stderr and "checkpoint_manager.py" in loud.stderr


def test_tensorboard_groups_train_and_eval_tags_and_holds_the_config(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    config = tiny_config(training__tensorboard=True, eval__every_epochs=0.5)
    trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"),
                                                size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])  # clu writes scalars and text as tensor summaries.
    assert {"train/loss", "train/top1", "train/learning_rate", "train/images_per_sec", "eval/top1",
            "eval/loss", "config"} <= tags
    assert not {t for t in tags if t.endswith(("/step", "/eval_count", "/count"))}
    assert "resnet_tiny" in events.Tensors("config")[0].tensor_proto.string_val[0].decode()


def test_library_users_see_progress_without_configuring_logging(tmp_path):
    """A plain script that calls train_and_evaluate, as research code does: no logging set up."""
    script = (
        "from resnet_scaling import trainer\n"
        "from tests.helpers import random_arrays, tiny_config\n"
        f"trainer.train_and_evaluate(tiny_config(), {str(tmp_path)!r}, arrays=random_arrays())\n"
        "from resnet_scaling import console\n"
        "console.show_progress()  # Idempotent: no second handler.\n"
        "import logging\n"
        "assert len(logging.getLogger('resnet_scaling').handlers) <= 1\n"
    )
    env = {**_cli_env(), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 4/4" in proc.stderr and "Done: step 4 of 4" in proc.stderr
