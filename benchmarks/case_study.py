"""The case study's report: a Markdown table and charts from run summaries and published figures.

  python benchmarks/case_study.py --summaries RUN1/summary.json RUN2 ... --out_dir /tmp/report
  python benchmarks/case_study.py --prices my_prices.json   # prices of your own (as planning/prices.json)

Rows come from `summary.json` files ("measured": steady-state images/sec, 90 epochs at that rate) and
the case study's published figures ("published"; `docs/case_study.md`). Whatever the case study did not
print says how it was made: images/sec derived from published times, the 8-V100 time derived from "27x
faster", speedups and efficiencies derived from those, costs at the planner's shipped prices but for the
pod's, which is assumed (`CASE_STUDY_POD_PRICE`). Charts: speedup against
chips with the linear line and the planner's curves (speedup.png); cost per run (cost.png); the planner's
time and cost to 90 epochs per system, log scale (planner.png).

Only the case study's workload is compared: ResNet-50 v1.5 at full width (64 filters) on imagenet2012 at
224 px, read from the summary's `config`. Any other summary (the demo's quarter-width ResNet-18 on 32-px
images, another dataset, class folders whose content a summary cannot name) is refused, naming the
fields that differ; with `--allow_other_workloads` it goes into a separate section and chart
(other_workloads.png) labelled with its workload, out of every comparison. ResNet-50 at 224 px on
`synthetic` data is accepted, labelled "measured (synthetic data)": its step does the same work per image
as on ImageNet, so it measures the model's throughput on that hardware without the input pipeline, which
is what the case study's steady-state clock measures when input keeps up. It says nothing of accuracy,
and its scaling efficiency is taken only against other synthetic rows.

The predictions are the planner's (`resnet_scaling.planning.estimates`, `python -m resnet_scaling.planner`):
the calibrated step of each shipped V100 and TPU v2 config (the V100s from the step model's roofline of the
same ResNet-50 program, calibrated on NVIDIA's published V100 results; the v2 slices from libtpu's estimate
of their compiled steps, with TPU v3's calibration: no published TPU v2 MLPerf result exists), on the case
study's clock (90 epochs, training only). None of them is fitted to the case study's figures, so the three
comparisons the case study draws (the pod against one V100, against 8 V100s, and their costs) are
predictions, each beside the published figure with its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from resnet_scaling.config import IMAGENET_NUM_TRAIN_EXAMPLES
from resnet_scaling.config.recipes import CASE_STUDY_TIMED_EPOCHS
from resnet_scaling.job import hardware
from resnet_scaling.planning import estimates as planning
from resnet_scaling.planning import step_model

RESNET50_PARAMS = 25_557_032
RESULTS = Path(__file__).resolve().parent / "results"
# The shipped configs the planner predicts for each accelerator the case study compares: one curve each.
PLANNED_CONFIGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "V100": ("gpu_v100", "gpu_v100x8"),
    "TPU v2": ("tpu_v2_8", "tpu_v2_32", "tpu_v2_128", "tpu_v2_256", "pod"),
})
CASE_STUDY_WORKLOAD = planning.CASE_STUDY_WORKLOAD
SYNTHETIC = "measured (synthetic data)"
CHIP_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # The speedup chart's ticks.

# The case study's own price for the TPU v2 Pod, not today's: its "nearly 40% lower" cost than 8 V100s
# holds at $384/h for the full v2 Pod, $1.50 per chip-hour, which no price page confirms (docs/case_study.md:
# "assumed"). The planner's shipped table (planning/prices.json) prices a TPU v2 chip at $1.13, the archived
# 2018 on-demand price of a single v2 device; Cloud TPU priced Pod types apart from single devices.
CASE_STUDY_POD_PRICE = planning.Price(384.0 / 256, "full v2 Pod $384/h (docs/case_study.md) / 256 chips",
                                      basis="assumed")
ACCELERATORS = ("V100", "TPU v2")  # The accelerators the case study compares, as the report names them.


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

    def minutes_for(self, epochs: float = CASE_STUDY_TIMED_EPOCHS,
                    images: int = IMAGENET_NUM_TRAIN_EXAMPLES) -> float:
        """Minutes for `epochs` of `images` at this system's rate."""
        return epochs * images / self.images_per_sec / 60


