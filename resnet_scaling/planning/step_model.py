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
  leave-one-out errors (each point predicted by the same procedure run without it, clamps included), which
  set each prediction's interval.

A generation with 1 or 2 published points fits `a` alone (with the `b` of the fit it would borrow); its
interval is how that borrowed fit misses its points. A generation without a published point borrows a fitted
one's (a, b) and says so: "uncalibrated", its interval the worst miss measured by predicting each calibrated
generation of its family (TPU or GPU) with the fit it would borrow (`Calibration.borrow_interval`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from resnet_scaling.job import hardware

CALIBRATION_PATH = pathlib.Path(__file__).with_name("step_calibration.json")
COMPILED, ROOFLINE = "compiled", "roofline"

# Seconds per ring step of a collective, by link: no published figure for any of them, so these are
# assumptions (within a few microseconds of what NCCL and XLA's collectives report for small messages), and
# `b` absorbs their error on the systems a fit covers.
# What a GPU generation's fit rests on (benchmarks/published_results.json), and what it does not.
GPU_FIT_NOTE = (" (NVIDIA's MLPerf submissions, MXNet + DALI; this library's own GPU step is unmeasured "
                "until a GPU run: benchmarks/gpu_check.sh)")
LINK_LATENCY_SEC = {"ici": 1e-6, "dcn": 10e-6, "nvlink": 2e-6, "infiniband": 5e-6}

# Where a generation without published points takes its (a, b) from: the same compiler on an earlier chip
# (libtpu's estimate), the nearest chip with a roofline fit.
BORROWS = {("TPU v2", COMPILED): ("TPU v3", COMPILED), ("TPU v5p", COMPILED): ("TPU v3", COMPILED),
           ("TPU v5e", ROOFLINE): ("TPU v4", ROOFLINE), ("TPU v6e", ROOFLINE): ("TPU v4", ROOFLINE),
           ("TPU v5p", ROOFLINE): ("TPU v4", ROOFLINE), ("TPU v4", ROOFLINE): ("TPU v3", ROOFLINE),
           ("H200", ROOFLINE): ("H100", ROOFLINE), ("H100", ROOFLINE): ("A100", ROOFLINE),
           ("A100", ROOFLINE): ("V100", ROOFLINE)}
# The interval where nothing measured can say (no fit to borrow, or no measured borrowing): an assumption,
# labelled as such wherever it is used.
ASSUMED_INTERVAL = 0.25
MIN_INTERVAL = 0.05
# The largest slice of each TPU generation, in chips (Cloud TPU's documented maximum slices: v2-512, v3-2048,
# v4-8192, v5p-17920 count cores, 2 a chip; v5e-256 and v6e-256 count chips); beyond it, slices over DCN.
MAX_SLICE_CHIPS = {"TPU v2": 256, "TPU v3": 1024, "TPU v4": 4096, "TPU v5p": 8960, "TPU v5e": 256,
                   "TPU v6e": 256}
# Generations whose slices are 3-D tori (the others' are 2-D).
TORUS_3D = ("TPU v4", "TPU v5p")


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
            raise ValueError(f"no published figures for {self.device_kind!r} (job/hardware.py)")
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


def _torus_dims(chips: int, rank: int) -> tuple[int, ...]:
    """`chips` as `rank` dimensions, as even as the factors allow, smallest first (64 -> (4, 4, 4) or
    (8, 8); 128 -> (4, 4, 8) or (8, 16))."""
    factors, n, f = [], chips, 2
    while n > 1:
        while n % f == 0:
            factors.append(f)
            n //= f
        f += 1
    dims = [1] * rank
    for factor in sorted(factors, reverse=True):
        dims[dims.index(min(dims))] *= factor
    return tuple(sorted(dims))


def slice_shape(generation: str, num_chips: int) -> tuple[tuple[int, ...], int]:
    """(chips per torus dimension of one slice, slices) of a TPU system given only its chip count: one
    slice up to the generation's largest (`MAX_SLICE_CHIPS`), else equal slices of that size over DCN; 3-D
    tori for v4 and v5p, 2-D for the others.

    Raises:
      ValueError: a chip count that is not a whole number of the largest slices.
    """
    largest = MAX_SLICE_CHIPS.get(generation, num_chips)
    slices = max(1, math.ceil(num_chips / largest))
    if num_chips % slices:
        raise ValueError(f"{num_chips} {generation} chips: more than its largest slice ({largest}) and not a "
                         "whole number of equal slices")
    return _torus_dims(num_chips // slices, 3 if generation in TORUS_3D else 2), slices


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
      interval: relative half-width of a prediction's interval: the largest leave-one-out error (3 or more
        points), how the borrowed fit misses the points (1 or 2), or, borrowed, `borrow_interval`.
      points: the published results fitted on; empty where borrowed.
      loo_errors: each point's error predicted by the same fit run without it.
      borrowed_from: the generation whose fit this is, for a generation with no published point.
      borrow_interval: the interval a generation borrowing this fit gets: the worst miss measured by
        borrowing whole generations of this family (`borrow_basis` says which); 0 where not measured.
    """

    generation: str
    base: str
    a: float
    b_sec: float
    interval: float
    points: tuple[str, ...] = ()
    loo_errors: tuple[float, ...] = ()
    borrowed_from: str = ""
    borrow_interval: float = 0.0
    borrow_basis: str = ""

    @property
    def label(self) -> str:
        """"calibrated on 8 published points (leave-one-out: at most 11%)" or "uncalibrated: ..."."""
        if self.borrowed_from:
            wide = "; wide" if self.interval > 0.25 else ""
            return (f"uncalibrated: no published {self.generation} point, {self.borrowed_from}'s fit; "
                    f"±{self.interval:.0%}: {self.borrow_basis or 'assumed'}{wide}")
        n = len(self.points)
        how = ("leave-one-out" if n >= 3 else "its borrowed fit's miss") if n else "assumed"
        return f"calibrated on {n} published point{'s' * (n != 1)} (±{self.interval:.0%}: {how})"


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
    fitted: bool = True  # False: predicted and checked, never fitted on (a program scaled, not compiled).

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


def fit(observations: Sequence[Observation], b_fallback: float = 0.0,
        borrowed_fit: Calibration | None = None) -> Calibration:
    """(a, b) for observations of one generation and base, with leave-one-out errors.

    With 3 or more points both are fitted; with fewer, `a` alone (b = `b_fallback`, from the fit it would
    borrow). Each point's leave-one-out error comes from the same procedure run without it: a full fit of
    the rest where 3 or more remain, `a` alone where 1 or 2, `borrowed_fit` where none. The interval is the
    largest leave-one-out error (3 or more points), else the largest miss of `borrowed_fit` on the points
    (`ASSUMED_INTERVAL` without one).

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
        if rest:
            a_i, b_i = _least_squares(rest, None if len(rest) >= 3 else b_fallback)
        elif borrowed_fit is not None:
            a_i, b_i = borrowed_fit.a, borrowed_fit.b_sec
        else:
            continue
        loo.append(left_out.predict(a_i, b_i) / left_out.published_sec_per_epoch - 1)
    if enough:
        interval = max(MIN_INTERVAL, *(abs(e) for e in loo))
    elif borrowed_fit is not None:
        misses = [o.predict(borrowed_fit.a, borrowed_fit.b_sec) / o.published_sec_per_epoch - 1
                  for o in observations]
        interval = max(MIN_INTERVAL, *(abs(e) for e in misses + loo))
    else:
        interval = ASSUMED_INTERVAL
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
                               interval=own.borrow_interval or ASSUMED_INTERVAL,
                               borrowed_from=f"{source[0]} ({source[1]})")


