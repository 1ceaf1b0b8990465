"""Epochs to MLPerf's ResNet-50 target (75.90% top-1) at a global batch size: MLPerf's reference
convergence points (RCPs), as the `mlperf-logging` package ships them for its compliance checker.

The reference runs (LARS, rules 4.0.0) need 35 epochs at 1,632 and 3,264 images, 56 at 32,768 (the case
study's batch), 86 at 67,840. An RCP (runs at one batch) gives the "RCP mean": without the fastest and
slowest run. Between RCPs it is interpolated linearly in batch, as the checker does
(`rcp_checker.RCP_Checker._create_interp_rcp`); below the smallest RCP's batch that RCP stands (MLPerf
accepts a small-batch run that converges no faster); above the largest, no figure. These are the measured
RCPs (the checker's "full" set), not its pruned set (points slower than their neighbours' interpolation).
"""

from __future__ import annotations

import dataclasses

import numpy as np

RULESET = "4.0.0"  # MLPerf training rules whose RCPs are used (the compliance checker's --ruleset).


@dataclasses.dataclass(frozen=True)
class EpochsToTarget:
    """Epochs a ResNet-50 run at `global_batch` needs to reach MLPerf's target, and where that comes from.

    Attributes:
      epochs: MLPerf's RCP mean at this batch (interpolated between RCPs where none was run at it).
      source: "the RCP at 32768", "interpolated between the RCPs at A and B" or "the smallest RCP, at A".
      runs: the epochs of each reference run, where an RCP was run at exactly this batch.
      epoch_range: the fewest and most epochs of the reference runs (interpolated like `epochs`).
    """

    global_batch: int
    epochs: float
    source: str
    runs: tuple[int, ...] = ()
    epoch_range: tuple[float, float] = (0.0, 0.0)


def _reference_points(ruleset: str) -> list[dict]:
    from mlperf_logging.rcp_checker import rcp_checker  # Imported when asked: it imports scipy.

    checker = rcp_checker.RCP_Checker("training", ruleset, "resnet", verbose=False)
    return sorted(checker.rcp_data.values(), key=lambda record: record["BS"])


def reference_points(ruleset: str = RULESET) -> list[EpochsToTarget]:
    """MLPerf's RCPs for ResNet-50, smallest batch first."""
    return [EpochsToTarget(int(r["BS"]), float(r["RCP Mean"]), f"the RCP at {r['BS']}",
                           tuple(sorted(r["Epochs to converge"])),
                           (float(min(r["Epochs to converge"])), float(max(r["Epochs to converge"]))))
            for r in _reference_points(ruleset)]


def epochs_to_target(global_batch: int, ruleset: str = RULESET) -> EpochsToTarget:
    """The epochs MLPerf's reference runs need to reach 75.90% top-1 at `global_batch`.

    Raises:
      ValueError: a batch that is not positive, or larger than the largest RCP's (no reference).
    """
    if global_batch < 1:
        raise ValueError(f"The global batch must be a positive number of images, got {global_batch}.")
    points = reference_points(ruleset)
    batches = [p.global_batch for p in points]
    if global_batch > batches[-1]:
        raise ValueError(f"No MLPerf reference convergence point at or above a batch of {global_batch:,} "
                         f"images (rules {ruleset}; the largest is {batches[-1]:,}): its epochs to the "
                         "target are not known.")
    for point in points:
        if point.global_batch == global_batch:
            return point
    if global_batch < batches[0]:
        return dataclasses.replace(points[0], global_batch=global_batch, runs=(),
                                   source=f"the smallest RCP, at {batches[0]}")
    above = next(i for i, batch in enumerate(batches) if batch > global_batch)
    low, high = points[above - 1], points[above]
    batches = [low.global_batch, high.global_batch]
    epochs = float(np.interp(global_batch, batches, [low.epochs, high.epochs]))
    fewest = float(np.interp(global_batch, batches, [low.epoch_range[0], high.epoch_range[0]]))
    most = float(np.interp(global_batch, batches, [low.epoch_range[1], high.epoch_range[1]]))
    return EpochsToTarget(global_batch, epochs,
                          f"interpolated between the RCPs at {low.global_batch} and {high.global_batch}",
                          epoch_range=(fewest, most))
