"""The case study's report: a Markdown table and charts from run summaries and published figures.

  python benchmarks/case_study.py --summaries RUN1/summary.json RUN2 ... --out_dir /tmp/report
  python benchmarks/case_study.py --prices my_prices.json   # another price table (same shape as PRICES)
  python benchmarks/case_study.py --tpu_v2_chip_images_per_sec 900   # a measured one-chip TPU v2 rate
  python benchmarks/case_study.py --compile_reports /tmp/plan/{tpu_v2_8,tpu_v2_32,pod}.json  # other reports

Rows come from `summary.json` files ("measured": steady-state images/sec, 90 epochs at that rate) and
the case study's published figures ("published"; `docs/case_study.md`). Whatever the case study did not
print says how it was made: images/sec derived from published times, the 8-V100 time derived from "27x
faster", speedups and efficiencies derived from those, costs from assumed prices. Charts: speedup against
chips with the linear line and the scaling predictor's curves (speedup.png); cost per run (cost.png).

Only the case study's workload is compared: ResNet-50 v1.5 at full width (64 filters) on imagenet2012 at
224 px, read from the summary's `config`. Any other summary (the demo's quarter-width ResNet-18 on 32-px
images, another dataset, class folders whose content a summary cannot name) is refused, naming the
fields that differ; with `--allow_other_workloads` it goes into a separate section and chart
(other_workloads.png) labelled with its workload, out of every comparison. ResNet-50 at 224 px on
`synthetic` data is accepted, labelled "measured (synthetic data)": its step does the same work per image
as on ImageNet, so it measures the model's throughput on that hardware without the input pipeline, which
is what the case study's steady-state clock measures when input keeps up. It says nothing of accuracy,
and its scaling efficiency is taken only against other synthetic rows.

The scaling predictor: weak scaling (fixed per-chip batch), step time at N chips = one chip's step time +
the gradient all-reduce over a ring or 2-D torus (bandwidth-latency model, no overlap with compute). It is
not a bound either way: overlap would make a real system faster, and the host, input-pipeline and
framework costs it leaves out make one slower (the published 8-V100 VM: 91% efficiency; predicted: 99%).
No curve takes an input from a point it is compared with. The V100 curve starts from the one-V100 row and
is compared at 8 GPUs. The TPU v2 curve is the planner's (`resnet_scaling.analysis.planning`): the
images/sec of each v2 config's AOT-compiled step by libtpu's own estimate (`python -m
resnet_scaling.compile`; `results/compile/`), uncompensated, at 4, 16, 64, 128 and 256 chips; its 256-chip
value is compared with the published pod, not calibrated on it. With a measured one-chip rate
(--tpu_v2_chip_images_per_sec) it is that rate scaled by the all-reduce model instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resnet_scaling.analysis import hardware, planning

IMAGENET_TRAIN_IMAGES = 1_281_167
MEASURED_EPOCHS = 90  # The case study's clock covers 90 epochs after a 1-epoch warm-up.
RESNET50_PARAMS = 25_557_032
RESULTS = Path(__file__).resolve().parent / "results"
# The v2 configs' compile reports (`python -m resnet_scaling.compile --config=NAME --json_out`): the
# planner's TPU v2 curve, one point per slice.
V2_COMPILE_REPORTS = tuple(RESULTS / "compile" / f"{name}.json"
                           for name in ("tpu_v2_8", "tpu_v2_32", "tpu_v2_128", "tpu_v2_256", "pod"))
CASE_STUDY_WORKLOAD = planning.CASE_STUDY_WORKLOAD
SYNTHETIC = "measured (synthetic data)"
CHIP_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # Where the all-reduce model's curves are evaluated.

# Price per hour, USD: accelerators per chip, VMs per machine. The 2018 list prices the case study used;
# none is confirmed by a price page (docs/case_study.md: "assumed"), so every one says so. Override them
# with --prices.
PRICES: Mapping[str, Mapping[str, tuple[float, str]]] = types.MappingProxyType({
    "accelerators": types.MappingProxyType({
        "V100": (2.48, "assumed: 2018 GCP list, per GPU (docs/case_study.md)"),
        "TPU v2": (1.50, "assumed: full v2 Pod $384/h (docs/case_study.md) / 256 chips"),
    }),
    "vms": types.MappingProxyType({
        "n1-standard-8": (0.38, "assumed: 2018 GCP list, $0.0475 per vCPU-hour x 8"),
        "n1-standard-64": (3.04, "assumed: ~$3.04/h (docs/case_study.md)"),
    }),
})


@dataclasses.dataclass(frozen=True)
class System:
    """One row of the report.

    Attributes:
      name: what to call it ("8x V100 (n1-standard-64)").
      source: "published", "measured" (from a summary.json) or SYNTHETIC.
      accelerator: key of the price table ("V100", "TPU v2") or the device kind.
      chips: accelerator chips (TPU v2/v3 have 2 JAX devices per chip).
      images_per_sec: steady-state training images/sec.
      vm: key of the VM price table, or None when the accelerator price includes the host.
      note: where the figures come from, saying which are derived.
      published_minutes: the published training time, if the time itself was published.
      workload: what was trained (CASE_STUDY_WORKLOAD for the published rows).
    """

    name: str
    source: str
    accelerator: str
    chips: int
    images_per_sec: float
    vm: str | None = None
    note: str = ""
    published_minutes: float | None = None
    workload: str = CASE_STUDY_WORKLOAD

    def minutes_for(self, epochs: float = MEASURED_EPOCHS, images: int = IMAGENET_TRAIN_IMAGES) -> float:
        """Minutes for `epochs` of `images` at this system's rate."""
        return epochs * images / self.images_per_sec / 60


