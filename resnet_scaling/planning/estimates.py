"""Time and cost to a system's target, predicted from its compiled (or measured) step.

Every figure is labelled with its basis (`Figure.basis`):

- **step time**: the step model (`step_model.py`): a compiled program's base (libtpu's estimate, else its
  roofline) and collectives, calibrated per chip generation on published MLPerf results, with an interval
  from the fit's leave-one-out errors ("calibrated"; "uncalibrated" where a generation has no published
  point and borrows another's fit); a run's `summary.json` steady-state step ("measured"). The raw model
  (base + collectives, no calibration) is kept beside it, named as such.
- **epochs** from the recipe the config runs: its own `training.num_epochs` (the case study's 91 for the
  shipped configs), or, for a config in MLPerf mode, MLPerf's reference convergence points at its batch with
  their min-max range (`convergence.py`).
- **time to target** = the epochs' steps plus an evaluation pass every `eval every` epochs; the case study's
  clock (90 timed epochs, training only) is kept for its comparisons.
- **cost**, one bill with the same terms for every row (`Bill`): (chips x price per chip-hour + nodes x host
  VM per hour where billed apart) x hours, over the training, the evaluation and the set-up before the
  clock (compiling the steps and starting the job on the accelerator's own hosts: `ASSUMED_SETUP_SEC` for
  every system, not the compile time of the machine the report was made on), at a price from the shipped
  dated price file (`prices.json`) or the user's.
- **scaling efficiency**: the step without its collectives over the step (the same chip at the same batch
  per chip, communicating nothing): a fixed reference, whichever other rows are listed ("derived").
- **input pipeline**: host CPU cores each host needs for its share of images/sec, at a per-core rate the user
  gives (`benchmarks/input_pipeline.py` measures one); a check, not part of the step time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from resnet_scaling.config import IMAGENET_NUM_TRAIN_EXAMPLES, recipes
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.config.fields import TRAINING_LENGTH
from resnet_scaling.job import hardware
from resnet_scaling.job.errors import RunError
from resnet_scaling.planning import convergence, step_model

PRICES_PATH = pathlib.Path(__file__).with_name("prices.json")
# The shipped compile report whose FLOPs and HBM bytes per image stand for a program that cannot be compiled
# here (a GPU's: no GPU compiler runs without the GPU; TPU v6e's: libtpu crashes compiling it): ResNet-50
# at 256 images a chip, one device per chip.
REFERENCE_CONFIG = "tpu_v5e_16"
GPUS_PER_NODE = 8
# Seconds billed before the clock starts on every system: compiling the train and evaluation steps and
# starting the job on the accelerator's own hosts. No published figure times it on a TPU or GPU host (a
# compile report's compile_sec is the machine it was made on, a 2-core CPU VM for the shipped ones), so one
# assumption for every row, labelled "assumed", keeps the bills comparable.
ASSUMED_SETUP_SEC = 300.0


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A published training time: the case study's pod, against which its comparisons are checked."""

    system: str
    device_kind: str
    num_chips: int
    global_batch: int
    epochs: float
    minutes: float
    source: str


CASE_STUDY_POD = PublishedRun(
    system="Cloud TPU v2 Pod (v2-512)", device_kind="TPU v2", num_chips=256, global_batch=32_768,
    epochs=recipes.CASE_STUDY_TIMED_EPOCHS,
    minutes=7.9,
    source="the case study: 7.9 minutes for 90 epochs on 256 chips (Google Cloud blog, Dec 2018)")


@dataclasses.dataclass(frozen=True)
class Figure:
    """A number and where it comes from: basis is "calibrated", "uncalibrated", "compiled", "roofline",
    "measured", "published", "derived", "assumed", "given" or "not predicted" (then value is None)."""

    value: float | None
    basis: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class HostPrice:
    """A VM billed apart from its accelerators (a V100's N1 machine), per node."""

    machine: str
    usd_per_hour: float
    source: str
    date: str = ""


@dataclasses.dataclass(frozen=True)
class Price:
    """A price per chip-hour in US dollars, with where and when it was read ("shipped": the dated price
    file; "given" by the user; "assumed" where no price page confirms it), and any host VM by GPUs per
    node."""

    usd_per_chip_hour: float
    source: str
    date: str = ""
    basis: str = "given"
    host_vm: Mapping[int, HostPrice] = dataclasses.field(default_factory=dict)

    def host_for(self, chips_per_node: int) -> HostPrice | None:
        return self.host_vm.get(chips_per_node)


