"""Entry point: time and cost to MLPerf's ResNet-50 target (75.90% top-1) on each system, from its step.

    python -m resnet_scaling.planner                                    # every shipped system, in seconds
    python -m resnet_scaling.planner pod tpu_v2_8 gpu_h200x8            # configs
    python -m resnet_scaling.planner pod.json runs/h200/summary.json    # compile reports, run summaries
    python -m resnet_scaling.planner --all_configs --json_out=plan.json --chart_out=plan.png \\
        --prices=prices.json --input_rate="1143:benchmarks/input_pipeline.py, AMD EPYC, 1 core"

Inputs: compile reports (`python -m resnet_scaling.compile --json_out`), runs' `summary.json` (or workdir),
configs by name or path (a shipped TPU config's report ships with the package while the config is
unchanged, `analysis/shipped_reports.py`; other TPU configs are compiled here with libtpu, about a minute
each on 2 cores; a GPU one without a run is not predicted). One row per system, uncompensated and, for
TPUs, times the case study pod's factor (its report or config in the inputs or `--calibration`); figures
name their source (`analysis.planning`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from absl import app, flags

from resnet_scaling import config as config_lib
from resnet_scaling import console, errors, workdir
from resnet_scaling.analysis import planning, shipped_reports
from resnet_scaling.host import process_setup
from resnet_scaling.metrics import format_duration

logger = logging.getLogger("resnet_scaling.planner")  # Not __name__: "__main__" under `python -m`.

_PRICES = flags.DEFINE_multi_string(
    "price", [], 'A price per chip-hour for one system, "SYSTEM=USD:SOURCE" (SYSTEM: its input\'s file '
    'name without .json, its config name or the system name), e.g. "pod=1.23:your price page, read on '
    'DATE".')
_PRICE_TABLE = flags.DEFINE_string(
    "prices", None, 'A JSON price table by device kind: {"TPU v4": {"usd_per_chip_hour": 1.23, "source": '
    '"your price page", "date": "..."}, ...}; kinds it lacks keep the case study\'s assumed prices (TPU v2, '
    'V100).')
_CALIBRATION = flags.DEFINE_string(
    "calibration", None, "The pod's compile report (or the pod config) for the TPU factor, when it is not "
    "among the inputs.")
_INPUT_RATE = flags.DEFINE_string(
    "input_rate", None, 'Training images/sec one host CPU core preprocesses, "RATE:SOURCE" (benchmarks/'
    'input_pipeline.py measures it): adds the cores each host needs.')
_ALL_CONFIGS = flags.DEFINE_bool("all_configs", False, "Add every shipped system config to the inputs "
                                  "(with no input, they are the inputs).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the predictions as JSON to this path.")
_CHART_OUT = flags.DEFINE_string("chart_out", None, "Also draw time and cost against chips to this PNG "
                                 "(needs matplotlib: pip install 'resnet_scaling[benchmarks]').")


def parse_price(text: str) -> tuple[str, planning.Price]:
    """("pod", Price(1.35, "...")) from "pod=1.35:..."; raises ValueError naming what is wrong."""
    system, _, rest = text.partition("=")
    value, _, source = rest.partition(":")
    try:
        usd = float(value)
    except ValueError:
        usd = -1.0
    if not system or usd < 0 or not source.strip():
        raise ValueError(f'--price={text}: expected "SYSTEM=USD_PER_CHIP_HOUR:SOURCE" with a price >= 0 and '
                         "where it was read.")
    return system, planning.Price(usd, source.strip())


def load_price_table(path: str) -> dict[str, planning.Price]:
    """The `--prices` table; raises ValueError naming a malformed entry."""
    table = json.loads(workdir.as_path(path).read_text())
    prices = {}
    for kind, entry in table.items():
        try:
            prices[kind] = planning.Price(float(entry["usd_per_chip_hour"]), str(entry["source"]),
                                          str(entry.get("date", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: {kind!r} needs usd_per_chip_hour and source ({e})") from None
    return prices


def parse_input_rate(text: str) -> planning.Figure:
    """Figure(1143, "given", "...") from "1143:SOURCE"; raises ValueError naming what is wrong."""
    value, _, source = text.partition(":")
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if rate <= 0 or not source.strip():
        raise ValueError(f'--input_rate={text}: expected "IMAGES_PER_SEC_PER_CORE:SOURCE" with a rate > 0.')
    return planning.Figure(rate, "given", source.strip())


def _compile_report(config: Any) -> dict[str, Any]:
    from resnet_scaling.analysis import aot  # jax and libtpu: only when a TPU config is compiled here.

    topology = config.system.topology
    logger.info("Compiling %s for %s (about a minute on 2 cores; `python -m resnet_scaling.compile "
                "--json_out` keeps the report for next time).", config.system.name, topology)
    return dataclasses.asdict(aot.compile_for_topology(config))


def load_system(value: str) -> tuple[planning.System, set[str]]:
    """The system an input names, and the names a `--price` may call it by.

    Raises:
      ValueError, OSError, KeyError: an unreadable input (the message names it).
      RunError: a TPU config that cannot be compiled here (no libtpu: `MissingExtraError`).
    """
    path = workdir.as_path(value)
    if path.is_dir():
        path = path / "summary.json"
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        data = json.loads(path.read_text())
        if "run" in data and "throughput" in data:
            system = planning.system_from_summary(data)
        else:
            system = planning.system_from_report(data)
        return system, {path.stem if path.name != "summary.json" else path.parent.name, system.name}
    config = config_lib.load_config(value)
    name = os.path.splitext(os.path.basename(value))[0]
    if config.system.topology:
        report = shipped_reports.load_shipped_report(name, config) or _compile_report(config)
        return planning.system_from_report(report), {name, config.system.name}
    return planning.system_from_config(config), {name, config.system.name}


def _pair(uncompensated: float | None, compensated: float | None, fmt: Any) -> str:
    if uncompensated is None:
        return "-"
    return fmt(uncompensated) + ("" if compensated is None else f" → {fmt(compensated)}")


def format_table(predictions: Sequence[planning.Prediction]) -> str:
    """The predictions as a Markdown table; "A → B": uncompensated, then with the family's factor."""
    def ms(x: float) -> str:
        return f"{x * 1e3:,.2f} ms"

    def images(x: float) -> str:
        return f"{x:,.0f}"

    def cost(x: float) -> str:
        return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"

    lines = ["| system | chips | global batch | step (compiled or measured → x factor) | images/sec | "
             "scaling efficiency | case study's clock: 90 epochs | MLPerf epochs (published) | MLPerf's "
             "clock: training + evaluation | cost, MLPerf's clock | host cores needed |",
             "|" + "---|" * 11]
    for p in predictions:
        comp_case, comp_mlperf = p.compensated_case_study, p.compensated_mlperf
        comp_step = p.compensated_step_sec and p.compensated_step_sec.value
        step = ("not predicted" if p.step_sec.value is None else
                f"{_pair(p.step_sec.value, comp_step, ms)} ({p.step_sec.basis})")
        efficiency = "-" if p.scaling_efficiency is None else f"{p.scaling_efficiency.value:.0%}"
        mlperf_cost = _pair(p.mlperf.cost_usd, comp_mlperf and comp_mlperf.cost_usd, cost)
        price = "" if p.price is None or mlperf_cost == "-" else f" ({p.price.basis})"
        cores = "-" if p.host_cores_needed is None else f"{p.host_cores_needed.value:,.1f}"
        lines.append(
            f"| {p.system} | {p.num_chips} x {p.device_kind} | {p.global_batch:,} | {step} | "
            f"{_pair(p.images_per_sec, p.compensated_images_per_sec, images)} | {efficiency} | "
            f"{_pair(p.case_study.total_sec, comp_case and comp_case.total_sec, format_duration)} | "
            f"{p.mlperf.epochs.value:.1f} | "
            f"{_pair(p.mlperf.total_sec, comp_mlperf and comp_mlperf.total_sec, format_duration)} | "
            f"{mlperf_cost}{price} | {cores} |")
    return "\n".join(lines)


