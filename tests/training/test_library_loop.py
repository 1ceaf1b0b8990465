"""The README's arrays and own-loop examples run as written, and a batch with other keys fails naming the
right ones."""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling.training import steps
from tests.helpers import users_compile, without_suite_cache

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _own_loop_block() -> str:
    text = README.read_text()
    start = text.index("Your own loop, model and optimizer")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


def _arrays_block() -> str:
    text = README.read_text()
    start = text.index("Train on NumPy arrays in one call")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


# After the README's block: what the test reads from the result, as one JSON line.
_RESULT_FACTS = """
import json
print(json.dumps({"step": int(result.state.step), "evaluations": len(result.eval_history),
                  "eval_counts": sorted({r["eval_count"] for r in result.eval_history}),
                  "eval_batch": result.plan.batch.eval_global_batch_size,
                  "eval_steps": result.plan.eval_steps}))
"""


@pytest.mark.slow
def test_the_readme_arrays_example_trains_evaluates_its_128_images_in_one_batch_and_prints_a_headline(
        tmp_path):
    """As written but for its workdir, as a user runs it (a script in a fresh process: one CPU device, XLA's
    default optimisations): 40 steps, every evaluation one batch of the 128 images (not the default 1,024),
    and `print(result)` a few lines, not the state's arrays. The script sets no logging up, as research
    code does not: progress still shows, each line once, starting with the time of day (absl's implicit
    `logging.basicConfig()` used to print them as "INFO:resnet_scaling.training.trainer:step ...")."""
    block = _arrays_block()
    assert block.count('"/tmp/run"') == 1
    script = tmp_path / "arrays_example.py"
    script.write_text(block.replace('"/tmp/run"', repr(str(tmp_path / "run"))) + _RESULT_FACTS)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env = {**without_suite_cache(users_compile(env)), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *printed, facts = proc.stdout.strip().splitlines()
    # 4 steps an epoch, 10 epochs, an evaluation after each.
    assert json.loads(facts) == {"step": 40, "evaluations": 10, "eval_counts": [128], "eval_batch": 128,
                                 "eval_steps": 1}
    assert printed[0].startswith("Done: step 40 of 40") and len(printed) <= 12, printed
    assert any(line.strip().startswith("top-1: final") for line in printed), printed
    assert str(tmp_path / "run") in proc.stdout and "Array(" not in proc.stdout  # Where it saved; no arrays.
    last = r"step 40/40 \(epoch|Done: step 40 of 40"
    ours = [line for line in proc.stderr.splitlines() if re.search(last, line)]
    assert len(ours) == 2, proc.stderr[-3000:]  # Once each: not also through the root logger.
    assert all(re.match(rf"\d\d:\d\d:\d\d ({last})", line) for line in ours), ours
    assert "INFO:resnet_scaling" not in proc.stderr


def test_the_readme_own_loop_example_trains(capsys):
    exec(compile(_own_loop_block(), "README.md", "exec"), {})  # noqa: S102 - the README's own code.
    step, loss = capsys.readouterr().out.split()
    assert int(step) == 3 and np.isfinite(float(loss)) and float(loss) > 0


def test_a_batch_with_other_keys_is_refused_naming_the_keys_it_needs():
    config = steps.StepConfig(mean_rgb=(0.5,) * 3, stddev_rgb=(0.25,) * 3, num_classes=10)
    batch = {"image": jnp.zeros((2, 8, 8, 3), jnp.uint8), "label": jnp.zeros((2,), jnp.int32)}
    with pytest.raises(KeyError, match=r"needs 'images' \(uint8 \[N, H, W, 3\]\) and 'labels'.*\['image', "
                                       r"'label'\]"):
        steps.train_step(None, batch, step_config=config)
    with pytest.raises(KeyError, match="eval_step: the batch needs 'images'"):
        steps.eval_step(None, batch, step_config=config)
