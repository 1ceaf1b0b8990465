"""The README's own-loop example runs as written, and a batch with other keys fails naming the right ones."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

from resnet_scaling import steps

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _own_loop_block() -> str:
    text = README.read_text()
    start = text.index("Your own loop, model and optimizer")
    return re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)


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