def format_notes(predictions: Sequence[planning.Prediction], factor: planning.Figure | None) -> str:
    """Where the figures come from: the factor, the prices, what was not predicted and why."""
    notes = [f"- TPU factor: x{factor.value:.3f} ({factor.note})." if factor else
             "- No TPU factor: add the pod's compile report (or `pod`) to the inputs or pass --calibration."]
    seen = set()
    for p in predictions:
        if p.step_sec.value is None:
            notes.append(f"- {p.system}: not predicted ({p.step_sec.note}).")
        elif p.mlperf.eval_sec is None:
            notes.append(f"- {p.system}: no evaluation time ({p.step_sec.note}); MLPerf's clock not given.")
        if p.price is None and p.step_sec.value is not None:  # A time to cost, and nothing to cost it at.
            notes.append(f"- {p.system}: no price for {p.device_kind}; give one as "
                         f"--price='{p.system}=USD_PER_CHIP_HOUR:SOURCE, DATE' or in a --prices file.")
        if p.price is not None and (p.price.source, p.price.date) not in seen:
            seen.add((p.price.source, p.price.date))
            date = f", {p.price.date}" if p.price.date else ""
            notes.append(f"- Price ({p.price.basis}) for {p.device_kind}: "
                         f"${p.price.usd_per_chip_hour:.2f} per "
                         f"chip-hour, {p.price.source}{date}.")
    return "\n".join(notes)


