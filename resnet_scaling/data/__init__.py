"""Input: data sources behind one interface, and the generated demo dataset."""

from __future__ import annotations

import ml_collections
import numpy as np
from jax.sharding import Mesh

from resnet_scaling.data.shapes import make_shapes
from resnet_scaling.data.sources import ArraySource, DataSource, SyntheticSource, process_share

__all__ = ["ArraySource", "DataSource", "SyntheticSource", "create_data_source", "make_shapes",
           "process_share"]


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
    if source == "shapes":
        # Different seeds keep the held-out images apart from the training images.
        train = make_shapes(data.num_train_examples, data.image_size, seed=config.seed)
        held_out = make_shapes(data.num_eval_examples, data.image_size, seed=config.seed + 1_000_003)
        arrays = (*train, *held_out)
    elif source == "arrays":
        if arrays is None:
            raise ValueError("config.data.source is 'arrays': pass arrays=(train_images, train_labels, "
                             "eval_images, eval_labels) to train_and_evaluate.")
    else:
        raise ValueError(f"config.data.source: unknown source {source!r}.")
    return ArraySource(
        *arrays, global_batch_size=training.global_batch_size,
        eval_global_batch_size=config.eval.global_batch_size, mesh=mesh, seed=config.seed,
        shuffle=data.shuffle, num_classes=config.model.num_classes, image_size=data.image_size,
    )
