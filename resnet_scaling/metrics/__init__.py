"""Training metrics: on-device step metrics, throughput, time-to-accuracy, utilisation, writers, summary.

| module | job |
|---|---|
| `device.py` | step metrics kept on the device and fetched every N steps; the evaluation summary |
| `throughput.py` | the training clock (compile, evaluation, checkpoints off it), steady-state images/sec |
| `goodput.py` | goodput and badput by cause over every launch of a run (WORKDIR/goodput.json) |
| `run_clock.py` | the run's time accounting in one object, saved in checkpoints; records goodput |
| `accuracy.py` | time-to-accuracy (the case study's timed region and MLPerf's clock), epochs-to-accuracy |
| `utilisation.py` | achieved TFLOP/s per device, MFU against the peak rates of job/hardware.py |
| `writers.py` | JSON lines, TensorBoard event files |
| `summary.py` | `summary.json`: the headline figures of a run and its config; the closing headline |
| `mlperf_log.py` | WORKDIR/mlperf_log.txt through mllog, MLPerf's clock, its blocks, epochs and evaluations |
| `run_report.py` | a launch's accounts for the loop: clock, records, goodput, writers, MLPerf log, summary |
| `compiled.py` | FLOPs and memory per device of a compiled step, from XLA's cost and memory analysis |
| `profiling.py` | a `jax.profiler` trace of a window of steps, for TensorBoard's Profile tab |
"""

from resnet_scaling.job import native_noise as _native_noise

_native_noise.import_jax_quietly()  # Before anything here imports JAX (job/native_noise.py).


from resnet_scaling.job.console import format_duration
from resnet_scaling.job.hardware import peak_tflops_per_device
from resnet_scaling.metrics.accuracy import MLPERF_TARGET_TOP1, TimeToAccuracy
from resnet_scaling.metrics.device import MetricsBuffer, summarize_eval
from resnet_scaling.metrics.goodput import GoodputRecorder, goodput_summary
from resnet_scaling.metrics.run_clock import RunClock
from resnet_scaling.metrics.run_report import RunReport
from resnet_scaling.metrics.summary import (
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_VERSION,
    build_summary,
    check_summary,
    read_summary,
    write_summary,
)
from resnet_scaling.metrics.throughput import SteadyStateThroughput, ThroughputTimer
from resnet_scaling.metrics.utilisation import utilisation
from resnet_scaling.metrics.writers import JsonLinesWriter, MetricWriters, TensorBoardWriter

__all__ = [
    "MLPERF_TARGET_TOP1",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_VERSION",
    "JsonLinesWriter",
    "MetricWriters",
    "GoodputRecorder",
    "MetricsBuffer",
    "RunClock",
    "RunReport",
    "SteadyStateThroughput",
    "TensorBoardWriter",
    "ThroughputTimer",
    "TimeToAccuracy",
    "build_summary",
    "check_summary",
    "format_duration",
    "goodput_summary",
    "peak_tflops_per_device",
    "read_summary",
    "summarize_eval",
    "utilisation",
    "write_summary",
]
