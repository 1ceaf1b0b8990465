"""Seconds per training step on hardware this machine does not have: a compiled step, calibrated per chip
generation on published results.

    step = a * base + b + collectives

- **base**, one step of the compiled program on one chip: libtpu's estimate (`optimal_seconds`, "compiled")
  where it gives one (TPU v2, v3, v5p), else the program's **roofline** ("roofline"): its FLOPs at the
  chip's peak plus its HBM bytes at the chip's bandwidth (no overlap: XLA's totals say nothing of which
  ops hide which), from the compile report or, for a GPU, from a TPU program of the same model.
- **collectives**, costed per operation from the program's collectives and where they run: a ring's steps
  times a latency per step, plus the bytes each chip sends over its link's bandwidth (`hardware.DeviceSpec`:
  ICI inside a TPU slice and DCN between slices; NVLink inside a GPU node and InfiniBand between nodes).
- **a, b**, fitted per generation and base on published MLPerf results by least squares on the relative
  error of seconds per epoch on MLPerf's clock (`fit`); `a` absorbs how far real software is from the
  estimate, `b` the fixed cost of a step (dispatch, infeed, the clock's share of start-up). The shipped fits
  (`step_calibration.json`, written by `benchmarks/planner_checks.py --write_calibration`) carry their
  leave-one-out errors, which set each prediction's interval.

A generation without a published point borrows a fitted one's (a, b) and says so: "uncalibrated".
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from resnet_scaling.metrics import hardware

CALIBRATION_PATH = pathlib.Path(__file__).with_name("step_calibration.json")
COMPILED, ROOFLINE = "compiled", "roofline"

# Seconds per ring step of a collective, by link: no published figure for any of them, so these are
# assumptions (within a few microseconds of what NCCL and XLA's collectives report for small messages), and
# `b` absorbs their error on the systems a fit covers.
LINK_LATENCY_SEC = {"ici": 1e-6, "dcn": 10e-6, "nvlink": 2e-6, "infiniband": 5e-6}

# Where a generation without published points takes its (a, b) from: the same compiler on an earlier chip
# (libtpu's estimate), the nearest chip with a roofline fit.
BORROWS = {("TPU v2", COMPILED): ("TPU v3", COMPILED), ("TPU v5p", COMPILED): ("TPU v3", COMPILED),
           ("TPU v5e", ROOFLINE): ("TPU v4", ROOFLINE), ("TPU v6e", ROOFLINE): ("TPU v4", ROOFLINE),
           ("TPU v5p", ROOFLINE): ("TPU v4", ROOFLINE), ("TPU v4", ROOFLINE): ("TPU v3", ROOFLINE),
           ("H200", ROOFLINE): ("H100", ROOFLINE), ("H100", ROOFLINE): ("A100", ROOFLINE),
           ("A100", ROOFLINE): ("V100", ROOFLINE)}
# Intervals where leave-one-out cannot say: fewer than 3 published points, or none (borrowed). Assumed.
FEW_POINTS_INTERVAL = 0.25
MIN_INTERVAL = 0.05


@dataclasses.dataclass(frozen=True)
class CollectiveTraffic:
    """Collective operations of one kind, group and network in a step, per chip: what the model costs.

    Not `hlo.Collective` (one instruction of a compiled program, in devices): a compile report's rows of
    those by group (`collectives_by_group`) in chips, or the gradients' all-reduce a scaled program assumes.
    """

    kind: str  # "all-reduce", "reduce-scatter", "all-gather", ...
    group_chips: int
    count: int
    bytes_per_chip: float
    across: bool = False  # Between TPU slices (DCN) or GPU nodes (InfiniBand).


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """What the model reads of one compiled step on one chip."""

    device_kind: str
    flops_per_chip: float
    bytes_per_chip: float | None
    compiled_sec: float | None  # libtpu's estimate, where it gives one.
    torus: tuple[int, ...] = ()  # A TPU slice's chips per dimension; () for GPUs.
    chips_per_node: int = 0  # GPUs per node (their NVLink domain); 0 for TPUs.
    collectives: tuple[CollectiveTraffic, ...] = ()
    source: str = ""

    @property
    def spec(self) -> hardware.DeviceSpec:
        spec = hardware.device_spec(self.device_kind)
        if spec is None or not spec.generation:
            raise ValueError(f"no published figures for {self.device_kind!r} (metrics/hardware.py)")
        return spec

    @property
    def base(self) -> str:
        return COMPILED if self.compiled_sec else ROOFLINE


def roofline_sec(program: StepProgram) -> float | None:
    """FLOPs at peak plus HBM bytes at bandwidth, on one chip; None without the bytes."""
    spec = program.spec
    if program.bytes_per_chip is None or not spec.hbm_bytes_per_sec_per_chip:
        return None
    return (program.flops_per_chip / spec.peak_flops_per_chip
            + program.bytes_per_chip / spec.hbm_bytes_per_sec_per_chip)


def base_sec(program: StepProgram) -> float | None:
    """libtpu's estimate where it gives one, else the roofline."""
    return program.compiled_sec or roofline_sec(program)