def _from_minutes(minutes: float) -> float:
    return CASE_STUDY_TIMED_EPOCHS * IMAGENET_NUM_TRAIN_EXAMPLES / (minutes * 60)


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
    accelerator = next((k for k in ACCELERATORS if k in kind), kind)
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
class Curve:
    """The planner's predictions for one accelerator: images/sec at each system it has a config for.

    Attributes:
      name: for legends ("V100, the planner").
      accelerator: the rows it is compared with.
      points: (chips, images/sec, low, high): the calibrated rate and its interval, by chips.
      basis: the step model and calibration behind the points.
      systems: the configs' system names, by chips.
    """

    name: str
    accelerator: str
    points: tuple[tuple[int, float, float, float], ...]
    basis: str
    systems: tuple[str, ...] = ()

    def chip_counts(self) -> list[int]:
        return [n for n, *_ in self.points]

    def rate(self, num_chips: int) -> float:
        return next(r for n, r, *_ in self.points if n == num_chips)


ALL_PLANNED = tuple(name for names in PLANNED_CONFIGS.values() for name in names)


def planner_predictions(configs: Sequence[str] = ALL_PLANNED) -> list[planning.Prediction]:
    """The planner's prediction for each shipped config, as `python -m resnet_scaling.planner NAME...`
    gives it (the TPU configs from their shipped compile reports)."""
    from resnet_scaling import planner

    fits = step_model.load_calibrations()
    return [planning.predict(planner.load_system(name)[0], fits) for name in configs]


def planner_curves(predictions: Sequence[planning.Prediction]) -> list[Curve]:
    """One curve per accelerator of PLANNED_CONFIGS from the planner's predictions."""
    curves = []
    for accelerator in PLANNED_CONFIGS:
        rows = sorted((p for p in predictions if accelerator in p.device_kind), key=lambda p: p.num_chips)
        if not rows:
            continue
        points = tuple((p.num_chips, p.images_per_sec, p.global_batch / p.step_high_sec,
                        p.global_batch / p.step_low_sec) for p in rows)
        curves.append(Curve(f"{accelerator}, the planner", accelerator, points,
                            f"{rows[0].step_sec.basis}: {rows[0].step_sec.note}",
                            tuple(p.system for p in rows)))
    return curves


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
            planned_v100_images_per_sec: float) -> list[dict[str, Any]]:
    """Each curve against every row it covers (same accelerator, a system it predicts).

    The predicted speedup is over the planner's own 1x V100 (`planned_v100_images_per_sec`), the row's
    over the table's; `gap` is predicted / row - 1. Efficiencies are per chip over the smallest system
    of the curve and of the table.
    """
    chips_of = {r["system"]: r["chips"] for r in rows}
    out = []
    for r in rows:
        row_efficiency = r["scaling_efficiency"] if chips_of.get(r["reference"]) == 1 else None
        for c in curves:
            if c.accelerator != r["accelerator"] or r["chips"] not in c.chip_counts():
                continue
            smallest, rate = c.points[0], c.rate(r["chips"])
            low, high = next((lo, hi) for n, _, lo, hi in c.points if n == r["chips"])
            predicted = rate / planned_v100_images_per_sec
            out.append({"system": r["system"], "source": r["source"], "chips": r["chips"], "curve": c.name,
                        "predicted_images_per_sec": rate, "interval_images_per_sec": (low, high),
                        "predicted_speedup": predicted, "row_speedup": r["speedup_over_1x_v100"],
                        "gap": predicted / r["speedup_over_1x_v100"] - 1,
                        "predicted_scaling_efficiency": (rate / r["chips"]) / (smallest[1] / smallest[0]),
                        "row_scaling_efficiency": row_efficiency})
    return out


