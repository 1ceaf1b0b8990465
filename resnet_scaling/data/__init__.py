"""Input: data sources behind one interface, and the generated demo dataset.

| module | job |
|---|---|
| `base.py` | `DataSource` (interface), `DataConfig`, `DataError`, padding, prefetch, shares, shaped batch |
| `sources.py` | synthetic batches made on the device; NumPy arrays in memory |
| `pipeline.py` | tf.data sources: TFDS datasets, class folders and the generated shapes |
| `preprocessing.py`, `records.py`, `image_folders.py`, `tfds_data.py`, `shapes.py` | their parts |

The TFDS, class-folder and shapes sources run on tf.data; TensorFlow is imported only when one of them is
built, so the synthetic and array sources (and the model, step and metrics) run without it.
"""

from __future__ import annotations

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).

import numpy as np
from jax.sharding import Mesh

from resnet_scaling.config import plan as plan_lib
from resnet_scaling.config.fields import DATA_SOURCES
from resnet_scaling.data.base import (
    MLPERF_CROP_AREA_RANGE,
    DataConfig,
    DataError,
    DataSource,
    pad_batch,
    prefetch,
    process_share,
    shaped_eval_batch,
    shaped_train_batch,
)
from resnet_scaling.data.shapes import make_shapes, shapes_folder
from resnet_scaling.data.sources import ArraySource, SyntheticSource
from resnet_scaling.job import tf_import

__all__ = ["MLPERF_CROP_AREA_RANGE", "ArraySource", "DataConfig", "DataError",
           "DataSource", "SyntheticSource", "create_data_source", "make_shapes", "pad_batch", "prefetch",
           "process_share", "shapes_folder", "shaped_eval_batch", "shaped_train_batch"]

_TF_DATA_SOURCES = ("tfds", "folders", "shapes")


def create_data_source(
    data: DataConfig,
    mesh: Mesh,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    *,
    batch: plan_lib.BatchPlan,
    evaluation_only: bool = False,
) -> DataSource:
    """Builds the source `data.source` names.

    Args:
      data: the run's data section (`sections.read(config).data`).
      mesh: the device mesh batches are sharded over.
      arrays: `(train_images, train_labels, eval_images, eval_labels)` for the "arrays" source.
      batch: the run's batch sizes (`plan.batch_plan_for_mesh(config, mesh)`); the source fits the
        evaluation batch to its evaluation set (`BatchPlan.for_eval_set`), as `plan.derive` does.
      evaluation_only: the caller reads the evaluation split alone: the "Input:" line names only it.

    Raises:
      DataError: the dataset is missing, unprepared or does not match the config; the message says
        what to run or change.
    """
    source = data.source
    if source != "arrays" and arrays is not None:
        raise ValueError(f"Arrays were passed but config.data.source is {source!r}; set it to 'arrays'.")
    if source == "synthetic":
        return SyntheticSource(
            image_size=data.image_size, num_classes=data.num_classes, batch=batch, mesh=mesh,
            num_train_examples=data.num_train_examples, num_eval_examples=data.num_eval_examples,
            num_batches=data.synthetic_num_batches, seed=data.seed,
        )
    if source == "arrays":
        if arrays is None:
            raise ValueError("config.data.source is 'arrays': pass arrays=(train_images, train_labels, "
                             "eval_images, eval_labels) to train_and_evaluate.")
        return ArraySource(
            *arrays, batch=batch, mesh=mesh, seed=data.seed, shuffle=data.shuffle,
            num_classes=data.num_classes, image_size=data.image_size, class_names=data.class_names,
        )
    if source in _TF_DATA_SOURCES:
        tf_import.import_tensorflow_for_host()
        from resnet_scaling.data import pipeline  # Imports TensorFlow.

        return pipeline.source_from_config(data, mesh, batch, evaluation_only=evaluation_only)
    raise ValueError(f"config.data.source: unknown source {source!r}; choose one of "
                     f"{', '.join(DATA_SOURCES)}.")