def _torus_steps(group_chips: int, torus: Sequence[int]) -> int:
    """Ring steps of an all-reduce over `group_chips` neighbouring chips of a torus: a bidirectional ring
    per dimension the group spans, filled dimension by dimension (2 x (n - 1) steps for n chips along one)."""
    steps, left = 0, group_chips
    for size in torus or (group_chips,):
        along = math.gcd(left, size) if left > 1 else 1
        steps += 2 * (along - 1)
        left //= along
    return steps + 2 * (left - 1) if left > 1 else steps


def collective_sec(program: StepProgram) -> float:
    """The program's collectives: ring steps x latency plus bytes over the link's bandwidth, per chip."""
    spec, total = program.spec, 0.0
    for c in program.collectives:
        n = max(c.group_chips, 1)
        if n == 1:
            continue  # Inside one chip (the two cores of a v2 or v3 chip): no link.
        share = (2.0 if c.kind == "all-reduce" else 1.0) * (n - 1) / n
        gpu = program.chips_per_node > 0
        if c.across:
            link = "infiniband" if gpu else "dcn"
            steps = 2 * math.ceil(math.log2(n)) if gpu else 2 * (n - 1)
            bandwidth = spec.network_bytes_per_sec_per_chip
            if gpu:  # Reduced inside the node first: each GPU sends its 1/gpus_per_node share across.
                share /= program.chips_per_node
        else:
            link = "nvlink" if gpu else "ici"
            steps = 2 * (n - 1) if gpu else _torus_steps(n, program.torus)
            bandwidth = spec.link_bytes_per_sec_per_chip
        total += c.count * steps * LINK_LATENCY_SEC[link] + share * c.bytes_per_chip / bandwidth
    return total


@dataclasses.dataclass(frozen=True)
class Calibration:
    """(a, b) of one generation and base, and how far to trust them.

    Attributes:
      interval: relative half-width of a prediction's interval (the largest leave-one-out error, or an
        assumed width where there are too few points).
      points: the published results fitted on; empty where borrowed.
      borrowed_from: the generation whose fit this is, for a generation with no published point.
    """

    generation: str
    base: str
    a: float
    b_sec: float
    interval: float
    points: tuple[str, ...] = ()
    loo_errors: tuple[float, ...] = ()
    borrowed_from: str = ""

    @property
    def label(self) -> str:
        """"calibrated on 8 published points" or "uncalibrated: TPU v3's fit"."""
        if self.borrowed_from:
            return f"uncalibrated: no published {self.generation} point, {self.borrowed_from}'s fit"
        n = len(self.points)
        return f"calibrated on {n} published point{'s' * (n != 1)}"


@dataclasses.dataclass(frozen=True)
class Observation:
    """A published run reduced to what the fit needs: its steps per epoch and their programs.

    MLPerf's clock per epoch = train steps x (a base + b + collectives) + evaluation steps x (the same for
    the evaluation program), evaluation steps being a pass's steps over the epochs between evaluations.
    Both are unrounded averages per training epoch (`plan.EpochLength.exact_steps_per_epoch`).
    """

    name: str
    train: StepProgram
    eval: StepProgram | None
    exact_train_steps_per_epoch: float
    exact_eval_steps_per_epoch: float
    published_sec_per_epoch: float
    num_chips: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return self.train.spec.generation, self.train.base

    def terms(self) -> tuple[float, float, float]:
        """(x_a, x_b, fixed): seconds per epoch = a x_a + b x_b + fixed."""
        s, e = self.exact_train_steps_per_epoch, self.exact_eval_steps_per_epoch if self.eval else 0.0
        x_a = s * base_sec(self.train) + (e * base_sec(self.eval) if self.eval else 0.0)
        fixed = s * collective_sec(self.train) + (e * collective_sec(self.eval) if self.eval else 0.0)
        return x_a, s + e, fixed

    def predict(self, a: float, b: float) -> float:
        x_a, x_b, fixed = self.terms()
        return a * x_a + b * x_b + fixed


