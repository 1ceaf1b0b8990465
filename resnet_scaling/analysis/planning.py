"""Time and cost to MLPerf's ResNet-50 target on a system, predicted from its compiled (or measured) step.

Every figure is labelled with its basis (`Figure.basis`):

- **step time**: libtpu's estimate (`optimal_seconds`: compute, memory traffic, collectives as it models the
  chip and interconnect) of the real step AOT-compiled for a TPU system's topology (`aot.py`; "compiled"); a
  run's `summary.json` steady-state step ("measured"); else "not predicted" (no GPU compiler without the GPU).
- **compensation**: at most one factor per family, from the case study's figures only: for TPUs the published
  v2 Pod time over the pod's compiled step (`tpu_factor`); none for GPUs (its V100 figures have no compiled
  step; measured rows need none).
- **epochs to 75.90%** at the batch: MLPerf's reference convergence points (`convergence.py`; "published").
- **the case study's clock**: 90 x training images / batch steps (90 timed epochs; warm-up epoch, evaluation,
  compilation and set-up off the clock).
- **MLPerf's clock** (run_start to run_stop): training for the epochs to the target plus a pass over the
  50,000 validation images every 4 epochs (`ceil(epochs / 4)`); no set-up (init_start to init_stop: untimed).
- **scaling efficiency**: images/sec per chip over the plan's smallest system of that kind ("derived").
- **input pipeline**: host CPU cores each host needs for its share of images/sec, at a per-core rate the user
  gives (`benchmarks/input_pipeline.py` measures one); a check, not part of the step time.
- **cost** = chips x hours x price per chip-hour, on each clock, at a price with its source and date.

Nothing is fitted to the published results the predictions are checked against (benchmarks/planner_checks.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from resnet_scaling.analysis import convergence, hardware
from resnet_scaling.errors import RunError

CASE_STUDY_EPOCHS = 90  # The case study's timed epochs (after one warm-up epoch), at 76% top-1.
MLPERF_EVAL_EVERY_EPOCHS = 4  # MLPerf's rules for ResNet-50: an evaluation pass every 4 epochs.
IMAGENET_TRAIN_EXAMPLES = 1_281_167


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A published training time: the case study's pod, the one figure the TPU factor comes from."""

    system: str
    device_kind: str
    num_chips: int
    global_batch: int
    epochs: float
    minutes: float
    source: str

    def is_system_of(self, system: System) -> bool:
        """Whether `system` is this run's hardware and batch (what a factor from it may be computed on)."""
        return (system.device_kind == self.device_kind and system.num_chips == self.num_chips
                and system.global_batch == self.global_batch)

    @property
    def step_sec(self) -> float:
        """Seconds per step the published time implies over its epochs (derived)."""
        return self.minutes * 60 / (self.epochs * IMAGENET_TRAIN_EXAMPLES / self.global_batch)


CASE_STUDY_POD = PublishedRun(
    system="Cloud TPU v2 Pod (v2-512)", device_kind="TPU v2", num_chips=256, global_batch=32_768,
    epochs=CASE_STUDY_EPOCHS,
    minutes=7.9,
    source="the case study: 7.9 minutes for 90 epochs on 256 chips (Google Cloud blog, Dec 2018)")


@dataclasses.dataclass(frozen=True)
class Figure:
    """A number and where it comes from: basis is "compiled", "measured", "published", "derived",
    "assumed", "given" or "not predicted" (then value is None)."""

    value: float | None
    basis: str
    note: str = ""


NOT_PREDICTED = Figure(None, "not predicted")


@dataclasses.dataclass(frozen=True)
class Price:
    """A price per chip-hour in US dollars, with where and when it was read ("given" by the user, or
    "assumed" where no price page confirms it)."""

    usd_per_chip_hour: float
    source: str
    date: str = ""
    basis: str = "given"


# The case study's prices, as docs/case_study.md gives them: no price page confirms them ("assumed").
ASSUMED_PRICES: Mapping[str, Price] = {
    "TPU v2": Price(1.50, "the full v2 Pod at $384/h over 256 chips (docs/case_study.md)", "2018-12",
                    "assumed"),
    "V100": Price(2.48, "a V100 on GCP, 2018 list (docs/case_study.md); the VM not included", "2018-12",
                  "assumed"),
}


