"""The case study's report: a Markdown table and two charts from run summaries and published figures.

  python benchmarks/case_study.py --summaries RUN1/summary.json RUN2 ... --out_dir /tmp/report
  python benchmarks/case_study.py --prices my_prices.json   # another price table (same shape as PRICES)

Rows come from `summary.json` files (labelled "measured": steady-state images/sec, 90 epochs at that
rate) and from the case study's published figures (labelled "published"; `docs/case_study.md`).
Per system: images/sec, time for 90 epochs, speedup over one V100, scaling efficiency (images/sec per
chip against the smallest system of the same accelerator in the table) and the cost of one run from an
editable price table. Charts: speedup against chips with the linear-scaling line and the scaling
predictor's curves; cost per run by system.

The scaling predictor: weak scaling (fixed per-chip batch), step time at N chips = one chip's compute
step time + the gradient all-reduce time over a ring or 2-D torus (bandwidth-latency model, no overlap
with compute: a conservative bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IMAGENET_TRAIN_IMAGES = 1_281_167
MEASURED_EPOCHS = 90  # The case study's clock covers 90 epochs after a 1-epoch warm-up.
RESNET50_PARAMS = 25_557_032

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
      source: "measured" (from a summary.json) or "published".
      accelerator: key of the price table ("V100", "TPU v2") or the device kind.
      chips: accelerator chips (TPU v2/v3 have 2 JAX devices per chip).
      images_per_sec: steady-state training images/sec.
      vm: key of the VM price table, or None when the accelerator price includes the host.
      note: where the figure comes from.
    """

    name: str
    source: str
    accelerator: str
    chips: int
    images_per_sec: float
    vm: str | None = None
    note: str = ""

    def minutes_for(self, epochs: float = MEASURED_EPOCHS, images: int = IMAGENET_TRAIN_IMAGES) -> float:
        return epochs * images / self.images_per_sec / 60


def _from_minutes(minutes: float) -> float:
    return MEASURED_EPOCHS * IMAGENET_TRAIN_IMAGES / (minutes * 60)


# The case study's figures (docs/case_study.md); images/sec derived from the published times over 90 epochs.
PUBLISHED: tuple[System, ...] = (
    System("1x V100 (n1-standard-8)", "published", "V100", 1, _from_minutes(26 * 60), "n1-standard-8",
           "more than 26 hours (Google Cloud blog, Dec 2018)"),
    System("8x V100 (n1-standard-64)", "published", "V100", 8, _from_minutes(27 * 7.9), "n1-standard-64",
           "derived: the pod was 27x faster (Google Cloud blog, Dec 2018)"),
    System("Cloud TPU v2 Pod (v2-512)", "published", "TPU v2", 256, _from_minutes(7.9), None,
           "7.9 minutes (Google Cloud blog, Dec 2018)"),
)


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
NVLINK_V100 = Interconnect("NVLink (8x V100)", 130e9, 5e-6, "ring")
ICI_TPU_V2 = Interconnect("ICI 2-D torus (TPU v2)", 2 * 62e9, 2e-6, "torus2d")


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