def case_study_comparisons(predictions: Sequence[planning.Prediction],
                           prices: Mapping[str, Mapping[str, tuple[float, str]]]) -> list[dict[str, Any]]:
    """The case study's claims, each from the planner beside the published figure: the three systems'
    times for 90 epochs, the pod's speedups over one and eight V100s, and how much less the pod costs."""
    by_chips = {(next((a for a in PLANNED_CONFIGS if a in p.device_kind), p.device_kind), p.num_chips): p
                for p in predictions}
    v100, v100x8, pod = by_chips[("V100", 1)], by_chips[("V100", 8)], by_chips[("TPU v2", 256)]
    minutes = {name: p.case_study_sec / 60 for name, p in (("v100", v100), ("v100x8", v100x8), ("pod", pod))}
    published = {row.name: row.minutes_for() for row in PUBLISHED}
    v100_pub, v100x8_pub, pod_pub = (published[row.name] for row in PUBLISHED)

    def cost(row: System, planned_minutes: float) -> float | None:
        return cost_per_run(dataclasses.replace(row, images_per_sec=_from_minutes(planned_minutes)), prices)

    costs = {"pod": cost(PUBLISHED[2], minutes["pod"]), "v100x8": cost(PUBLISHED[1], minutes["v100x8"])}
    published_costs = {"pod": cost_per_run(PUBLISHED[2], prices),
                       "v100x8": cost_per_run(PUBLISHED[1], prices)}
    saving = None if None in costs.values() else 1 - costs["pod"] / costs["v100x8"]
    saving_pub = None if None in published_costs.values() else 1 - published_costs["pod"] / published_costs[
        "v100x8"]
    rows = [("1x V100, 90 epochs (minutes)", minutes["v100"], v100_pub, "published: more than 26 h"),
            ("8x V100, 90 epochs (minutes)", minutes["v100x8"], v100x8_pub, "derived: 27 x 7.9 min"),
            ("TPU v2 Pod, 90 epochs (minutes)", minutes["pod"], pod_pub, "published: 7.9 min"),
            ("pod over 1x V100 (speedup)", minutes["v100"] / minutes["pod"], v100_pub / pod_pub,
             "derived: 26 h / 7.9 min (\"about 200x\")"),
            ("pod over 8x V100 (speedup)", minutes["v100x8"] / minutes["pod"], v100x8_pub / pod_pub,
             "published: \"27x faster\""),
            ("pod's cost below 8x V100's (fraction)", saving, saving_pub,
             "published: \"nearly 40% lower\"; both at the prices below")]
    def error(name: str, planned: float | None, pub: float | None) -> float | None:
        if planned is None or pub is None:
            return None
        return planned - pub if "fraction" in name else planned / pub - 1  # Fractions: points apart.

    return [{"comparison": name, "planner": planned, "published": pub, "published_basis": basis,
             "error": error(name, planned, pub)} for name, planned, pub, basis in rows]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _main_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    def duration(minutes: float) -> str:
        return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.1f} h"

    lines = [f"## {CASE_STUDY_WORKLOAD}: the case study's workload", "",
             "| system | source | chips | images/sec | 90 epochs | speedup over 1x V100 (derived) "
             "| scaling efficiency (derived) | cost per run (prices below) |", "|" + "---|" * 8]
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
                    "accelerator price + VM price) x time for 90 epochs, at the prices below."]


def _claim_error(claim: Mapping[str, Any]) -> str:
    """"+5%" (relative), or "-24 points" for a fraction."""
    if claim["error"] is None:
        return "—"
    if "fraction" in claim["comparison"]:
        return f"{claim['error'] * 100:+.0f} points"
    return f"{claim['error']:+.0%}"


