"""`training.profile_steps`: a jax.profiler trace of a window of steps, where TensorBoard looks for it."""

import pytest
from jax.profiler import ProfileData

from resnet_scaling import config as config_lib
from resnet_scaling.training import trainer
from tests.helpers import random_arrays, tiny_config


def test_a_window_of_steps_is_traced_into_the_tensorboard_folder(tmp_path):
    config = tiny_config(training__profile_steps=(2, 3))
    result = trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    assert int(result.state.step) == 4
    traces = list((tmp_path / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1
    # The window is steps 2 and 3: the trace holds two executions of the train step dispatched from Python
    # (JAX's own reader of the trace; counted by hand from the window, not from the trainer).
    dispatched = [event.name for plane in ProfileData.from_file(str(traces[0])).planes for line in plane.lines
                  if line.name == "python" for event in line.events
                  if event.name == "CommonPjRtLoadedExecutable::Execute (jit_train_step)"]
    assert len(dispatched) == 2, dispatched


def test_no_trace_by_default(tmp_path):
    trainer.train_and_evaluate(tiny_config(), str(tmp_path), arrays=random_arrays())
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("window", [(3, 2), (0, 4), (-1, 2), (1, 2, 3)])
def test_a_bad_window_is_refused(window):
    with pytest.raises(config_lib.ConfigError, match="training.profile_steps"):
        config_lib.validate(tiny_config(training__profile_steps=window))
