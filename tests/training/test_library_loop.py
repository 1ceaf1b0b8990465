"""The README's arrays and own-loop examples run as written, and a batch with other keys fails naming the
right ones."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling.training import steps

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _own_loop_block() -> str:
    text = README.read_text()
    start = text.index("Your own loop, model and optimizer")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


def _arrays_block() -> str:
    text = README.read_text()
    start = text.index("Train on NumPy arrays in one call")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


@pytest.mark.slow
def test_the_readme_arrays_example_trains_evaluates_its_128_images_in_one_batch_and_prints_a_headline(
        tmp_path, capsys):
    """As written but for its workdir: 40 steps, every evaluation one batch of the 128 images (not the
    default 1,024), and `print(result)` a few lines, not the state's arrays."""
    block = _arrays_block()
    assert block.count('"/tmp/run"') == 1
    namespace = {}
    exec(compile(block.replace('"/tmp/run"', repr(str(tmp_path / "run"))), "README.md", "exec"),  # noqa: S102
         namespace)
    result = namespace["result"]
    assert int(result.state.step) == 40 and len(result.eval_history) == 10  # 4 steps an epoch, 10 epochs.
    assert {r["eval_count"] for r in result.eval_history} == {128}
    assert (result.plan.batch.eval_global_batch_size, result.plan.eval_steps) == (128, 1)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0].startswith("Done: step 40 of 40") and len(printed) <= 12, printed


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