def load_prices(path: str | pathlib.Path = PRICES_PATH, basis: str = "shipped") -> dict[str, Price]:
    """A price file: {"DEVICE KIND": {"usd_per_chip_hour", "source", "date", "host_vm": {"8": {"machine",
    "usd_per_hour", "source", "date"}}}}; keys starting with "_" are comments.

    Raises:
      ValueError: a malformed entry (named).
    """
    table = read_json_object(path, "a price table")
    prices = {}
    for kind, entry in table.items():
        if kind.startswith("_"):
            continue
        try:
            hosts = {int(n): HostPrice(h["machine"], float(h["usd_per_hour"]), str(h["source"]),
                                       str(h.get("date", "")))
                     for n, h in (entry.get("host_vm") or {}).items()}
            prices[kind] = Price(float(entry["usd_per_chip_hour"]), str(entry["source"]),
                                 str(entry.get("date", "")), basis, hosts)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: {kind!r} needs usd_per_chip_hour and source ({e})") from None
        usds = [prices[kind].usd_per_chip_hour, *(h.usd_per_hour for h in hosts.values())]
        if not all(math.isfinite(u) and u >= 0 for u in usds):
            raise ValueError(f"{path}: {kind!r} has a price below 0 or not a number; prices are US dollars "
                             ">= 0")
    return prices


def read_json_object(path: str | pathlib.Path, what: str) -> dict[str, Any]:
    """The JSON object in the file at `path`.

    Raises:
      ValueError: the file is not JSON, or holds something other than an object (a list, null, a number):
        the message names `what` was expected.
      OSError: the file cannot be read.
    """
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        got = "null" if data is None else type(data).__name__
        raise ValueError(f"{path}: expected {what} (a JSON object), got {got}")
    return data