def _least_squares(observations: Sequence[Observation], b_fixed: float | None) -> tuple[float, float]:
    """(a, b) minimising the squared relative error; b >= 0; `b_fixed` fits a alone."""
    rows = []
    for o in observations:
        x_a, x_b, fixed = o.terms()
        y = o.published_sec_per_epoch
        rows.append((x_a / y, x_b / y, (y - fixed) / y))
    if b_fixed is None:
        saa = sum(r[0] * r[0] for r in rows)
        sab = sum(r[0] * r[1] for r in rows)
        sbb = sum(r[1] * r[1] for r in rows)
        say = sum(r[0] * r[2] for r in rows)
        sby = sum(r[1] * r[2] for r in rows)
        det = saa * sbb - sab * sab
        if det > 0:
            a, b = (say * sbb - sby * sab) / det, (saa * sby - sab * say) / det
            if b >= 0:
                return a, b
        b_fixed = 0.0
    a = sum(r[0] * (r[2] - b_fixed * r[1]) for r in rows) / sum(r[0] * r[0] for r in rows)
    return a, b_fixed


def fit(observations: Sequence[Observation], b_fallback: float = 0.0) -> Calibration:
    """(a, b) for observations of one generation and base, with leave-one-out errors.

    With 3 or more points both are fitted and the interval is the largest leave-one-out error; with fewer,
    `a` alone (b = `b_fallback`, from a generation with enough points) and an assumed interval.

    Raises:
      ValueError: no observations, or observations of several generations or bases.
    """
    keys = {o.key for o in observations}
    if len(keys) != 1:
        raise ValueError(f"fit one generation and base at a time, not {sorted(keys) or 'none'}")
    (generation, base), = keys
    enough = len(observations) >= 3
    a, b = _least_squares(observations, None if enough else b_fallback)
    loo = []
    for i, left_out in enumerate(observations):
        rest = [o for j, o in enumerate(observations) if j != i]
        if not rest:
            break
        a_i, b_i = _least_squares(rest, None if len(rest) >= 3 else b)
        loo.append(left_out.predict(a_i, b_i) / left_out.published_sec_per_epoch - 1)
    worst = max((abs(e) for e in loo), default=0.0)
    interval = max(MIN_INTERVAL, worst) if enough else max(FEW_POINTS_INTERVAL, worst)
    return Calibration(generation, base, a, b, interval, tuple(o.name for o in observations), tuple(loo))


def borrowed(key: tuple[str, str], fits: Mapping[tuple[str, str], Calibration]) -> Calibration | None:
    """The fit for `key`: its own, else one borrowed along `BORROWS` (labelled), else None."""
    if key in fits:
        return fits[key]
    source = BORROWS.get(key)
    seen = {key}
    while source is not None and source not in fits and source not in seen:
        seen.add(source)
        source = BORROWS.get(source)
    if source is None or source not in fits:
        return None
    own = fits[source]
    return dataclasses.replace(own, generation=key[0], base=key[1], points=(), loo_errors=(),
                               interval=max(2 * own.interval, FEW_POINTS_INTERVAL),
                               borrowed_from=f"{source[0]} ({source[1]})")


def load_calibrations(path: str | pathlib.Path = CALIBRATION_PATH) -> dict[tuple[str, str], Calibration]:
    """The shipped fits (`step_calibration.json`), by (generation, base)."""
    data = json.loads(pathlib.Path(path).read_text())
    fits = {}
    for f in data["fits"]:
        c = Calibration(f["generation"], f["base"], f["a"], f["b_sec"], f["interval"], tuple(f["points"]),
                        tuple(f["loo_errors"]))
        fits[(c.generation, c.base)] = c
    return fits


def calibrations_json(fits: Sequence[Calibration], source: str) -> str:
    """The shipped file's text for `fits`."""
    return json.dumps({"source": source, "fits": [dataclasses.asdict(f) for f in fits]}, indent=1) + "\n"


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """One step's seconds: calibrated (with its interval) and the raw model (base + collectives)."""

    sec: float | None
    low_sec: float | None
    high_sec: float | None
    raw_sec: float | None
    calibration: Calibration | None
    note: str


