"""`sections.read`: a config read into the typed sections the parts take."""

import dataclasses

from resnet_scaling import checkpointing, data, models
from resnet_scaling import config as config_lib
from resnet_scaling.metrics import mlperf_log
from resnet_scaling.training import optim, sections, steps
from tests.helpers import tiny_config


def test_the_sections_defaults_are_the_base_configs():
    """A section built by hand with its defaults is the base config's: they cannot drift apart."""
    read = sections.read(config_lib.get_base_config())
    assert read.model == models.ModelConfig()
    assert read.optimizer == optim.OptimizerConfig()
    assert read.schedule == optim.ScheduleConfig()
    assert read.data == data.DataConfig()
    assert read.checkpoint == checkpointing.CheckpointConfig()
    assert read.loop == sections.LoopConfig()
    # The base config gives its warm-up in epochs (5), which MLPerf's log records as given.
    assert read.report.mlperf == dataclasses.replace(mlperf_log.MLPerfConfig(), warmup_epochs=5.0)


def test_every_section_field_is_a_config_field_or_named_on_purpose():
    """A section's fields are its config section's (same names), besides the few read from elsewhere."""
    config = config_lib.get_base_config()
    from_elsewhere = {"DataConfig": {"num_classes", "seed", "mlperf_crop"}}
    for cls, section in ((models.ModelConfig, config.model), (optim.OptimizerConfig, config.optimizer),
                         (optim.ScheduleConfig, config.schedule), (data.DataConfig, config.data),
                         (checkpointing.CheckpointConfig, config.checkpoint)):
        elsewhere = from_elsewhere.get(cls.__name__, set())
        missing = {f.name for f in dataclasses.fields(cls)} - set(section) - elsewhere
        assert not missing, (cls.__name__, missing)


def test_read_takes_the_values_the_config_holds():
    config = tiny_config(seed=7, data__source="synthetic", optimizer__name="lars",
                         schedule__name="polynomial", training__label_smoothing=0.1, mlperf__enabled=True)
    read = sections.read(config)
    assert (read.model.name, read.model.num_classes, read.model.num_filters) == ("resnet_tiny", 10, 8)
    assert (read.optimizer.name, read.schedule.name) == ("lars", "polynomial")
    assert (read.data.source, read.data.image_size, read.data.seed) == ("synthetic", 32, 7)
    assert read.data.num_classes == 10 and read.data.mlperf_crop
    assert read.step == steps.StepConfig(mean_rgb=config_lib.IMAGENET_MEAN_RGB,
                                         stddev_rgb=config_lib.IMAGENET_STDDEV_RGB, num_classes=10,
                                         label_smoothing=0.1)


def test_a_saved_configs_lists_come_back_as_tuples_and_missing_fields_take_defaults():
    """A config saved as JSON holds lists; an older run's lacks newer fields (`config_from_saved` fills
    them, and a section's default stands in where even that has none)."""
    saved = tiny_config().to_dict()
    saved["schedule"]["boundary_epochs"] = [1.0, 2.0]
    config = config_lib.config_from_saved(saved)
    read = sections.read(config)
    assert read.schedule.boundary_epochs == (1.0, 2.0)
    with config.unlocked():
        del config.model["lowering"]
    assert sections.read(config).model.lowering == "auto"
