"""JAX's persistent compilation cache: a run restarted after SIGTERM loads its compiled step."""

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _launch_until(args, pattern, cwd):
    """Starts the training command, reads its log until `pattern`, sends SIGTERM, returns the log."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen([sys.executable, "-m", "resnet_scaling.train", *args], cwd=cwd,
                            env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.search(pattern, line):
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    return "".join(lines)


def _compile_sec(log):
    return float(re.search(r"Compiled the train step in ([0-9.]+)s", log).group(1))


@pytest.mark.slow
def test_a_restart_after_sigterm_loads_the_compiled_step_from_the_cache(tmp_path):
    workdir = tmp_path / "run"
    args = ["--config=demo", f"--workdir={workdir}", f"--config.data.cache_dir={tmp_path / 'data'}",
            "--config.data.num_train_examples=512", "--config.data.num_eval_examples=64",
            "--config.training.num_train_steps=100000", "--config.training.log_every_steps=1",
            "--config.eval.global_batch_size=64", "--config.training.tensorboard=false"]
    first = _launch_until(args, r"step 3/", tmp_path)
    assert "Preempted (SIGTERM)" in first
    second = _launch_until(args, r"step 5/", tmp_path)  # SIGTERM is handled from the first step on.
    assert "Resumed from" in second
    # One program (an entry is KEY-cache; with a maximum cache size JAX also keeps KEY-atime beside it).
    assert len(list((workdir / "compilation_cache").glob("jit_train_step-*-cache"))) == 1
    assert _compile_sec(second) < 0.5 * _compile_sec(first), (_compile_sec(first), _compile_sec(second))
