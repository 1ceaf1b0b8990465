"""Epochs to MLPerf's ResNet target at a batch size (`planning/convergence.py`), against MLPerf's own files
and checker: the RCP JSON that mlperf-logging ships, read here with json and NumPy, and the checker's own
interpolation."""

import json
import os

import numpy as np
import pytest
from mlperf_logging.rcp_checker import rcp_checker

from resnet_scaling.planning import convergence


def _raw_rcps():
    path = os.path.join(os.path.dirname(rcp_checker.__file__), "training_4.0.0", "rcps_resnet.json")
    with open(path) as f:
        return {record["BS"]: record["Epochs to converge"] for record in json.load(f).values()}


def test_each_reference_batch_gives_the_mean_of_its_runs_without_the_fastest_and_slowest():
    raw = _raw_rcps()
    points = convergence.reference_points()
    assert [p.global_batch for p in points] == sorted(raw) and len(points) == 10
    for point in points:
        runs = sorted(raw[point.global_batch])
        assert point.runs == tuple(runs)
        assert point.epochs == pytest.approx(np.mean(runs[1:-1]))
        assert convergence.epochs_to_target(point.global_batch) == point
    # The case study's batch: ten runs of 55-57 epochs (56 without the extremes), not its 90.
    assert convergence.epochs_to_target(32_768).epochs == 56.0


@pytest.mark.parametrize("batch", [2048, 16_384, 20_000, 60_000])
def test_between_two_references_it_interpolates_as_mlperfs_checker_does(batch):
    checker = rcp_checker.RCP_Checker("training", "4.0.0", "resnet", verbose=False)
    low = checker._find_top_min_rcp(batch, "full_rcps")
    high = checker._find_bottom_max_rcp(batch, "full_rcps")
    _, expected = checker._create_interp_rcp(batch, low, high)
    result = convergence.epochs_to_target(batch)
    assert result.epochs == pytest.approx(expected["RCP Mean"])
    assert result.source == f"interpolated between the RCPs at {low['BS']} and {high['BS']}"
    assert result.runs == ()


def test_below_the_smallest_reference_it_stands_and_above_the_largest_there_is_no_figure():
    small = convergence.epochs_to_target(256)
    assert (small.global_batch, small.epochs, small.source) == (256, 35.0, "the smallest RCP, at 1632")
    with pytest.raises(ValueError, match="No MLPerf reference convergence point at or above a batch of "
                                         "70,000 images .* the largest is 67,840"):
        convergence.epochs_to_target(70_000)
    with pytest.raises(ValueError, match="positive"):
        convergence.epochs_to_target(0)