def _predictor_section(curves: Sequence[Curve], comparisons: Sequence[Mapping[str, Any]],
                       claims: Sequence[Mapping[str, Any]]) -> list[str]:
    def figure(name: str, value: float | None) -> str:
        if value is None:
            return "—"
        return f"{value:.0%}" if "fraction" in name else f"{value:,.1f}x" if "speedup" in name else (
            f"{value:,.1f} min")

    lines = ["", "## The case study's comparisons, from the planner", "",
             "Each claim as the planner (`python -m resnet_scaling.planner`) predicts it from the shipped "
             "configs, beside the published figure. No prediction takes an input from the case study's "
             "figures:", "", *(f"- {c.name}: {c.basis}." for c in curves), "",
             "| comparison | the planner | published | error |", "|---|---|---|---|",
             *(f"| {c['comparison']} | {figure(c['comparison'], c['planner'])} | "
               f"{figure(c['comparison'], c['published'])} ({c['published_basis']}) | "
               f"{_claim_error(c)} |" for c in claims),
             "", "## The planner's curves against the table", "",
             "| system | source | chips | predicted images/sec (interval) | predicted speedup over the "
             "planner's 1x V100 | speedup from its figures (derived) | gap | predicted efficiency vs its "
             "smallest system | efficiency vs 1 chip from its figures (derived) |", "|" + "---|" * 9]
    lines += [f"| {c['system']} | {c['source']} | {c['chips']} | {c['predicted_images_per_sec']:,.0f} "
              f"({c['interval_images_per_sec'][0]:,.0f}-{c['interval_images_per_sec'][1]:,.0f}) | "
              f"{c['predicted_speedup']:.2f}x | {c['row_speedup']:.2f}x | {c['gap']:+.1%} | "
              f"{_pct(c['predicted_scaling_efficiency'])} | {_pct(c['row_scaling_efficiency'])} |"
              for c in comparisons]
    return lines


def _other_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return ["", "## Other workloads: not the case study's, not comparable with the rows above", "",
            "Reported because --allow_other_workloads was given; none enters the speedups, efficiencies, "
            "costs or predictor comparisons above.", "",
            "| system | workload | source | chips | images/sec | images/sec per chip |", "|" + "---|" * 6,
            *(f"| {r['system']} | {r['workload']} | {r['source']} | {r['chips']} "
              f"| {r['images_per_sec']:,.1f} | {r['images_per_sec_per_chip']:,.1f} |" for r in rows)]


def markdown(rows: Sequence[Mapping[str, Any]], prices: Mapping[str, Any], curves: Sequence[Curve] = (),
             comparisons: Sequence[Mapping[str, Any]] = (), others: Sequence[Mapping[str, Any]] = (),
             claims: Sequence[Mapping[str, Any]] = ()) -> str:
    """The case study's table with its sources, the planner against it, the prices, other workloads."""
    lines = _main_table(rows) + (_predictor_section(curves, comparisons, claims) if curves else [])
    lines += ["", "## Prices", "", "| price | USD/hour | source |", "|---|---|---|"]
    for group, unit in (("accelerators", "per chip"), ("vms", "per VM")):
        lines += [f"| {key} ({unit}) | {usd:.2f} | {why} |" for key, (usd, why) in prices[group].items()]
    return "\n".join(lines + (_other_section(others) if others else [])) + "\n"


def _speedup_chart(plt: Any, rows: Sequence[Mapping[str, Any]], curves: Sequence[Curve], v100_rate: float,
                   path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    ax.plot(CHIP_COUNTS, CHIP_COUNTS, "k--", lw=1, label="linear scaling from 1x V100")
    # Predicted speedups are over the planner's 1x V100 (`v100_rate`), the rows' over the table's.
    for i, c in enumerate(curves):
        counts = c.chip_counts()
        label = textwrap.fill(f"predicted, {c.name} ({c.basis})", 100, subsequent_indent="  ",
                              break_on_hyphens=False)
        ax.errorbar(counts, [r / v100_rate for _, r, _, _ in c.points],
                    yerr=[[(r - lo) / v100_rate for _, r, lo, _ in c.points],
                          [(hi - r) / v100_rate for _, r, _, hi in c.points]],
                    lw=1.5, capsize=3, color=f"C{2 + i}", label=label)  # Apart from the markers' C0, C1, C4.
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
                  "published figures; prices: planning/prices.json, the pod's assumed)", fontsize=9)
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
         others: Sequence[Mapping[str, Any]] = (), v100_images_per_sec: float | None = None,
         predictions: Sequence[planning.Prediction] = ()) -> list[Path]:
    """speedup.png and cost.png for the case study's workload; planner.png (the planner's time and cost
    per system, log scale) with predictions; other_workloads.png when there are others."""
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
    if predictions:
        from resnet_scaling import planner

        paths.append(out_dir / "planner.png")
        planner.plot(predictions, str(paths[-1]))
    other_png = out_dir / "other_workloads.png"
    other_png.unlink(missing_ok=True)  # One left by an earlier run would look like this run's.
    if others:
        _other_chart(plt, others, other_png)
        paths.append(other_png)
    return paths