def price_for(device_kind: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of the longest key of `prices` that `device_kind` contains (case-insensitive), or None."""
    kind = device_kind.lower()
    keys = sorted((k for k in prices if k.lower() in kind), key=len, reverse=True)
    return prices[keys[0]] if keys else None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How long a config trains: its epochs, how often it evaluates, and whether in MLPerf mode."""

    num_epochs: float
    eval_every_epochs: float
    mlperf_mode: bool = False


CASE_STUDY_RECIPE = Recipe(recipes.CASE_STUDY_TRAINED_EPOCHS, recipes.CASE_STUDY_EVAL_EVERY_EPOCHS)


@dataclasses.dataclass(frozen=True)
class System:
    """What the planner needs of one system, from a compile report, a summary.json or a config.

    Attributes:
      device_kind: as JAX names the devices ("TPU v2", "NVIDIA H200").
      num_chips: accelerator chips (a TPU v2 or v3 chip is 2 JAX devices).
      num_hosts: host machines (each preprocesses its share of the input); 0 if unknown.
      chips_per_node: GPUs per node (a host VM is billed per node); 0 for TPUs.
      train, evaluation: the step programs the step model predicts, or None (then `measured_*` or
        `why_not`).
    """

    name: str
    device_kind: str
    num_chips: int
    num_hosts: int
    global_batch: int
    recipe: Recipe
    train: step_model.StepProgram | None = None
    evaluation: step_model.StepProgram | None = None
    eval_steps_per_pass: int = 0
    measured_step_sec: Figure | None = None
    measured_eval_pass_sec: Figure | None = None
    chips_per_node: int = 0
    why_not: str = ""
    num_train_examples: int = IMAGENET_NUM_TRAIN_EXAMPLES

    @property
    def family(self) -> str:
        """"TPU" or "GPU"."""
        return "TPU" if "tpu" in self.device_kind.lower() else "GPU"

    @property
    def epoch_length(self) -> plan_lib.EpochLength:
        """The system's epochs <-> steps converter, as its run's plan has it."""
        return plan_lib.EpochLength(self.num_train_examples, self.global_batch)


def _positive(mapping: Mapping[str, Any], key: str, what: str) -> int:
    """`mapping[key]` as a whole number above 0; ValueError naming the field where it is not."""
    value = mapping.get(key) if isinstance(mapping, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or value != int(value):
        raise ValueError(f"{what}: {key} is {value!r}; expected a whole number above 0")
    return int(value)


REPORT_FIELDS = ("device_kind", "num_chips", "num_devices", "global_batch_size", "flops_per_device",
                 "num_train_examples")


def system_from_report(report: Mapping[str, Any]) -> System:
    """A system from a compile report (`python -m resnet_scaling.compile --json_out`, `aot.CompileReport`).

    Raises:
      ValueError: a report without the fields the planner reads, or with a count (chips, devices, batch,
        examples) that is not a whole number above 0.
    """
    missing = [k for k in REPORT_FIELDS if report.get(k) is None]
    if missing:
        raise ValueError(f"not a compile report: no {', '.join(missing)} (python -m resnet_scaling.compile "
                         "--json_out writes one)")
    for key in ("num_chips", "num_devices", "global_batch_size", "num_train_examples"):
        _positive(report, key, "compile report")
    try:
        train, evaluation = step_model.programs_from_report(report)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"compile report: unreadable collectives or FLOPs ({e!r})") from None
    recipe = Recipe(float(report.get("num_epochs") or CASE_STUDY_RECIPE.num_epochs),
                    float(report.get("eval_every_epochs") or CASE_STUDY_RECIPE.eval_every_epochs),
                    bool(report.get("mlperf_mode")))
    return System(
        name=report.get("system") or report.get("model", "?"), device_kind=report["device_kind"],
        num_chips=int(report["num_chips"]), num_hosts=int(report.get("num_hosts") or 0),
        global_batch=int(report["global_batch_size"]), recipe=recipe, train=train, evaluation=evaluation,
        eval_steps_per_pass=int(report.get("eval_steps_per_pass") or 0),
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
    sections = {k: summary.get(k) for k in ("run", "throughput", "time")}
    if bad := [k for k, v in sections.items() if not isinstance(v, Mapping)]:
        raise ValueError(f"not a run's summary.json: no {', '.join(bad)} section")
    run, throughput, times = sections["run"], sections["throughput"], sections["time"]
    for key in ("devices", "global_batch_size"):
        _positive(run, key, "summary.json run")
    if not isinstance(run.get("device_kind"), str):
        raise ValueError("summary.json run: no device_kind")
    rate = throughput.get("images_per_sec")
    if rate is not None and (not isinstance(rate, (int, float)) or rate <= 0):
        raise ValueError(f"summary.json throughput: images_per_sec is {rate!r}; expected a number above 0")
    config = summary.get("config") or {}
    if mismatches := workload_of(config).mismatches:
        raise WorkloadError(f"not the workload the planner plans ({CASE_STUDY_WORKLOAD}): "
                            f"{'; '.join(mismatches)}; its step time says nothing about ImageNet's.")
    evals = (summary.get("accuracy") or {}).get("num_evals") or 0
    kind = run["device_kind"]
    training = config.get("training", {})
    every = (config.get("mlperf", {}).get("eval_every_epochs") if config.get("mlperf", {}).get("enabled")
             else config.get("eval", {}).get("every_epochs"))
    recipe = Recipe(float(training.get("num_epochs") or CASE_STUDY_RECIPE.num_epochs),
                    float(every or CASE_STUDY_RECIPE.eval_every_epochs),
                    bool(config.get("mlperf", {}).get("enabled")))
    chips = max(1, run["devices"] // hardware.devices_per_chip(kind))
    gpu = "tpu" not in kind.lower()
    processes = int(run.get("process_count") or 0)
    return System(
        name=config.get("system", {}).get("name") or f"{run['devices']} x {kind}", device_kind=kind,
        num_chips=chips, num_hosts=processes, global_batch=int(run["global_batch_size"]), recipe=recipe,
        measured_step_sec=Figure(run["global_batch_size"] / rate, "measured",
                                 "summary.json: steady-state images/sec") if rate else None,
        measured_eval_pass_sec=Figure(times["eval_sec"] / evals, "measured", f"summary.json: {evals} "
                                      "evaluations") if evals and times.get("eval_sec") else None,
        chips_per_node=(chips // max(processes, 1)) if gpu else 0,
        why_not="the summary has no steady-state images/sec" if not rate else "",
        num_train_examples=int(config.get("data", {}).get("num_train_examples")
                               or IMAGENET_NUM_TRAIN_EXAMPLES))


def system_from_plan(name: str, device_kind: str, plan: plan_lib.TrainingPlan, recipe: Recipe,
                     reference_report: Mapping[str, Any] | None = None,
                     gpu_report: Mapping[str, Any] | None = None, *, own_gpu_report: bool = True) -> System:
    """A system from its run's plan: the step model's roofline of a TPU program of the same model
    (`reference_report`, per image, times the system's batch per chip; a TPU slice on the torus its chip
    count gives, `step_model.slice_shape`), or, without a reference, no step (`why_not`). For GPUs, and TPU
    configs that name no topology.

    Args:
      name, device_kind: the config's `system.name` and `system.device_kind`.
      plan: the run's derived plan (`config.plan.derive`, its recipe resolved first).
      recipe: the epochs and evaluations it trains for.
      gpu_report: a GPU compile report (`compile --config=gpu_...`, shipped) whose FLOPs per image and
        collectives replace the scaled program's (`step_model.with_compiled_gpu_step`). HBM bytes stay the
        TPU program's per image (XLA's GPU compiler counts none without a GPU).
      own_gpu_report: `gpu_report` is this config's own: its memory is this batch's, and a batch that
        does not fit the card is not planned (another config's report, of the same generation, says
        nothing of this batch's memory).
    """
    kind = device_kind or "?"
    chips = max(1, plan.num_devices // hardware.devices_per_chip(kind))
    tpu = "tpu" in kind.lower()
    per_node = 0 if tpu else min(chips, GPUS_PER_NODE)
    batch, eval_batch = plan.global_batch_size, plan.batch.eval_global_batch_size
    common = dict(name=name or "?", device_kind=kind, num_chips=chips,
                  num_hosts=math.ceil(chips / (per_node or 4)), global_batch=batch, recipe=recipe,
                  eval_steps_per_pass=plan.eval_steps, chips_per_node=per_node,
                  num_train_examples=plan.num_train_examples)
    if reference_report is None:
        return System(**common, why_not=f"no reference program to scale: the shipped compile report of "
                      f"{REFERENCE_CONFIG} is missing or out of date (python -m resnet_scaling.compile "
                      "--shipped)")
    try:
        train, evaluation = step_model.scaled_programs(kind, chips, per_node, batch / chips, reference_report)
    except ValueError as e:  # A TPU chip count that makes no slices.
        return System(**common, why_not=str(e))
    evaluation = evaluation and dataclasses.replace(
        evaluation, flops_per_chip=evaluation.flops_per_chip * eval_batch / batch,
        bytes_per_chip=evaluation.bytes_per_chip and evaluation.bytes_per_chip * eval_batch / batch)
    if gpu_report is None:
        return System(**common, train=train, evaluation=evaluation)
    memory, card = gpu_report["memory_bytes"]["total"], gpu_report.get("hbm_bytes_per_device")
    if own_gpu_report and card and memory > card:
        return System(**common, why_not=f"the compiled step needs {memory / hardware.GIB:.1f} GiB per GPU, "
                      f"more than the card's {card / hardware.GIB:.0f} GiB: plan a smaller batch per GPU")
    train, evaluation = step_model.with_compiled_gpu_step(train, evaluation, gpu_report, batch / chips)
    return System(**common, train=train, evaluation=evaluation)


@dataclasses.dataclass(frozen=True)
class Bill:
    """What reaching the target costs, in the same terms for every system (US dollars).

    Attributes:
      accelerators_usd_per_hour: chips x price per chip-hour.
      hosts_usd_per_hour: host VMs billed apart from the accelerators (a V100's N1 machines), else 0.
      setup: seconds billed before the clock (`ASSUMED_SETUP_SEC`, the same for every system).
      train_usd, eval_usd, setup_usd: the clock's training, its evaluations and the set-up at both rates.
      total_usd, low_usd, high_usd: their sum and its interval (the time's interval; the set-up's fixed).
    """

    accelerators_usd_per_hour: float
    hosts_usd_per_hour: float
    setup: Figure
    train_usd: float
    eval_usd: float
    setup_usd: float
    total_usd: float
    low_usd: float
    high_usd: float


@dataclasses.dataclass(frozen=True)
class Clock:
    """Seconds to the target, its interval and its cost; None where not predicted.

    `low_sec`/`high_sec` carry the step's interval (and, in MLPerf mode, the reference runs' fewest and most
    epochs); `cost_*` are the bill's total and interval (`bill` has its terms).
    """

    epochs: Figure
    train_sec: float | None
    eval_sec: float | None
    total_sec: float | None
    low_sec: float | None = None
    high_sec: float | None = None
    cost_usd: float | None = None
    cost_low_usd: float | None = None
    cost_high_usd: float | None = None
    bill: Bill | None = None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One system's prediction: the calibrated (or measured) step and what follows from it."""

    system: str
    device_kind: str
    num_chips: int
    num_hosts: int
    global_batch: int
    step_sec: Figure
    step_low_sec: float | None
    step_high_sec: float | None
    raw_step_sec: Figure | None
    images_per_sec: float | None
    scaling_efficiency: Figure | None
    time_to_target: Clock
    raw_time_to_target_sec: float | None
    case_study_sec: float | None
    price: Price | None
    host: HostPrice | None
    host_cores_needed: Figure | None


def epochs_for(system: System) -> tuple[Figure, float, float]:
    """The epochs the system's recipe trains to the target, with a low and high: its own epochs, or in
    MLPerf mode MLPerf's reference runs' mean and their fewest and most.

    Raises:
      ValueError: MLPerf mode at a batch above MLPerf's largest reference (no epochs to the target).
    """
    if not system.recipe.mlperf_mode:
        epochs = system.recipe.num_epochs
        return Figure(epochs, "recipe", f"the config's {epochs:g} epochs"), epochs, epochs
    rcp = convergence.epochs_to_target(system.global_batch)
    low, high = rcp.epoch_range
    return Figure(rcp.epochs, "published", f"MLPerf's reference runs: {rcp.source}"), low, high


def _clock_sec(system: System, epochs: float, step: float, eval_pass: float | None) -> tuple[float, float]:
    """(training, evaluation) seconds for `epochs`: whole steps, rounded up as a run's length is
    (`plan.whole_steps`), and a pass every `eval_every_epochs` (or one at the end)."""
    steps = plan_lib.whole_steps(system.epoch_length.steps(epochs), TRAINING_LENGTH.rounding)
    every = system.recipe.eval_every_epochs
    passes = math.ceil(epochs / every - 1e-6) if every else 1
    return steps * step, passes * (eval_pass or 0.0)


def _eval_pass(system: System, fits: Mapping[tuple[str, str], step_model.Calibration]) -> float | None:
    if system.measured_eval_pass_sec is not None:
        return system.measured_eval_pass_sec.value
    if system.evaluation is None or not system.eval_steps_per_pass:
        return None
    step = step_model.predict_step(system.evaluation, fits).sec
    return None if step is None else step * system.eval_steps_per_pass


def predict(system: System, fits: Mapping[tuple[str, str], step_model.Calibration] | None = None,
            price: Price | None = None, input_images_per_sec_per_core: Figure | None = None,
            epochs_override: Figure | None = None) -> Prediction:
    """The prediction for one system, with the shipped calibrations unless `fits` is given.

    Args:
      epochs_override: epochs instead of the recipe's (a published run's own, to check the step model
        apart from the epochs).

    Raises:
      ValueError: MLPerf mode at a batch above MLPerf's largest reference (no epochs to the target).
    """
    fits = step_model.load_calibrations() if fits is None else fits
    if epochs_override is not None:
        epochs, low_epochs, high_epochs = epochs_override, epochs_override.value, epochs_override.value
    else:
        epochs, low_epochs, high_epochs = epochs_for(system)
    raw = None
    if system.measured_step_sec is not None:
        step = system.measured_step_sec
        low = high = step.value
    elif system.train is not None:
        p = step_model.predict_step(system.train, fits)
        basis = ("not predicted" if p.sec is None else
                 "uncalibrated" if p.calibration and p.calibration.borrowed_from else "calibrated")
        step, low, high = Figure(p.sec, basis, p.note), p.low_sec, p.high_sec
        raw = Figure(p.raw_sec, system.train.base, "the step model without calibration (base + collectives)"
                     ) if p.raw_sec else None
    else:
        step, low, high = Figure(None, "not predicted", system.why_not), None, None
    eval_pass = _eval_pass(system, fits)
    rate = system.global_batch / step.value if step.value else None
    chips_per_node = system.chips_per_node
    host = price.host_for(chips_per_node) if price and chips_per_node else None
    if step.value is not None:
        train, evaluation = _clock_sec(system, epochs.value, step.value, eval_pass)
        total = train + evaluation
        low_total = sum(_clock_sec(system, low_epochs, low, eval_pass and eval_pass * low / step.value))
        high_total = sum(_clock_sec(system, high_epochs, high, eval_pass and eval_pass * high / step.value))
        bill = None if price is None else _bill(system, price, host, train, evaluation, low_total, high_total)
        clock = Clock(epochs, train, evaluation, total, low_total, high_total,
                      bill and bill.total_usd, bill and bill.low_usd, bill and bill.high_usd, bill)
        case_study = _clock_sec(system, recipes.CASE_STUDY_TIMED_EPOCHS, step.value, None)[0]
    else:
        clock, case_study = Clock(epochs, None, None, None), None
    raw_total = None
    if raw is not None:
        raw_eval = None
        if system.evaluation is not None and system.eval_steps_per_pass:
            raw_eval_step = step_model.predict_step(system.evaluation, fits).raw_sec
            raw_eval = raw_eval_step and raw_eval_step * system.eval_steps_per_pass
        raw_total = sum(_clock_sec(system, epochs.value, raw.value, raw_eval))
    cores = None
    if input_images_per_sec_per_core and system.num_hosts and rate:
        per_host = rate / system.num_hosts
        core = input_images_per_sec_per_core
        cores = Figure(per_host / core.value, "derived", f"{per_host:,.0f} images/sec per host at "
                       f"{core.value:,.0f} per core ({core.basis}: {core.note})")
    return Prediction(
        system=system.name, device_kind=system.device_kind, num_chips=system.num_chips,
        num_hosts=system.num_hosts, global_batch=system.global_batch, step_sec=step, step_low_sec=low,
        step_high_sec=high, raw_step_sec=raw, images_per_sec=rate, scaling_efficiency=None,
        time_to_target=clock, raw_time_to_target_sec=raw_total, case_study_sec=case_study,
        price=price, host=host, host_cores_needed=cores)


def _bill(system: System, price: Price, host: HostPrice | None, train_sec: float, eval_sec: float,
          low_sec: float, high_sec: float) -> Bill:
    """The system's bill: every chip and any host VM billed apart, over set-up, training and evaluation."""
    chips = price.usd_per_chip_hour * system.num_chips
    hosts = host.usd_per_hour * system.num_hosts if host else 0.0
    per_sec = (chips + hosts) / 3600
    setup = Figure(ASSUMED_SETUP_SEC, "assumed", "compiling the steps and starting the job on the "
                   "accelerator's hosts, the same for every system")
    setup_usd = setup.value * per_sec
    return Bill(chips, hosts, setup, train_sec * per_sec, eval_sec * per_sec, setup_usd,
                (train_sec + eval_sec) * per_sec + setup_usd, low_sec * per_sec + setup_usd,
                high_sec * per_sec + setup_usd)


def with_scaling_efficiency(predictions: Sequence[Prediction],
                            fits: Mapping[tuple[str, str], step_model.Calibration] | None = None,
                            systems: Sequence[System] = ()) -> list[Prediction]:
    """`predictions` with each one's scaling efficiency: its step without its collectives over its step,
    the same chip at the same batch per chip communicating nothing (a fixed reference: no other row moves
    it). None for a measured row (its collectives are not known apart) or a system without a program.

    Args:
      systems: the systems `predictions` were made of, in the same order.
    """
    fits = step_model.load_calibrations() if fits is None else fits
    out = []
    for p, system in zip(predictions, systems, strict=True):
        efficiency = None
        if system.train is not None and p.step_sec.value and p.step_sec.basis != "measured":
            alone = dataclasses.replace(system.train, collectives=())
            isolated = step_model.predict_step(alone, fits).sec
            if isolated:
                efficiency = Figure(isolated / p.step_sec.value, "derived", "the step without collectives "
                                    "over the step: one chip at the same batch per chip")
        out.append(dataclasses.replace(p, scaling_efficiency=efficiency))
    return out
