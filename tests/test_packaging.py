"""The installed package, as a user meets it: a wheel built from this checkout, installed into a fresh
virtual environment outside the checkout, runs the demo by its short name and carries every config."""

import os
import pathlib
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(args, **kwargs):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def test_the_wheel_carries_the_configs_and_runs_the_demo_by_name_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    # Built as pip builds it for a user: in an isolated build environment with pyproject's build backend.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
         cwd=tmp_path)
    (wheel,) = wheels.glob("resnet_scaling-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "configs").glob("*.py")}
    assert {f"resnet_scaling/configs/{name}" for name in shipped} <= names
    assert not any(name.startswith(("tests/", "configs/", "benchmarks/")) for name in names)

    # A fresh environment; its dependencies (jax, flax, TensorFlow, ...) come from this interpreter's
    # site-packages, the package itself only from the wheel.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    where = _run([str(python), "-c", "import resnet_scaling, resnet_scaling.configs as c; "
                  "print(resnet_scaling.__file__); print(c.__file__)"], cwd=elsewhere, env=env).stdout
    assert str(REPO) not in where and str(venv) in where, where

    workdir = tmp_path / "run"
    proc = _run([str(python), "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
                 f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.num_train_examples=256",
                 "--config.data.num_eval_examples=64", "--config.training.num_train_steps=3",
                 "--config.eval.global_batch_size=64", "--config.training.tensorboard=false"],
                cwd=elsewhere, env=env)
    assert "Done: step 3 of 3" in proc.stderr
    assert (workdir / "summary.json").is_file() and (workdir / "export" / "config.json").is_file()
    # configs/pod.py as the README writes it also resolves from any directory.
    proc = subprocess.run([str(python), "-m", "resnet_scaling.train", "--config=configs/pod.py",
                           f"--workdir={tmp_path / 'pod'}", "--config.mesh.num_devices=-1",
                           "--config.training.global_batch_size=12"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    # The pod's BN groups of 128 images cannot split a batch of 12: refused in one line, before any data.
    assert proc.returncode != 0 and "error: config.model.bn_group_size" in proc.stderr, proc.stderr[-2000:]