def predict_step(program: StepProgram, fits: Mapping[tuple[str, str], Calibration]) -> StepPrediction:
    """The calibrated step of `program`, or a reason in `note` where the model cannot give one."""
    try:
        generation = program.spec.generation
    except ValueError as e:
        return StepPrediction(None, None, None, None, None, str(e))
    base = base_sec(program)
    if base is None:
        return StepPrediction(None, None, None, None, None, f"no libtpu estimate and no HBM bytes for a "
                              f"roofline of this step on {program.device_kind} (recompile its report)")
    raw = base + collective_sec(program)
    calibration = borrowed((generation, program.base), fits)
    if calibration is None:
        return StepPrediction(None, None, None, raw, None, f"no fit for {generation} ({program.base}) and "
                              "none to borrow")
    sec = calibration.a * base + calibration.b_sec + collective_sec(program)
    what = "libtpu's estimate" if program.base == COMPILED else "roofline"
    return StepPrediction(sec, sec * (1 - calibration.interval), sec * (1 + calibration.interval), raw,
                          calibration, f"{what} x {calibration.a:.3f} + {calibration.b_sec * 1e3:.2f} ms + "
                          f"collectives; {calibration.label}")


def _torus_of(topology: str) -> tuple[int, ...]:
    """(16, 16) from "v2:16x16"; () when not a TPU topology."""
    _, _, dims = topology.partition(":")
    try:
        return tuple(int(d) for d in dims.split("x")) if dims else ()
    except ValueError:
        return ()


def programs_from_report(report: Mapping[str, Any]) -> tuple[StepProgram, StepProgram | None]:
    """The train and evaluation programs of a compile report (`aot.CompileReport` as a dict)."""
    chips, devices = int(report["num_chips"]), int(report["num_devices"])
    per_chip = devices / chips
    kind, topology = report["device_kind"], report.get("topology", "")
    collectives = []
    for row in report.get("collectives_by_group", []):
        collectives.append(CollectiveTraffic(
            kind=row["kind"], group_chips=max(1, round(row["group_size"] / per_chip)),
            count=int(row["count"]), bytes_per_chip=row["num_bytes"] * per_chip,
            across=row.get("slices") == "cross-slice"))
    source = f"the compile report of {report.get('system') or report.get('model')} on {topology}"
    train = StepProgram(kind, report["flops_per_device"] * per_chip,
                        _times(report.get("bytes_accessed_per_device"), per_chip),
                        report.get("estimated_step_sec"), _torus_of(topology), 0, tuple(collectives), source)
    eval_flops = report.get("eval_flops_per_device")
    if not (report.get("estimated_eval_step_sec") or eval_flops):
        return train, None
    evaluation = StepProgram(kind, (eval_flops or 0.0) * per_chip,
                             _times(report.get("eval_bytes_accessed_per_device"), per_chip),
                             report.get("estimated_eval_step_sec"), train.torus, 0, (), source)
    return train, evaluation


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def scaled_programs(device_kind: str, num_chips: int, chips_per_node: int, per_chip_batch: float,
                    reference: Mapping[str, Any]) -> tuple[StepProgram, StepProgram | None]:
    """A system's programs scaled from a compile report of the same model on another chip, where its own
    cannot be compiled here (a GPU: no GPU compiler without the GPU; a TPU libtpu fails on): FLOPs and HBM
    bytes per image times the chip's batch, and the gradients' all-reduce over every chip.

    Args:
      chips_per_node: GPUs per node (their NVLink domain; the rest of the all-reduce crosses InfiniBand);
        0 for a TPU slice (one ring over ICI).
    """
    ref_train, ref_eval = programs_from_report(reference)
    ref_images = reference["global_batch_size"] / reference["num_chips"]
    ref_eval_images = reference.get("eval_global_batch_size", reference["global_batch_size"]) / reference[
        "num_chips"]
    scale, eval_scale = per_chip_batch / ref_images, per_chip_batch / ref_eval_images
    gradients = max((c.bytes_per_chip for c in ref_train.collectives if c.kind == "all-reduce"), default=0.0)
    in_node = min(num_chips, chips_per_node) if chips_per_node else num_chips
    nodes = math.ceil(num_chips / chips_per_node) if chips_per_node else 1
    collectives = []
    if in_node > 1:
        collectives.append(CollectiveTraffic("all-reduce", in_node, 1, gradients))
    if nodes > 1:
        collectives.append(CollectiveTraffic("all-reduce", nodes, 1, gradients, across=True))
    source = (f"{reference.get('system') or 'a'} TPU program's FLOPs and HBM bytes per image x "
              f"{per_chip_batch:g} images")
    train = StepProgram(device_kind, ref_train.flops_per_chip * scale,
                        _times(ref_train.bytes_per_chip, scale), None, (), chips_per_node, tuple(collectives),
                        source)
    evaluation = None if ref_eval is None else StepProgram(
        device_kind, ref_eval.flops_per_chip * eval_scale, _times(ref_eval.bytes_per_chip, eval_scale), None,
        (), chips_per_node, (), source)
    return train, evaluation