def price_for(device_kind: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of the longest key of `prices` that `device_kind` contains (case-insensitive), or None."""
    kind = device_kind.lower()
    keys = sorted((k for k in prices if k.lower() in kind), key=len, reverse=True)
    return prices[keys[0]] if keys else None


@dataclasses.dataclass(frozen=True)
class System:
    """What the planner needs of one system, from a compile report, a summary.json or a config alone.

    Attributes:
      device_kind: as JAX names the devices ("TPU v2", "NVIDIA H200").
      num_chips: accelerator chips (a TPU v2 or v3 chip is 2 JAX devices).
      num_hosts: host machines (each preprocesses its share of the input); 0 if unknown.
      step_sec: one training step (compiled, measured or not predicted).
      eval_pass_sec: one pass over the validation set (likewise).
    """

    name: str
    device_kind: str
    num_chips: int
    num_hosts: int
    global_batch: int
    step_sec: Figure
    eval_pass_sec: Figure
    num_train_examples: int = IMAGENET_TRAIN_EXAMPLES

    @property
    def family(self) -> str:
        """"TPU" or "GPU": the accelerator family a compensation factor covers."""
        return "TPU" if "tpu" in self.device_kind.lower() else "GPU"


def system_from_report(report: Mapping[str, Any]) -> System:
    """A system from a compile report (`python -m resnet_scaling.compile --json_out`, `aot.CompileReport`)."""
    step = report.get("estimated_step_sec")
    eval_step = report.get("estimated_eval_step_sec")
    passes = report.get("eval_steps_per_pass")
    return System(
        name=report.get("system") or report.get("model", "?"), device_kind=report["device_kind"],
        num_chips=int(report["num_chips"]), num_hosts=int(report.get("num_hosts") or 0),
        global_batch=int(report["global_batch_size"]),
        step_sec=Figure(step, "compiled", "libtpu's estimate of the AOT-compiled step") if step
        else Figure(None, "not predicted", f"libtpu gives no usable estimate of this step on "
                    f"{report['device_kind']} (none, or a negative optimal_seconds); no roofline model yet"),
        eval_pass_sec=Figure(eval_step * passes, "compiled", f"{passes} steps of libtpu's estimate")
        if eval_step and passes else Figure(None, "not predicted", "no compiled evaluation step"),
        num_train_examples=int(report["num_train_examples"]))


# What the planner plans and the case study measured: ResNet-50 at 224 px on ImageNet (or on generated
# data of that size, which times the same step).
CASE_STUDY_WORKLOAD = "ResNet-50 v1.5 (64 filters), imagenet2012, 224 px"


class WorkloadError(RunError, ValueError):
    """A run's summary of another workload (model, width, image size or dataset), which neither the
    planner nor the case study's report can set beside ImageNet's figures."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a run trained, read from its summary's `config` section.

    Attributes:
      label: for tables and charts ("resnet18 (16 filters), shapes, 32 px").
      mismatches: how it differs from the case study's workload; empty if it is that workload.
      synthetic: the case study's model and image size on generated data.
    """

    label: str
    mismatches: tuple[str, ...]
    synthetic: bool = False


def workload_of(config: Mapping[str, Any]) -> Workload:
    """The workload a summary's `config` describes, and how it differs from the case study's."""
    model, data = config.get("model", {}), config.get("data", {})
    name, filters, size = model.get("name"), model.get("num_filters"), data.get("image_size")
    source, dataset = data.get("source"), str(data.get("dataset", ""))
    dataset_name = dataset.split("/")[0].split(":")[0]  # "imagenet2012:5.1.0" -> "imagenet2012".

    def got(value: Any) -> str:
        return "not recorded" if value is None else repr(value)

    mismatches = []
    if name != "resnet50":
        mismatches.append(f"model.name is {got(name)}, not 'resnet50'")
    if filters != 64:
        mismatches.append(f"model.num_filters is {got(filters)}, not 64 (ResNet-50's width)")
    if size != 224:
        mismatches.append(f"data.image_size is {got(size)}, not 224")
    if source == "tfds" and dataset_name != "imagenet2012":
        mismatches.append(f"data.dataset is {dataset!r}, not 'imagenet2012'")
    elif source not in ("tfds", "synthetic"):
        why = " (a summary does not say what class folders hold)" if source == "folders" else ""
        mismatches.append(f"data.source is {got(source)}, not 'tfds' (imagenet2012){why}")
    data_label = "synthetic data" if source == "synthetic" else dataset_name if source == "tfds" else source
    label = f"{name} ({filters} filters), {data_label}, {size} px"
    return Workload(label, tuple(mismatches), source == "synthetic" and not mismatches)


def system_from_summary(summary: Mapping[str, Any]) -> System:
    """A system from a run's `summary.json`: its steady-state step and evaluation time (measured).

    Raises:
      WorkloadError: the run trained another workload than ResNet-50 on ImageNet at 224 px (the demo,
        say): its step says nothing about ImageNet's time to target.
    """
    run, throughput, times = summary["run"], summary["throughput"], summary["time"]
    config = summary.get("config", {})
    if mismatches := workload_of(config).mismatches:
        raise WorkloadError(f"not the workload the planner plans ({CASE_STUDY_WORKLOAD}): "
                            f"{'; '.join(mismatches)}; its step time says nothing about ImageNet's.")
    rate = throughput.get("images_per_sec")
    evals = (summary.get("accuracy") or {}).get("num_evals") or 0
    kind = run["device_kind"]
    return System(
        name=config.get("system", {}).get("name") or f"{run['devices']} x {kind}", device_kind=kind,
        num_chips=max(1, run["devices"] // hardware.devices_per_chip(kind)),
        num_hosts=int(run.get("process_count") or 0),
        global_batch=int(run["global_batch_size"]),
        step_sec=Figure(run["global_batch_size"] / rate, "measured", "summary.json: steady-state images/sec")
        if rate else Figure(None, "not predicted", "the summary has no steady-state images/sec"),
        eval_pass_sec=Figure(times["eval_sec"] / evals, "measured", f"summary.json: {evals} evaluations")
        if evals and times.get("eval_sec") else Figure(None, "not predicted", "no evaluation in the run"),
        num_train_examples=int(config.get("data", {}).get("num_train_examples") or IMAGENET_TRAIN_EXAMPLES))


def system_from_config(config: Any) -> System:
    """A system from a config alone (a GPU config without a run): batch and epochs, no step time."""
    kind = config.system.device_kind or "?"
    devices = int(config.mesh.num_devices)
    why = ("no GPU compiler runs without the GPU: pass a summary.json of a run on it" if "tpu" not in
           kind.lower() else "pass its compile report (python -m resnet_scaling.compile)")
    return System(name=config.system.name or "?", device_kind=kind,
                  num_chips=max(1, devices // hardware.devices_per_chip(kind)),
                  num_hosts=0, global_batch=int(config.training.global_batch_size),
                  step_sec=Figure(None, "not predicted", why),
                  eval_pass_sec=Figure(None, "not predicted", why),
                  num_train_examples=int(config.data.num_train_examples))


def tpu_factor(pod: System, published: PublishedRun = CASE_STUDY_POD) -> Figure:
    """The TPU family's factor: the published pod's step time over the pod's compiled step time.

    Raises:
      ValueError: `pod` is not the published run's system (another device kind or batch), or has no step.
    """
    if not published.is_system_of(pod):
        raise ValueError(f"{pod.name}: {pod.num_chips} x {pod.device_kind} at batch {pod.global_batch:,}, "
                         f"not the published {published.system} ({published.num_chips} x "
                         f"{published.device_kind} at {published.global_batch:,})")
    if pod.step_sec.value is None or pod.step_sec.basis != "compiled":
        raise ValueError(f"{pod.name}: no compiled step time to calibrate on.")
    factor = published.step_sec / pod.step_sec.value
    return Figure(factor, "derived", f"{published.source}: {published.step_sec * 1e3:.1f} ms a step over the "
                  f"compiled {pod.step_sec.value * 1e3:.1f} ms ({1 / factor:.0%} of libtpu's estimate)")


@dataclasses.dataclass(frozen=True)
class Clock:
    """Seconds to the target on one clock, and its cost; None where not predicted."""

    epochs: Figure
    train_sec: float | None
    eval_sec: float | None
    total_sec: float | None
    cost_usd: float | None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One system's prediction: uncompensated, and compensated where its family has a factor."""

    system: str
    device_kind: str
    num_chips: int
    num_hosts: int
    global_batch: int
    step_sec: Figure
    factor: Figure | None
    compensated_step_sec: Figure | None
    images_per_sec: float | None
    compensated_images_per_sec: float | None
    scaling_efficiency: Figure | None
    case_study: Clock
    mlperf: Clock
    compensated_case_study: Clock | None
    compensated_mlperf: Clock | None
    price: Price | None
    host_cores_needed: Figure | None


def _clock(system: System, epochs: Figure, step_sec: float | None, eval_pass_sec: float | None,
           price: Price | None, with_eval: bool) -> Clock:
    steps = math.ceil(epochs.value * system.num_train_examples / system.global_batch)
    train = steps * step_sec if step_sec else None
    passes = math.ceil(epochs.value / MLPERF_EVAL_EVERY_EPOCHS)
    evaluation = (passes * eval_pass_sec if eval_pass_sec else None) if with_eval else 0.0
    total = train + evaluation if train is not None and evaluation is not None else None
    cost = system.num_chips * total / 3600 * price.usd_per_chip_hour if price and total is not None else None
    return Clock(epochs, train, evaluation if with_eval else None, total, cost)


def predict(system: System, factor: Figure | None = None, price: Price | None = None,
            input_images_per_sec_per_core: Figure | None = None,
            epochs_override: Figure | None = None) -> Prediction:
    """The prediction for one system; `factor` compensates its step times (the family's, or None).

    Args:
      epochs_override: MLPerf-clock epochs instead of the reference runs' (a published run's own, to check
        the step-time model apart from the epochs).

    Raises:
      ValueError: a global batch above MLPerf's largest reference (no epochs to the target).
    """
    if epochs_override is None:
        rcp = convergence.epochs_to_target(system.global_batch)
        mlperf_epochs = Figure(rcp.epochs, "published", f"MLPerf's reference runs: {rcp.source}")
    else:
        mlperf_epochs = epochs_override
    case_epochs = Figure(CASE_STUDY_EPOCHS, "published", "the case study's 90 timed epochs")
    step, eval_pass = system.step_sec.value, system.eval_pass_sec.value
    scale = factor.value if factor else None
    comp_step = step * scale if step and scale else None
    comp_eval = eval_pass * scale if eval_pass and scale else None
    rate = system.global_batch / step if step else None
    comp_rate = system.global_batch / comp_step if comp_step else None
    cores = None
    if input_images_per_sec_per_core and system.num_hosts and (comp_rate or rate):
        per_host = (comp_rate or rate) / system.num_hosts
        core = input_images_per_sec_per_core
        cores = Figure(per_host / core.value, "derived", f"{per_host:,.0f} images/sec per host at "
                       f"{core.value:,.0f} per core ({core.basis}: {core.note})")
    compensated = factor is not None and comp_step is not None
    return Prediction(
        system=system.name, device_kind=system.device_kind, num_chips=system.num_chips,
        num_hosts=system.num_hosts, global_batch=system.global_batch, step_sec=system.step_sec,
        factor=factor if compensated else None,
        compensated_step_sec=Figure(comp_step, "derived", "the compiled step x the family's factor")
        if compensated else None,
        images_per_sec=rate, compensated_images_per_sec=comp_rate, scaling_efficiency=None,
        case_study=_clock(system, case_epochs, step, eval_pass, price, with_eval=False),
        mlperf=_clock(system, mlperf_epochs, step, eval_pass, price, with_eval=True),
        compensated_case_study=_clock(system, case_epochs, comp_step, comp_eval, price, with_eval=False)
        if compensated else None,
        compensated_mlperf=_clock(system, mlperf_epochs, comp_step, comp_eval, price, with_eval=True)
        if compensated else None,
        price=price, host_cores_needed=cores)


def with_scaling_efficiency(predictions: Sequence[Prediction]) -> list[Prediction]:
    """`predictions` with each one's images/sec per chip over the smallest system's of its device kind."""
    smallest: dict[str, Prediction] = {}
    for p in sorted(predictions, key=lambda p: p.num_chips):
        if p.images_per_sec:
            smallest.setdefault(p.device_kind, p)
    out = []
    for p in predictions:
        ref = smallest.get(p.device_kind)
        efficiency = None
        if p.images_per_sec and ref is not None:
            value = (p.images_per_sec / p.num_chips) / (ref.images_per_sec / ref.num_chips)
            efficiency = Figure(value, "derived", f"per chip, over {ref.system} ({ref.num_chips} chips)")
        out.append(dataclasses.replace(p, scaling_efficiency=efficiency))
    return out