def _from_minutes(minutes: float) -> float:
    return MEASURED_EPOCHS * IMAGENET_TRAIN_IMAGES / (minutes * 60)


# The case study's figures (docs/case_study.md); images/sec derived from the published times over 90 epochs.
PUBLISHED: tuple[System, ...] = (
    System("1x V100 (n1-standard-8)", "published", "V100", 1, _from_minutes(26 * 60), "n1-standard-8",
           "published: more than 26 hours (Google Cloud blog, Dec 2018); images/sec derived from 26 h, an "
           "upper value as the run took longer", 26 * 60),
    System("8x V100 (n1-standard-64)", "published", "V100", 8, _from_minutes(27 * 7.9), "n1-standard-64",
           "time derived: 27 x 7.9 min = 213 min (the pod was \"27x faster\", Google Cloud blog, Dec 2018); "
           "images/sec derived from it"),
    System("Cloud TPU v2 Pod (v2-512)", "published", "TPU v2", 256, _from_minutes(7.9), None,
           "published: 7.9 minutes (Google Cloud blog, Dec 2018); images/sec derived from it", 7.9),
)


def system_from_summary(summary: Mapping[str, Any], name: str | None = None) -> System:
    """A measured row from a `summary.json` (the steady-state images/sec of that run)."""
    run, config = summary["run"], summary.get("config", {})
    kind = run["device_kind"]
    images_per_sec = summary["throughput"]["images_per_sec"]
    if not images_per_sec:
        raise ValueError(f"{name or kind}: the summary has no steady-state images/sec (no timed region).")
    accelerator = next((k for k in ("V100", "TPU v2") if k in kind), kind)
    label = name or config.get("system", {}).get("name") or f"{run['devices']}x {kind}"
    workload = planning.workload_of(config)
    return System(label, SYNTHETIC if workload.synthetic else "measured", accelerator,
                  max(1, run["devices"] // hardware.devices_per_chip(kind)), float(images_per_sec), None,
                  f"measured: summary.json, {run['devices']} devices, batch {run['global_batch_size']}; "
                  "time derived from its steady-state images/sec", None, workload.label)


def load_measured(paths: Sequence[str], allow_other_workloads: bool) -> tuple[list[System], list[System]]:
    """Measured rows of the case study's workload, and those of other workloads (only if allowed).

    Raises:
      WorkloadError: for another workload's summary when not allowed, naming the file and what differs.
    """
    same, other = [], []
    for path in paths:
        file = Path(path) / "summary.json" if Path(path).is_dir() else Path(path)
        summary = json.loads(file.read_text())
        mismatches = planning.workload_of(summary.get("config", {})).mismatches
        if mismatches and not allow_other_workloads:
            raise planning.WorkloadError(
                f"{file}: not the case study's workload ({CASE_STUDY_WORKLOAD}): {'; '.join(mismatches)}. "
                "Its images/sec is not comparable with the V100 and TPU figures. Pass "
                "--allow_other_workloads to report it in a separate section and chart (other_workloads.png), "
                "labelled with its workload.")
        (other if mismatches else same).append(system_from_summary(summary))
    return same, other


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """A bandwidth-latency model of the links an all-reduce runs over.

    Attributes:
      name: for legends.
      bandwidth_bytes_per_sec: bandwidth one ring direction gets per chip.
      latency_sec: per hop of the ring.
      topology: "ring" (all chips in one ring) or "torus2d" (rings along x, then along y).
    """

    name: str
    bandwidth_bytes_per_sec: float
    latency_sec: float
    topology: str = "ring"


# Nominal figures, with their sources. NVLink on an 8-V100 VM: NCCL all-reduce bus bandwidth on a DGX-1V
# class hybrid cube mesh is ~130 GB/s (NVIDIA nccl-tests); TPU v2 ICI: 4 links of 496 Gbit/s per chip
# (Jouppi et al., CACM 2020), two used per torus dimension.
NVLINK_V100 = Interconnect("NVLink ring, 130 GB/s", 130e9, 5e-6, "ring")
ICI_TPU_V2 = Interconnect("ICI 2-D torus, 2 x 62 GB/s", 2 * 62e9, 2e-6, "torus2d")


def allreduce_sec(num_bytes: float, num_chips: int, link: Interconnect) -> float:
    """Time of one all-reduce of `num_bytes` over `num_chips` (reduce-scatter + all-gather)."""
    if num_chips <= 1:
        return 0.0
    if link.topology == "ring":
        n = num_chips
        return 2 * (n - 1) / n * num_bytes / link.bandwidth_bytes_per_sec + 2 * (n - 1) * link.latency_sec
    if link.topology == "torus2d":
        k = math.isqrt(num_chips)
        if k * k != num_chips:  # A k x (N/k) torus: the x ring, then the y ring over 1/k of the data.
            k = 2 ** (int(math.log2(num_chips)) // 2)
        rows, cols = k, num_chips // k
        x = (2 * (cols - 1) / cols * num_bytes / link.bandwidth_bytes_per_sec
             + 2 * (cols - 1) * link.latency_sec)
        y = (2 * (rows - 1) / rows * (num_bytes / cols) / link.bandwidth_bytes_per_sec
             + 2 * (rows - 1) * link.latency_sec)
        return x + y
    raise ValueError(f"Unknown topology {link.topology!r}; use 'ring' or 'torus2d'.")


def predict(one_chip_step_sec: float, gradient_bytes: float, num_chips: int,
            link: Interconnect) -> dict[str, float]:
    """Predicted step time, scaling efficiency and speedup over one chip at `num_chips` (weak scaling).

    Args:
      one_chip_step_sec: one chip's step time at the per-chip batch (measured or from a compiled step).
      gradient_bytes: bytes all-reduced per step (parameters x bytes per gradient element).
      num_chips: chips training together.
      link: the interconnect.
    """
    step = one_chip_step_sec + allreduce_sec(gradient_bytes, num_chips, link)
    efficiency = one_chip_step_sec / step
    return {"num_chips": num_chips, "step_sec": step, "scaling_efficiency": efficiency,
            "speedup": num_chips * efficiency}


@dataclasses.dataclass(frozen=True)
class Curve:
    """One predictor curve: one chip's rate, scaled over an interconnect.

    Attributes:
      name: for legends ("TPU v2, ICI 2-D torus").
      accelerator: the rows it is compared with.
      chip_images_per_sec: one chip's rate, the input it scales.
      chip_basis: where that rate comes from and what it assumes.
      per_chip_batch: images per chip per step.
      link: the interconnect.
      max_chips: the largest system it is drawn for.
      input_system: the row that is an input of the curve (never compared with it), or "".
      gradient_bytes: bytes all-reduced per step (float32 gradients).
      points: (chips, images/sec) where the curve is the planner's compiled steps rather than the
        all-reduce model; chip_images_per_sec is then the smallest point's rate per chip.
    """

    name: str
    accelerator: str
    chip_images_per_sec: float
    chip_basis: str
    per_chip_batch: int
    link: Interconnect
    max_chips: int
    input_system: str = ""
    gradient_bytes: float = 4 * RESNET50_PARAMS
    points: tuple[tuple[int, float], ...] = ()

    def chip_counts(self) -> list[int]:
        """Where the curve is defined: its points, or CHIP_COUNTS up to max_chips."""
        return [n for n, _ in self.points] if self.points else [n for n in CHIP_COUNTS if n <= self.max_chips]

    def at(self, num_chips: int) -> dict[str, float]:
        """Speedup over one chip and scaling efficiency at `num_chips`: the point's, or `predict`'s."""
        if self.points:
            rate = dict(self.points)[num_chips]
            efficiency = rate / (num_chips * self.chip_images_per_sec)
            return {"num_chips": num_chips, "images_per_sec": rate, "scaling_efficiency": efficiency,
                    "speedup": num_chips * efficiency}
        step_sec = self.per_chip_batch / self.chip_images_per_sec
        return predict(step_sec, self.gradient_bytes, num_chips, self.link)


def planner_points(report_paths: Sequence[Path]) -> list[tuple[int, float, int]]:
    """(chips, images/sec, images per chip per step) of each compile report, by the planner's model
    (`planning.predict`: libtpu's estimate, uncompensated), in chip order."""
    points = []
    for path in report_paths:
        report = json.loads(Path(path).read_text())
        if report.get("model") != "resnet50" or not report.get("estimated_step_sec"):
            raise ValueError(f"{path}: not a ResNet-50 compile report with libtpu's step estimate.")
        prediction = planning.predict(planning.system_from_report(report))
        points.append((prediction.num_chips, prediction.images_per_sec,
                       prediction.global_batch // prediction.num_chips))
    return sorted(points)


def build_curves(v100: System, tpu_chip_images_per_sec: float | None = None,
                 report_paths: Sequence[Path] = V2_COMPILE_REPORTS) -> tuple[Curve, Curve]:
    """The predictor's V100 and TPU v2 curves, from inputs none of which is a row they are compared with.

    Args:
      v100: the 1x V100 row: the V100 curve's one chip (and so not compared with it).
      tpu_chip_images_per_sec: a measured one-chip TPU v2 rate, scaled by the all-reduce model; None: the
        planner's compiled v2 slices.
      report_paths: the v2 slices' compile reports.
    """
    how = "derived from its published time" if v100.source == "published" else v100.source
    v100_curve = Curve(f"V100, {NVLINK_V100.name}", "V100", v100.images_per_sec,
                       f"the {v100.name} row ({how})", 312, NVLINK_V100, 8, v100.name)
    if tpu_chip_images_per_sec is not None:
        return v100_curve, Curve(f"TPU v2, {ICI_TPU_V2.name}", "TPU v2", tpu_chip_images_per_sec,
                                 "measured on one chip (--tpu_v2_chip_images_per_sec)", 128, ICI_TPU_V2, 256)
    points = planner_points(report_paths)
    chips, rate, per_chip = points[0]
    basis = (f"the planner: libtpu's estimate of each v2 config's compiled step (uncompensated), "
             f"{', '.join(str(n) for n, _, _ in points)} chips; per chip at {chips} chips")
    return v100_curve, Curve("TPU v2, the planner's compiled steps", "TPU v2", rate / chips, basis, per_chip,
                             ICI_TPU_V2, points[-1][0], points=tuple((n, r) for n, r, _ in points))


def cost_per_run(system: System, prices: Mapping[str, Mapping[str, tuple[float, str]]]) -> float | None:
    """USD for 90 epochs at the system's rate, or None if the price table lacks its accelerator or VM."""
    accel = prices["accelerators"].get(system.accelerator)
    vm = prices["vms"].get(system.vm) if system.vm else (0.0, "")
    if accel is None or vm is None:
        return None
    return (system.chips * accel[0] + vm[0]) * system.minutes_for() / 60


def reference_v100(systems: Sequence[System]) -> System:
    """The 1x V100 row speedups are over: the first one-chip V100 row, else the published one."""
    return next((s for s in systems if s.accelerator == "V100" and s.chips == 1), PUBLISHED[0])


def table_rows(systems: Sequence[System], prices: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per system: the report's columns as numbers (None where unknown)."""
    v100 = reference_v100(systems)
    smallest: dict[tuple[str, bool], System] = {}
    for s in sorted(systems, key=lambda s: s.chips):
        # Synthetic rows have no input pipeline: their efficiency is only against other synthetic rows.
        smallest.setdefault((s.accelerator, s.source == SYNTHETIC), s)
    rows = []
    for s in systems:
        ref = smallest[(s.accelerator, s.source == SYNTHETIC)]
        efficiency = (s.images_per_sec / s.chips) / (ref.images_per_sec / ref.chips) if ref is not s else None
        rows.append({"system": s.name, "source": s.source, "accelerator": s.accelerator, "chips": s.chips,
                     "images_per_sec": s.images_per_sec, "minutes_90_epochs": s.minutes_for(),
                     "minutes_basis": "published" if s.published_minutes else "derived",
                     "speedup_over_1x_v100": s.images_per_sec / v100.images_per_sec,
                     "scaling_efficiency": efficiency, "reference": ref.name,
                     "cost_usd": cost_per_run(s, prices), "workload": s.workload, "note": s.note})
    return rows


def other_rows(systems: Sequence[System]) -> list[dict[str, Any]]:
    """Rows of other workloads: what was measured, with no comparison to the case study's figures."""
    return [{"system": s.name, "workload": s.workload, "source": s.source, "chips": s.chips,
             "images_per_sec": s.images_per_sec, "images_per_sec_per_chip": s.images_per_sec / s.chips,
             "note": s.note} for s in systems]


def compare(rows: Sequence[Mapping[str, Any]], curves: Sequence[Curve],
            v100_images_per_sec: float) -> list[dict[str, Any]]:
    """Each curve against every row it covers (same accelerator, in range, not its input row).

    Speedups are over 1x V100 (`v100_images_per_sec`); `gap` is predicted / row - 1; `fitting_*` is the
    one-chip rate that would have put the curve on the row (at its predicted scaling efficiency).
    """
    chips_of = {r["system"]: r["chips"] for r in rows}
    out = []
    for r in rows:
        # The predictor's efficiency is against one chip; a row's only on the same basis.
        row_efficiency = r["scaling_efficiency"] if chips_of.get(r["reference"]) == 1 else None
        for c in curves:
            if (c.accelerator != r["accelerator"] or r["chips"] not in c.chip_counts()
                    or r["system"] == c.input_system):
                continue
            p = c.at(r["chips"])
            predicted = p["speedup"] * c.chip_images_per_sec / v100_images_per_sec
            fit = r["images_per_sec"] / r["chips"] / p["scaling_efficiency"]
            out.append({"system": r["system"], "source": r["source"], "chips": r["chips"], "curve": c.name,
                        "predicted_speedup": predicted, "row_speedup": r["speedup_over_1x_v100"],
                        "gap": predicted / r["speedup_over_1x_v100"] - 1,
                        "predicted_scaling_efficiency": p["scaling_efficiency"],
                        "row_scaling_efficiency": row_efficiency,
                        "curve_chip_images_per_sec": c.chip_images_per_sec,
                        "fitting_chip_images_per_sec": fit})
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _main_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    def duration(minutes: float) -> str:
        return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.1f} h"

    lines = [f"## {CASE_STUDY_WORKLOAD}: the case study's workload", "",
             "| system | source | chips | images/sec | 90 epochs | speedup over 1x V100 (derived) "
             "| scaling efficiency (derived) | cost per run (assumed prices) |", "|" + "---|" * 8]
    for r in rows:
        how = "derived" if r["source"] == "published" else "measured"
        efficiency = r["scaling_efficiency"]
        eff = "—" if efficiency is None else f"{efficiency:.0%} (vs {r['reference']})"
        cost = "—" if r["cost_usd"] is None else f"${r['cost_usd']:,.0f}"
        lines.append(f"| {r['system']} | {r['source']} | {r['chips']} | {r['images_per_sec']:,.0f} ({how}) "
                     f"| {duration(r['minutes_90_epochs'])} ({r['minutes_basis']}) "
                     f"| {r['speedup_over_1x_v100']:.1f}x | {eff} | {cost} |")
    notes = [f"- {r['system']}: {r['note']}." for r in rows]
    return lines + ["", "Where each row's figures come from:", *notes,
                    "- Speedups and efficiencies are ratios of the images/sec above; cost per run = (chips x "
                    "accelerator price + VM price) x time for 90 epochs, at the assumed prices below."]


def _predictor_section(curves: Sequence[Curve], comparisons: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["", "## Scaling predictor: predicted vs the table's figures", "",
             "The all-reduce model: step time at N chips = one chip's step time + a ring or 2-D torus "
             f"all-reduce of the float32 gradients ({4 * RESNET50_PARAMS / 1e6:.0f} MB); bandwidth-latency, "
             "no overlap with compute. The planner's curve: images/sec of each config's AOT-compiled step "
             "by libtpu's estimate, uncompensated. Neither has host or input-pipeline costs: models, not "
             "bounds either way. No curve takes an input from a row it is compared with. Per chip:", "",
             *(f"- {c.name}: {c.chip_images_per_sec:,.0f} images/sec = {c.chip_basis}; batch "
               f"{c.per_chip_batch} per chip."
               for c in curves),
             "", "| system | source | chips | predicted speedup over 1x V100 | speedup from its figures "
             "(derived) | gap | predicted efficiency vs 1 chip (the planner's: vs its smallest slice) | "
             "efficiency vs 1 chip from its figures "
             "(derived) |", "|" + "---|" * 8]
    lines += [f"| {c['system']} | {c['source']} | {c['chips']} | {c['predicted_speedup']:.2f}x "
              f"| {c['row_speedup']:.2f}x | {c['gap']:+.1%} | {_pct(c['predicted_scaling_efficiency'])} "
              f"| {_pct(c['row_scaling_efficiency'])} |" for c in comparisons]
    lines.append("")
    for c in comparisons:
        verdict = "disagree" if abs(c["gap"]) >= 0.05 else "agree within 5%"
        effs = ("" if c["row_scaling_efficiency"] is None else f" ({_pct(c['predicted_scaling_efficiency'])} "
                f"efficiency; {c['source']}: {_pct(c['row_scaling_efficiency'])})")
        lines.append(f"- {c['system']}: predictor and {c['source']} figures {verdict}: predicted "
                     f"{c['predicted_speedup']:.2f}x over 1x V100, {c['source']} {c['row_speedup']:.2f}x "
                     f"(derived), {c['gap']:+.1%}{effs}. The curve starts from "
                     f"{c['curve_chip_images_per_sec']:,.0f} images/sec per chip; "
                     f"{c['fitting_chip_images_per_sec']:,.0f} would put it on this row "
                     "(derived).")
    by_name = {c["system"]: c for c in comparisons}
    gpus, pod = (by_name.get(s.name) for s in PUBLISHED[1:3])
    if gpus and pod:
        predicted, published = (pod[k] / gpus[k] for k in ("predicted_speedup", "row_speedup"))
        lines.append(f"- Pod over 8x V100: predicted {predicted:.1f}x, published {published:.1f}x.")
    return lines


def _other_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return ["", "## Other workloads: not the case study's, not comparable with the rows above", "",
            "Reported because --allow_other_workloads was given; none enters the speedups, efficiencies, "
            "costs or predictor comparisons above.", "",
            "| system | workload | source | chips | images/sec | images/sec per chip |", "|" + "---|" * 6,
            *(f"| {r['system']} | {r['workload']} | {r['source']} | {r['chips']} "
              f"| {r['images_per_sec']:,.1f} | {r['images_per_sec_per_chip']:,.1f} |" for r in rows)]


def markdown(rows: Sequence[Mapping[str, Any]], prices: Mapping[str, Any], curves: Sequence[Curve] = (),
             comparisons: Sequence[Mapping[str, Any]] = (), others: Sequence[Mapping[str, Any]] = ()) -> str:
    """The case study's table with its sources, the predictor against it, the prices, other workloads."""
    lines = _main_table(rows) + (_predictor_section(curves, comparisons) if curves else [])
    lines += ["", "## Prices", "", "| price | USD/hour | source |", "|---|---|---|"]
    for group, unit in (("accelerators", "per chip"), ("vms", "per VM")):
        lines += [f"| {key} ({unit}) | {usd:.2f} | {why} |" for key, (usd, why) in prices[group].items()]
    return "\n".join(lines + (_other_section(others) if others else [])) + "\n"


def _speedup_chart(plt: Any, rows: Sequence[Mapping[str, Any]], curves: Sequence[Curve], v100_rate: float,
                   path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    ax.plot(CHIP_COUNTS, CHIP_COUNTS, "k--", lw=1, label="linear scaling from 1x V100")
    for i, c in enumerate(curves):
        counts = c.chip_counts()
        label = textwrap.fill(f"predicted, {c.name}; one chip: {c.chip_images_per_sec:,.0f} images/sec = "
                              f"{c.chip_basis}", 100, subsequent_indent="  ", break_on_hyphens=False)
        ax.plot(counts, [c.at(n)["speedup"] * c.chip_images_per_sec / v100_rate for n in counts], lw=1.5,
                color=f"C{2 + i}", label=label)  # Colours apart from the markers' (C0, C1, C4).
    styles = (("published", "o", "C0", "published (images/sec derived from the published times)"),
              ("measured", "s", "C1", "measured (summary.json)"), (SYNTHETIC, "^", "C4", SYNTHETIC))
    for source, marker, color, label in styles:
        pts = [r for r in rows if r["source"] == source]
        if pts:
            ax.scatter([r["chips"] for r in pts], [r["speedup_over_1x_v100"] for r in pts], marker=marker,
                       s=40, color=color, label=label, zorder=3)
        for r in pts:  # Right-hand labels go up and left: inside the axes, clear of the linear line.
            right = r["chips"] > 32
            ax.annotate(r["system"], (r["chips"], r["speedup_over_1x_v100"]), fontsize=8,
                        xytext=(-45, 12) if right else (8, -10), textcoords="offset points",
                        ha="right" if right else "left",
                        arrowprops={"arrowstyle": "-", "lw": 0.5} if right else None)
    ticks = [1, 2, 5, 10, 20, 50, 100, 200]
    ax.set(xscale="log", yscale="log", xlabel="chips", ylabel="speedup over 1x V100 (derived)")
    ax.set_xticks(CHIP_COUNTS, [str(n) for n in CHIP_COUNTS])
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_title(f"Training speedup over 1x V100: {CASE_STUDY_WORKLOAD}", fontsize=11)
    ax.grid(alpha=0.3)
    # Below the axes: the curves' labels say what they assume, too long to sit on the data.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _cost_chart(plt: Any, rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    priced = [r for r in rows if r["cost_usd"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(priced) + 1.5))
    bars = ax.barh([f"{r['system']} [{r['source']}]" for r in priced], [r["cost_usd"] for r in priced])
    ax.bar_label(bars, labels=[f"${r['cost_usd']:,.0f}" for r in priced], padding=3, fontsize=9)
    ax.invert_yaxis()  # The table's order, top to bottom.
    ax.set_xlim(0, 1.15 * max((r["cost_usd"] for r in priced), default=1))
    ax.set_xlabel("USD per 90-epoch run = (chips x price + VM) x time\n(times published or derived from "
                  "published figures; prices assumed: 2018 list)", fontsize=9)
    ax.set_title(f"Cost per run, {CASE_STUDY_WORKLOAD}", fontsize=11)
    ax.tick_params(axis="y", labelsize=9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _other_chart(plt: Any, others: Sequence[Mapping[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 0.7 * len(others) + 1.5))
    bars = ax.barh([f"{r['system']}\n{r['workload']}" for r in others], [r["images_per_sec"] for r in others],
                   color="tab:gray")
    ax.bar_label(bars, labels=[f"{r['images_per_sec']:,.1f}" for r in others], padding=3, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(r["images_per_sec"] for r in others))
    ax.set_xlabel("images/sec (measured)", fontsize=9)
    ax.set_title("Other workloads: not ResNet-50 v1.5 on imagenet2012 at 224 px;\n"
                 "not comparable with the case study's figures", fontsize=11)
    ax.tick_params(axis="y", labelsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot(rows: Sequence[Mapping[str, Any]], out_dir: Path, curves: Sequence[Curve] = (),
         others: Sequence[Mapping[str, Any]] = (), v100_images_per_sec: float | None = None) -> list[Path]:
    """speedup.png and cost.png for the case study's workload; other_workloads.png when there are others."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: the charts need matplotlib: pip install -e '.[benchmarks]'") from None

    matplotlib.use("Agg")  # No display: write files only.
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "speedup.png", out_dir / "cost.png"]
    _speedup_chart(plt, rows, curves, v100_images_per_sec or PUBLISHED[0].images_per_sec, paths[0])
    _cost_chart(plt, rows, paths[1])
    other_png = out_dir / "other_workloads.png"
    other_png.unlink(missing_ok=True)  # One left by an earlier run would look like this run's.
    if others:
        _other_chart(plt, others, other_png)
        paths.append(other_png)
    return paths


def load_prices(path: str | None) -> Mapping[str, Mapping[str, tuple[float, str]]]:
    """The default price table, or one from a JSON file {"accelerators": {k: [usd, source]}, "vms": ...}."""
    if path is None:
        return PRICES
    raw = json.loads(Path(path).read_text())
    return {group: {k: (float(v[0]), str(v[1])) for k, v in raw.get(group, {}).items()}
            for group in ("accelerators", "vms")}


def _parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summaries", nargs="*", default=[], help="summary.json files or workdirs holding one.")
    p.add_argument("--prices", default=None, help="A JSON price table replacing the defaults.")
    p.add_argument("--out_dir", default=str(RESULTS / "case_study"))
    p.add_argument("--no_published", action="store_true", help="Only measured rows.")
    p.add_argument("--allow_other_workloads", action="store_true",
                   help="Report summaries of other workloads in a separate, labelled section and chart "
                        "instead of refusing them.")
    p.add_argument("--tpu_v2_chip_images_per_sec", type=float, default=None,
                   help="A measured one-chip TPU v2 rate for the predictor (default: from FLOPs).")
    p.add_argument("--compile_reports", nargs="*", default=[str(p) for p in V2_COMPILE_REPORTS],
                   help="The TPU v2 slices' compile reports (python -m resnet_scaling.compile --json_out) "
                        "for the planner's curve.")
    return p, p.parse_args(argv)


def main(argv: list[str]) -> str:
    """Builds the report; prints and writes the Markdown, JSON and charts; returns the Markdown."""
    p, args = _parse_args(argv)
    measured_rate = args.tpu_v2_chip_images_per_sec
    if measured_rate is not None and measured_rate <= 0:
        p.error("--tpu_v2_chip_images_per_sec must be positive.")
    try:
        measured, others = load_measured(args.summaries, args.allow_other_workloads)
    except planning.WorkloadError as e:
        p.error(str(e))
    systems = [*(() if args.no_published else PUBLISHED), *measured]
    if not systems:
        p.error("Nothing to report: pass --summaries of the case study's workload or drop --no_published.")
    prices = load_prices(args.prices)
    rows = table_rows(systems, prices)
    v100 = reference_v100(systems)
    try:
        curves = build_curves(v100, args.tpu_v2_chip_images_per_sec, [Path(r) for r in args.compile_reports])
    except (OSError, ValueError) as e:
        p.error(f"--compile_reports: {e}")
    comparisons = compare(rows, curves, v100.images_per_sec)
    extra = other_rows(others)
    text = markdown(rows, prices, curves, comparisons, extra)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "case_study.md").write_text(text)
    points = {c.name: [c.at(n) for n in c.chip_counts()] for c in curves}
    predictor = {"curves": [{**dataclasses.asdict(c), "points": points[c.name]} for c in curves],
                 "comparisons": comparisons}
    report = {"case_study": rows, "predictor": predictor, "other_workloads": extra}
    (out_dir / "case_study.json").write_text(json.dumps(report, indent=2) + "\n")
    paths = plot(rows, out_dir, curves, extra, v100.images_per_sec)
    print(text)
    print(f"Wrote {out_dir}/case_study.md, case_study.json, {', '.join(path.name for path in paths)}")
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