def load_calibrations(path: str | pathlib.Path = CALIBRATION_PATH) -> dict[tuple[str, str], Calibration]:
    """The shipped fits (`step_calibration.json`), by (generation, base)."""
    data = json.loads(pathlib.Path(path).read_text())
    fits = {}
    for f in data["fits"]:
        c = Calibration(f["generation"], f["base"], f["a"], f["b_sec"], f["interval"], tuple(f["points"]),
                        tuple(f["loo_errors"]), borrow_interval=f.get("borrow_interval", 0.0),
                        borrow_basis=f.get("borrow_basis", ""))
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
                          f"collectives; {calibration.label}{GPU_FIT_NOTE if program.chips_per_node else ''}")


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


def with_compiled_gpu_step(train: StepProgram, evaluation: StepProgram | None, gpu_report: Mapping[str, Any],
                           per_chip_batch: float) -> tuple[StepProgram, StepProgram | None]:
    """`scaled_programs`' GPU programs with what this library's step compiled for the card shows
    (`gpu_report`, `compile --config=gpu_...`): its FLOPs per image times the batch per GPU, and its
    collectives (the gradients' all-reduces and the small ones: BN statistics, metrics) over the node's
    GPUs; the all-reduce across nodes stays the gradients'. The planner's GPU rows and the calibration
    (benchmarks/planner_checks.py) both model a GPU step this way, so a fit is applied as it was made.
    HBM bytes stay the scaled program's (XLA's GPU compiler counts none without a GPU); the evaluation's
    FLOPs move by the training step's ratio."""
    own_train, _ = programs_from_report(gpu_report)
    per_gpu = gpu_report["global_batch_size"] / gpu_report["num_devices"]
    flops = own_train.flops_per_chip * per_chip_batch / per_gpu
    in_node = max((c.group_chips for c in train.collectives if not c.across), default=1)
    collectives = tuple(dataclasses.replace(c, group_chips=in_node) for c in own_train.collectives
                        if in_node > 1 and not c.across)
    collectives += tuple(c for c in train.collectives if c.across)
    source = (f"this library's step compiled for {gpu_report['num_devices']} x {gpu_report['device_kind']} "
              f"(FLOPs per image x {per_chip_batch:g} images, collectives; HBM bytes from {train.source})")
    ratio = flops / train.flops_per_chip if train.flops_per_chip else 1.0
    train = dataclasses.replace(train, flops_per_chip=flops, collectives=collectives, source=source)
    if evaluation is not None:
        evaluation = dataclasses.replace(evaluation, flops_per_chip=evaluation.flops_per_chip * ratio,
                                         source=source)
    return train, evaluation


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def scaled_programs(device_kind: str, num_chips: int, chips_per_node: int, per_chip_batch: float,
                    reference: Mapping[str, Any], torus: tuple[int, ...] | None = None
                    ) -> tuple[StepProgram, StepProgram | None]:
    """A system's programs scaled from a compile report of the same model on another chip, where its own
    cannot be compiled here (a GPU: no GPU compiler without the GPU; a TPU libtpu fails on, or a slice too
    large to compile): FLOPs and HBM bytes per image times the chip's batch, and the gradients' all-reduce
    over every chip.

    Args:
      chips_per_node: GPUs per node (their NVLink domain; the rest of the all-reduce crosses InfiniBand);
        0 for TPUs: the all-reduce runs over each slice's torus (`torus`, else `slice_shape` of the chip
        count), then across the slices over DCN.
    """
    ref_train, ref_eval = programs_from_report(reference)
    ref_images = reference["global_batch_size"] / reference["num_chips"]
    ref_eval_images = reference.get("eval_global_batch_size", reference["global_batch_size"]) / reference[
        "num_chips"]
    scale, eval_scale = per_chip_batch / ref_images, per_chip_batch / ref_eval_images
    gradients = max((c.bytes_per_chip for c in ref_train.collectives if c.kind == "all-reduce"), default=0.0)
    if chips_per_node:
        in_node, nodes, torus = min(num_chips, chips_per_node), math.ceil(num_chips / chips_per_node), ()
    elif torus:
        in_node, nodes = math.prod(torus), max(1, num_chips // math.prod(torus))
    else:
        spec = hardware.device_spec(device_kind)
        torus, nodes = slice_shape(spec.generation if spec else device_kind, num_chips)
        in_node = math.prod(torus)
    collectives = []
    if in_node > 1:
        collectives.append(CollectiveTraffic("all-reduce", in_node, 1, gradients))
    if nodes > 1:
        collectives.append(CollectiveTraffic("all-reduce", nodes, 1, gradients, across=True))
    where = f" on a {'x'.join(map(str, torus))} torus" + (f" x {nodes} slices" if nodes > 1 else "") \
        if torus else ""
    source = (f"{reference.get('system') or 'a'} TPU program's FLOPs and HBM bytes per image x "
              f"{per_chip_batch:g} images{where}")
    train = StepProgram(device_kind, ref_train.flops_per_chip * scale,
                        _times(ref_train.bytes_per_chip, scale), None, torus, chips_per_node,
                        tuple(collectives), source)
    evaluation = None if ref_eval is None else StepProgram(
        device_kind, ref_eval.flops_per_chip * eval_scale, _times(ref_eval.bytes_per_chip, eval_scale), None,
        torus, chips_per_node, (), source)
    return train, evaluation
