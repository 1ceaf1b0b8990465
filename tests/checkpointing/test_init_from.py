"""`model.init_from`: training starts from a torchvision .npz or from a run's exported or best weights;
`model.init_skip_classifier` fine-tunes on another number of classes; other mismatches are refused."""

import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from resnet_scaling import checkpointing
from resnet_scaling.config import ConfigError
from resnet_scaling.models.weights import from_torchvision
from resnet_scaling.training import trainer, training_setup
from tests.helpers import random_arrays, tiny_config
from tests.torchvision_weights import torchvision_state_dict


def _leaves(tree):
    return jax.tree.leaves(jax.device_get(tree))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run with exported and best weights."""
    workdir = tmp_path_factory.mktemp("trained")
    config = tiny_config(checkpoint__enabled=True, checkpoint__async_save=False, eval__every_epochs=0.5)
    trainer.train_and_evaluate(config, str(workdir), arrays=random_arrays())
    return workdir


@pytest.mark.parametrize("where", ["workdir", "export", "best"])
def test_training_starts_from_a_runs_weights(trained, where):
    path = {"workdir": trained, "export": trained / "export",
            "best": checkpointing.best_weights(str(trained))}[where]
    expected, _ = checkpointing.load_exported(str(path))
    run = training_setup.setup(tiny_config(model__init_from=str(path)), arrays=random_arrays(seed=1))
    for got, want in zip(_leaves({"params": run.state.params, "batch_stats": run.state.batch_stats}),
                         jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    assert int(run.state.step) == 0  # Weights only: the step and optimizer start afresh.
    assert run.state.params["classifier"]["kernel"].sharding.is_fully_replicated


def test_fine_tuning_on_other_classes_needs_skip_classifier(trained, caplog):
    config = tiny_config(model__init_from=str(trained), model__num_classes=4)
    arrays = random_arrays(num_classes=4)
    with pytest.raises(ConfigError, match=r"classifier.*init_skip_classifier=true"):
        training_setup.setup(config, arrays=arrays)
    config.model.init_skip_classifier = True
    with caplog.at_level("INFO", logger="resnet_scaling"):
        run = training_setup.setup(config, arrays=arrays)
    loaded, _ = checkpointing.load_exported(str(trained))
    # One line says what was loaded (every exported array but the classifier's kernel and bias) and what not.
    taken = [x for key, x in flatten_dict(loaded, sep="/").items()
             if not key.startswith("params/classifier/")]
    assert len(taken) == len(jax.tree.leaves(loaded)) - 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Initialised from")]
    assert lines == [f"Initialised from {trained}: {len(taken)} arrays, {sum(x.size for x in taken):,} "
                     "numbers (parameters and batch-norm statistics); the classifier starts afresh "
                     "(init_skip_classifier); the step, the optimizer state and the schedule start from "
                     "zero."]
    np.testing.assert_array_equal(jax.device_get(run.state.params["stem_conv"]["kernel"]),
                                  loaded["params"]["stem_conv"]["kernel"])
    assert run.state.params["classifier"]["kernel"].shape == (64, 4)  # Fresh, for 4 classes.
    result = trainer.train_and_evaluate(config, str(trained.parent / "fine_tuned"), arrays=arrays)
    assert int(result.state.step) == 4 and np.isfinite(result.train_history[-1]["loss"])


def test_training_starts_from_a_torchvision_npz(tmp_path):
    state_dict = torchvision_state_dict("resnet_tiny", num_classes=10, num_filters=8)
    np.savez(tmp_path / "tv.npz", **state_dict)
    run = training_setup.setup(tiny_config(model__init_from=str(tmp_path / "tv.npz")), arrays=random_arrays())
    expected = from_torchvision(state_dict, run.model)
    np.testing.assert_array_equal(jax.device_get(run.state.params["stem_conv"]["kernel"]),
                                  expected["params"]["stem_conv"]["kernel"])
    np.testing.assert_array_equal(jax.device_get(run.state.batch_stats["stem_bn"]["var"]),
                                  expected["batch_stats"]["stem_bn"]["var"])
    # Another class count: refused with the hint, then accepted with a fresh classifier.
    config = tiny_config(model__init_from=str(tmp_path / "tv.npz"), model__num_classes=3)
    with pytest.raises(ConfigError, match="(?s)10 classes.*init_skip_classifier=true"):
        training_setup.setup(config, arrays=random_arrays(num_classes=3))
    config.model.init_skip_classifier = True
    run = training_setup.setup(config, arrays=random_arrays(num_classes=3))
    assert run.state.params["classifier"]["bias"].shape == (3,)


def test_other_mismatches_and_missing_paths_are_refused(trained, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        training_setup.setup(tiny_config(model__init_from=str(tmp_path / "nowhere")), arrays=random_arrays())
    wider = tiny_config(model__init_from=str(trained), model__num_filters=16)
    refused = r"do not fit the model\. \d+ arrays of another shape: params/"
    with pytest.raises(ConfigError, match=refused) as info:
        training_setup.setup(wider, arrays=random_arrays())
    message = str(info.value)
    assert "init_skip_classifier" not in message  # Not only the classifier: no fine-tuning hint.
    assert "num_filters" in message and len(message) < 400, message  # The cause, in a few lines.
