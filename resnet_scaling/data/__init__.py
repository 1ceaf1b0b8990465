"""Input: data sources behind one interface, and the generated demo dataset.

The TFDS, class-folder and shapes sources run on tf.data; TensorFlow is imported only when one of them is
built, so the synthetic and array sources (and the model, step and metrics) run without it.
"""

from __future__ import annotations

import ml_collections
import numpy as np
from jax.sharding import Mesh

from resnet_scaling import host_tensorflow
from resnet_scaling.data.shapes import make_shapes, shapes_folder
from resnet_scaling.data.sources import (
    ArraySource,
    DataError,
    DataSource,
    SyntheticSource,
    prefetch,
    process_share,
)

__all__ = ["ArraySource", "DataError", "DataSource", "SyntheticSource", "create_data_source", "make_shapes",
           "prefetch", "process_share", "shapes_folder"]


def create_data_source(
    config: ml_collections.ConfigDict,
    mesh: Mesh,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> DataSource:
    """Builds the source `config.data.source` names.

    Args:
      config: the run's config.
      mesh: the device mesh batches are sharded over.
      arrays: `(train_images, train_labels, eval_images, eval_labels)` for the "arrays" source.

    Raises:
      DataError: the dataset is missing, unprepared or does not match the config; the message says
        what to run or change.
    """
    data, training = config.data, config.training
    source = data.source
    if source != "arrays" and arrays is not None:
        raise ValueError(f"Arrays were passed but config.data.source is {source!r}; set it to 'arrays'.")
    if source == "synthetic":
        return SyntheticSource(
            image_size=data.image_size, num_classes=config.model.num_classes,
            global_batch_size=training.global_batch_size,
            eval_global_batch_size=config.eval.global_batch_size, mesh=mesh,
            num_train_examples=data.num_train_examples, num_eval_examples=data.num_eval_examples,
            num_batches=data.synthetic_num_batches, seed=config.seed,
        )
    if source == "arrays":
        if arrays is None:
            raise ValueError("config.data.source is 'arrays': pass arrays=(train_images, train_labels, "
                             "eval_images, eval_labels) to train_and_evaluate.")
        return ArraySource(
            *arrays, global_batch_size=training.global_batch_size,
            eval_global_batch_size=config.eval.global_batch_size, mesh=mesh, seed=config.seed,
            shuffle=data.shuffle, num_classes=config.model.num_classes, image_size=data.image_size,
        )
    if source in ("tfds", "folders", "shapes"):
        host_tensorflow.import_tensorflow_for_host()
        from resnet_scaling.data import pipeline  # Imports TensorFlow.

        return pipeline.source_from_config(config, mesh)
    raise ValueError(f"config.data.source: unknown source {source!r}.")