def price_table(prices: Mapping[str, planning.Price]) -> Mapping[str, Mapping[str, tuple[float, str]]]:
    """The report's prices per hour in USD, each with its basis and source, from a planner price table
    (`planning.load_prices`): {"accelerators": {name: per chip}, "vms": {machine: per VM}} for each of
    `ACCELERATORS` the table prices and the host VMs billed apart from it."""
    accelerators, vms = {}, {}
    for accelerator in ACCELERATORS:
        if (price := planning.price_for(accelerator, prices)) is None:
            continue
        accelerators[accelerator] = (price.usd_per_chip_hour, _sourced(price.basis, price.source, price.date))
        for host in price.host_vm.values():
            vms[host.machine] = (host.usd_per_hour, _sourced(price.basis, host.source, host.date))
    return types.MappingProxyType({"accelerators": types.MappingProxyType(accelerators),
                                   "vms": types.MappingProxyType(vms)})


def _sourced(basis: str, source: str, date: str) -> str:
    return f"{basis}{f' ({date})' if date else ''}: {source}"


def load_prices(path: str | None) -> Mapping[str, Mapping[str, tuple[float, str]]]:
    """The report's prices: the planner's shipped table (planning/prices.json) with the case study's pod
    price for TPU v2, then the kinds a price file of the same shape lists (`--prices`, "given"), as
    `python -m resnet_scaling.planner --prices` reads it."""
    prices = {**planning.load_prices(), "TPU v2": CASE_STUDY_POD_PRICE}
    if path is not None:
        prices.update(planning.load_prices(path, basis="given"))
    return price_table(prices)


PRICES = load_prices(None)


def _parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summaries", nargs="*", default=[], help="summary.json files or workdirs holding one.")
    p.add_argument("--prices", default=None, help="A JSON price table shaped as resnet_scaling/planning/"
                   "prices.json; the kinds it lists replace the report's prices.")
    p.add_argument("--out_dir", default=str(RESULTS / "case_study"))
    p.add_argument("--no_published", action="store_true", help="Only measured rows.")
    p.add_argument("--allow_other_workloads", action="store_true",
                   help="Report summaries of other workloads in a separate, labelled section and chart "
                        "instead of refusing them.")
    return p, p.parse_args(argv)


def main(argv: list[str]) -> str:
    """Builds the report; prints and writes the Markdown, JSON and charts; returns the Markdown."""
    p, args = _parse_args(argv)
    try:
        measured, others = load_measured(args.summaries, args.allow_other_workloads)
    except planning.WorkloadError as e:
        p.error(str(e))
    systems = [*(() if args.no_published else PUBLISHED), *measured]
    if not systems:
        p.error("Nothing to report: pass --summaries of the case study's workload or drop --no_published.")
    prices = load_prices(args.prices)
    rows = table_rows(systems, prices)
    predictions = planner_predictions()
    curves = planner_curves(predictions)
    planned_v100 = next(c for c in curves if c.accelerator == "V100").rate(1)
    comparisons = compare(rows, curves, planned_v100)
    claims = case_study_comparisons(predictions, prices)
    extra = other_rows(others)
    text = markdown(rows, prices, curves, comparisons, extra, claims)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "case_study.md").write_text(text)
    predictor = {"curves": [dataclasses.asdict(c) for c in curves], "comparisons": comparisons,
                 "case_study_comparisons": claims}
    report = {"case_study": rows, "predictor": predictor, "other_workloads": extra}
    (out_dir / "case_study.json").write_text(json.dumps(report, indent=2) + "\n")
    paths = plot(rows, out_dir, curves, extra, planned_v100, predictions)
    print(text)
    print(f"Wrote {out_dir}/case_study.md, case_study.json, {', '.join(path.name for path in paths)}")
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