def system_from_summary(summary: Mapping[str, Any], name: str | None = None) -> System:
    """A measured row from a `summary.json` (the steady-state images/sec of that run)."""
    run, config = summary["run"], summary.get("config", {})
    kind = run["device_kind"]
    images_per_sec = summary["throughput"]["images_per_sec"]
    if not images_per_sec:
        raise ValueError(f"{name or kind}: the summary has no steady-state images/sec (no timed region).")
    per_chip = 2 if any(t in kind for t in ("TPU v2", "TPU v3")) else 1  # 2 cores (JAX devices) per chip.
    accelerator = next((k for k in ("V100", "TPU v2") if k in kind), kind)
    label = name or config.get("system", {}).get("name") or f"{run['devices']}x {kind}"
    return System(label, "measured", accelerator, max(1, run["devices"] // per_chip), float(images_per_sec),
                  None, f"summary.json, {run['devices']} devices, batch {run['global_batch_size']}")


def cost_per_run(system: System, prices: Mapping[str, Mapping[str, tuple[float, str]]]) -> float | None:
    """USD for 90 epochs at the system's rate, or None if the price table lacks its accelerator or VM."""
    accel = prices["accelerators"].get(system.accelerator)
    vm = prices["vms"].get(system.vm) if system.vm else (0.0, "")
    if accel is None or vm is None:
        return None
    return (system.chips * accel[0] + vm[0]) * system.minutes_for() / 60


def table_rows(systems: Sequence[System], prices: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per system: the report's columns as numbers (None where unknown)."""
    v100 = next((s for s in systems if s.accelerator == "V100" and s.chips == 1), PUBLISHED[0])
    smallest: dict[str, System] = {}
    for s in sorted(systems, key=lambda s: s.chips):
        smallest.setdefault(s.accelerator, s)
    rows = []
    for s in systems:
        ref = smallest[s.accelerator]
        efficiency = (s.images_per_sec / s.chips) / (ref.images_per_sec / ref.chips) if ref is not s else None
        rows.append({"system": s.name, "source": s.source, "chips": s.chips,
                     "images_per_sec": s.images_per_sec, "minutes_90_epochs": s.minutes_for(),
                     "speedup_over_1x_v100": s.images_per_sec / v100.images_per_sec,
                     "scaling_efficiency": efficiency, "reference": ref.name,
                     "cost_usd": cost_per_run(s, prices), "note": s.note})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], prices: Mapping[str, Any]) -> str:
    """The table, then the price table with its sources."""
    def duration(minutes: float) -> str:
        return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.1f} h"

    lines = ["| system | source | chips | images/sec | 90 epochs | speedup over 1x V100 | scaling efficiency "
             "| cost per run |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        efficiency = r["scaling_efficiency"]
        eff = "—" if efficiency is None else f"{efficiency:.0%} (vs {r['reference']})"
        cost = "—" if r["cost_usd"] is None else f"${r['cost_usd']:,.0f}"
        lines.append(f"| {r['system']} | {r['source']} | {r['chips']} | {r['images_per_sec']:,.0f} | "
                     f"{duration(r['minutes_90_epochs'])} | {r['speedup_over_1x_v100']:.1f}x | {eff} | "
                     f"{cost} |")
    lines += ["", "| price | USD/hour | source |", "|---|---|---|"]
    for group, unit in (("accelerators", "per chip"), ("vms", "per VM")):
        for key, (usd, source) in prices[group].items():
            lines.append(f"| {key} ({unit}) | {usd:.2f} | {source} |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """speedup.png (speedup over 1x V100 against chips, linear line, predictor curves) and cost.png."""
    import matplotlib

    matplotlib.use("Agg")  # No display: write files only.
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    chips = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    ax.plot(chips, chips, "k--", lw=1, label="linear scaling (1 chip = 1x V100)")
    for name, link, per_chip_rate, gradient_bytes, per_chip_batch, max_chips in _PREDICTOR_CURVES:
        base = per_chip_rate / PUBLISHED[0].images_per_sec
        counts = [n for n in chips if n <= max_chips]
        pts = [predict(per_chip_batch / per_chip_rate, gradient_bytes, n, link) for n in counts]
        ax.plot(counts, [base * p["speedup"] for p in pts], lw=1, label=f"predicted: {name}")
    for source, marker in (("published", "o"), ("measured", "s")):
        pts = [r for r in rows if r["source"] == source]
        ax.scatter([r["chips"] for r in pts], [r["speedup_over_1x_v100"] for r in pts], marker=marker,
                   label=source, zorder=3)
        for r in pts:
            ax.annotate(r["system"], (r["chips"], r["speedup_over_1x_v100"]), fontsize=6,
                        xytext=(3, -8), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="chips", ylabel="speedup over 1x V100",
           title="ResNet-50 training speedup")
    ax.legend(fontsize=7)
    fig.tight_layout()
    speedup_png = out_dir / "speedup.png"
    fig.savefig(speedup_png, dpi=120)
    plt.close(fig)

    priced = [r for r in rows if r["cost_usd"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh([f"{r['system']} ({r['source']})" for r in priced], [r["cost_usd"] for r in priced])
    ax.set(xlabel="USD per 90-epoch run (price table: assumed 2018 list prices)", title="Cost per run")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    cost_png = out_dir / "cost.png"
    fig.savefig(cost_png, dpi=120)
    plt.close(fig)
    return [speedup_png, cost_png]


# (name, interconnect, one chip's images/sec, gradient bytes, per-chip batch, most chips) for the chart.
# V100: the published single-GPU rate, batch 312, float32 gradients. TPU v2: one chip's compute rate is
# not published; ~960 images/sec is assumed (the pod's ~950 per chip at the predicted ~99% efficiency).
TPU_V2_CHIP_IMAGES_PER_SEC_ASSUMED = 960.0
_PREDICTOR_CURVES = (
    ("V100, NVLink ring", NVLINK_V100, PUBLISHED[0].images_per_sec, 4 * RESNET50_PARAMS, 312, 8),
    ("TPU v2, ICI torus", ICI_TPU_V2, TPU_V2_CHIP_IMAGES_PER_SEC_ASSUMED, 4 * RESNET50_PARAMS, 128, 256),
)


def load_prices(path: str | None) -> Mapping[str, Mapping[str, tuple[float, str]]]:
    """The default price table, or one from a JSON file {"accelerators": {k: [usd, source]}, "vms": ...}."""
    if path is None:
        return PRICES
    raw = json.loads(Path(path).read_text())
    return {group: {k: (float(v[0]), str(v[1])) for k, v in raw.get(group, {}).items()}
            for group in ("accelerators", "vms")}


def main(argv: list[str]) -> str:
    """Builds the report; prints and writes the Markdown and the charts; returns the Markdown."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summaries", nargs="*", default=[], help="summary.json files or workdirs holding one.")
    p.add_argument("--prices", default=None, help="A JSON price table replacing the defaults.")
    p.add_argument("--out_dir", default=str(Path(__file__).resolve().parent / "results" / "case_study"))
    p.add_argument("--no_published", action="store_true", help="Only measured rows.")
    args = p.parse_args(argv)
    measured = []
    for path in args.summaries:
        file = Path(path) / "summary.json" if Path(path).is_dir() else Path(path)
        measured.append(system_from_summary(json.loads(file.read_text())))
    systems = [*(() if args.no_published else PUBLISHED), *measured]
    if not systems:
        p.error("Nothing to report: pass --summaries or drop --no_published.")
    prices = load_prices(args.prices)
    rows = table_rows(systems, prices)
    text = markdown(rows, prices)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "case_study.md").write_text(text)
    (out_dir / "case_study.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, out_dir)
    print(text)
    print(f"Wrote {out_dir}/case_study.md, case_study.json, speedup.png, cost.png")
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