def plot(predictions: Sequence[planning.Prediction], path: str) -> None:
    """Time and cost to the target on MLPerf's clock against chips: one line per device kind."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: --chart_out needs matplotlib: "
                         "pip install 'resnet_scaling[benchmarks]'") from None
    matplotlib.use("Agg")  # No display: write the file only.
    import matplotlib.pyplot as plt

    fig, (time_ax, cost_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    kinds = sorted({p.device_kind for p in predictions if p.mlperf.total_sec is not None})
    for i, kind in enumerate(kinds):
        rows = sorted((p for p in predictions if p.device_kind == kind and p.mlperf.total_sec is not None),
                      key=lambda p: p.num_chips)
        chips = [p.num_chips for p in rows]
        comp = [p.compensated_mlperf for p in rows]
        time_ax.plot(chips, [p.mlperf.total_sec / 60 for p in rows], "o--", color=f"C{i}",
                     label=f"{kind}, {rows[0].step_sec.basis} step")
        if all(comp):
            time_ax.plot(chips, [c.total_sec / 60 for c in comp], "o-", color=f"C{i}",
                         label=f"{kind}, x the TPU factor (derived)")
        costs = [(p.num_chips, (c or p.mlperf).cost_usd) for p, c in zip(rows, comp, strict=True)]
        costs = [(n, usd) for n, usd in costs if usd is not None]
        if costs:
            basis = rows[0].price.basis if rows[0].price else ""
            cost_ax.plot(*zip(*costs, strict=True), "o-", color=f"C{i}", label=f"{kind} ({basis} price)")
    time_ax.set(xscale="log", yscale="log", xlabel="chips", ylabel="minutes to 75.9% (MLPerf's clock)",
                title="Time to target: dashed uncompensated, solid compensated")
    cost_ax.set(xscale="log", xlabel="chips", ylabel="USD to 75.9% (MLPerf's clock)",
                title="Cost to target (compensated where a factor exists)")
    for ax in (time_ax, cost_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def shipped_systems() -> tuple[list[str], list[str]]:
    """The shipped configs written for a system (`config.system.name`), and the others (the demo, the
    defaults), which name no hardware to plan for."""
    systems, others = [], []
    for name in config_lib.shipped_config_names():
        (systems if config_lib.load_config(name).system.name else others).append(name)
    return systems, others


def main(argv: list[str]) -> None:
    console.configure_command_line_logging()
    inputs = argv[1:]
    not_systems: list[str] = []
    if _ALL_CONFIGS.value or not inputs:  # No input: every shipped system, from the shipped reports.
        systems, not_systems = shipped_systems()
        inputs += systems
    process_setup.start_host_compiler()  # A TPU config is compiled here, on the host.
    try:
        prices = dict(planning.ASSUMED_PRICES)
        if _PRICE_TABLE.value:
            prices.update(load_price_table(_PRICE_TABLE.value))
        by_system = dict(parse_price(text) for text in _PRICES.value)
        rate = parse_input_rate(_INPUT_RATE.value) if _INPUT_RATE.value else None
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    systems, names = [], []
    for value in inputs:
        try:
            system, keys = load_system(value)
        except (OSError, ValueError, KeyError, errors.RunError) as e:  # RunError: a TPU config, no libtpu.
            raise SystemExit(f"error: {value}: {e}") from None
        systems.append(system)
        names.append(keys)
    unknown = set(by_system) - set().union(*names)
    if unknown:
        raise SystemExit(f"error: --price names {', '.join(sorted(unknown))}, which no input is for.")
    pod = next((s for s in systems
                if planning.CASE_STUDY_POD.is_system_of(s) and s.step_sec.basis == "compiled"), None)
    if _CALIBRATION.value:
        pod = load_system(_CALIBRATION.value)[0]
    try:
        factor = planning.tpu_factor(pod) if pod else None
    except ValueError as e:
        raise SystemExit(f"error: --calibration: {e}") from None
    predictions = []
    for system, keys in zip(systems, names, strict=True):
        price = next((by_system[k] for k in keys if k in by_system), None) or planning.price_for(
            system.device_kind, prices)
        try:
            predictions.append(planning.predict(system, factor if system.family == "TPU" else None, price,
                                                rate))
        except ValueError as e:
            raise SystemExit(f"error: {system.name}: {e}") from None
    predictions = planning.with_scaling_efficiency(predictions)
    print(format_table(predictions))
    print()
    print(format_notes(predictions, factor))
    if not_systems:
        print(f"- {', '.join(not_systems)}: not planned; these configs name no system "
              "(config.system.name is empty): they are not written for any hardware.")
    if _JSON_OUT.value:
        workdir.write_text_atomically(_JSON_OUT.value, json.dumps(
            {"tpu_factor": factor and dataclasses.asdict(factor),
             "predictions": [dataclasses.asdict(p) for p in predictions]}, indent=2) + "\n")
        logger.info("Wrote %s.", _JSON_OUT.value)
    if _CHART_OUT.value:
        plot(predictions, _CHART_OUT.value)
        logger.info("Wrote %s.", _CHART_OUT.value)


if __name__ == "__main__":
    app.run(main, flags_parser=console.parse_flags)
