"""Entry point: time and cost to the target on each system, from its compiled (or measured) step.

    python -m resnet_scaling.planner                                    # every shipped system, in seconds
    python -m resnet_scaling.planner pod tpu_v2_8 gpu_h200x8            # configs
    python -m resnet_scaling.planner pod.json runs/h200/summary.json    # compile reports, run summaries
    python -m resnet_scaling.planner --config=gpu_h100x8 --config.mesh.num_devices=64 \
        --config.training.global_batch_size=3200                        # what-if: train's override syntax
    python -m resnet_scaling.planner --all_configs --json_out=plan.json --chart_out=plan.png \\
        --prices=prices.json --input_rate="1143:benchmarks/input_pipeline.py, AMD EPYC, 1 core"

Inputs: compile reports (`python -m resnet_scaling.compile --json_out`), runs' `summary.json` (or workdir),
configs by name or path, and `--config` with `--config.FIELD=VALUE` overrides as train takes them (a shipped
TPU config's report ships with the package while the config is unchanged, `planning/shipped_reports.py`;
other TPU configs are compiled here with libtpu, minutes to tens of minutes each on a small CPU; a shipped
GPU config is planned from its own compiled program, shipped too: FLOPs, collectives and memory fit, HBM
bytes per image from a TPU program of the same model; another GPU config, or a TPU config that names no
topology, from that TPU program alone, per image). The command reads each config and its overrides here,
resolves its recipe and derives its plan once; the planning package takes the plan. One row per system:
the step model's calibrated step with its interval (`planning/step_model.py`), the recipe's epochs, and
one bill at the shipped dated prices
(`planning/prices.json`) or yours; every figure names its basis (`planning/estimates.py`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from resnet_scaling import config as config_lib
from resnet_scaling.config import command_line, recipes
from resnet_scaling.config import plan as plan_lib
from resnet_scaling.job import console, errors, native_noise, workdir
from resnet_scaling.job.console import format_duration
from resnet_scaling.planning import estimates as planning
from resnet_scaling.planning import shipped_reports, step_model

logger = logging.getLogger("resnet_scaling.planner")  # Not __name__: "__main__" under `python -m`.

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A system to plan as a config (a file or a shipped name), with any --config.FIELD=VALUE "
    "overrides, as train takes them: a what-if in one line.", lock_config=True)
_PRICES = flags.DEFINE_multi_string(
    "price", [], 'A price per chip-hour for one system, "SYSTEM=USD:SOURCE" (SYSTEM: its input\'s file '
    'name without .json, its config name or the system name), e.g. "pod=1.23:your price page, read on '
    'DATE".')
_PRICE_TABLE = flags.DEFINE_string(
    "prices", None, 'A JSON price table by device kind, as the shipped planning/prices.json: {"TPU v4": '
    '{"usd_per_chip_hour": 1.23, "source": "your price page", "date": "..."}, ...}; kinds it lacks keep the '
    'shipped prices.')
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
    if not system or not math.isfinite(usd) or usd < 0 or not source.strip():
        raise ValueError(f'--price={text}: expected "SYSTEM=USD_PER_CHIP_HOUR:SOURCE" with a price >= 0 and '
                         "where it was read.")
    return system, planning.Price(usd, source.strip())


def parse_input_rate(text: str) -> planning.Figure:
    """Figure(1143, "given", "...") from "1143:SOURCE"; raises ValueError naming what is wrong."""
    value, _, source = text.partition(":")
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if not math.isfinite(rate) or rate <= 0 or not source.strip():
        raise ValueError(f'--input_rate={text}: expected "IMAGES_PER_SEC_PER_CORE:SOURCE" with a rate > 0.')
    return planning.Figure(rate, "given", source.strip())


def _compile_report(config: ml_collections.ConfigDict) -> dict[str, Any]:
    # JAX loads here, for a TPU config without a current shipped report: the rest of the planner is plain
    # Python over shipped figures, and starts in a fraction of JAX's import.
    native_noise.import_jax_quietly()
    from resnet_scaling.job import process_setup

    process_setup.start_host_compiler()  # Compiled on this host; before anything starts a JAX backend.
    from resnet_scaling.planning import aot
    from resnet_scaling.training import training_setup

    target = aot.target_for(config.system, max(1, config.mesh.num_devices))
    logger.info("Compiling %s for %s (minutes for a small slice, tens of minutes for a large one on a small "
                "CPU; `python -m resnet_scaling.compile --json_out` keeps the report for next time).",
                config.system.name, target.topology)
    run = training_setup.setup(config, devices=target.devices, abstract=True)
    return dataclasses.asdict(aot.build_report(run, target, config_hash=config_lib.config_hash(config),
                                               mlperf_mode=bool(config.mlperf.enabled)))


def recipe_of(config: ml_collections.ConfigDict) -> planning.Recipe:
    """The epochs a config trains and how often it evaluates (MLPerf mode: by its MLPerf fields)."""
    return planning.Recipe(float(config.training.num_epochs),
                           float(config.mlperf.eval_every_epochs if config.mlperf.enabled
                                 else config.eval.every_epochs),
                           bool(config.mlperf.enabled))


def system_of_config(name: str, config: ml_collections.ConfigDict) -> planning.System:
    """The system a resolved config describes: from its shipped compile report, else compiled here (a TPU
    config with a topology), else from its plan and the reference program (`planning.system_from_plan`).

    Raises:
      ConfigError: the config does not name the devices to plan for, or fails validation.
    """
    if config.system.topology:  # Its devices are the topology's; the compile validates it for them.
        report = (shipped_reports.load_shipped_report(name, config_lib.config_hash(config))
                  or _compile_report(config))
        return planning.system_from_report(report)
    devices = int(config.mesh.num_devices)
    if devices < 1:
        raise errors.ConfigError(f"config.mesh.num_devices is {devices}: give the devices to plan for "
                                 "(--config.mesh.num_devices=N).")
    config_lib.validate(config, devices)
    plan = plan_lib.derive(config, int(config.data.num_train_examples), devices)
    # A shipped GPU config's own compiled program while the config (overrides included) is as compiled;
    # else, for a GPU, its generation's compiled program per image, as the calibration models GPUs.
    own = shipped_reports.load_shipped_report(name, config_lib.config_hash(config))
    kind = config.system.device_kind
    gpu_report = own or (None if "tpu" in kind.lower() else shipped_reports.gpu_report_of_generation(kind))
    return planning.system_from_plan(config.system.name, kind, plan, recipe_of(config), _reference(),
                                     gpu_report, own_gpu_report=own is not None)


def load_system(value: str) -> tuple[planning.System, set[str]]:
    """The system an input names, and the names a `--price` may call it by.

    Raises:
      ValueError, OSError, KeyError: an unreadable input (the message names it).
      RunError: a TPU config that cannot be compiled here (no libtpu: `MissingExtraError`), or an invalid
        config (`ConfigError`).
    """
    path = workdir.as_path(value)
    if path.is_dir():
        path = path / "summary.json"
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        data = planning.read_json_object(path, "a compile report or a run's summary.json")
        if "run" in data and "throughput" in data:
            system = planning.system_from_summary(data)
        else:
            system = planning.system_from_report(data)
        return system, {path.stem if path.name != "summary.json" else path.parent.name, system.name}
    config = recipes.resolve(config_lib.load_config(value)).config
    name = os.path.splitext(os.path.basename(value))[0]
    return system_of_config(name, config), {name, config.system.name}


def _range(value: float | None, low: float | None, high: float | None, fmt: Any) -> str:
    if value is None:
        return "-"
    if low is None or high is None or (fmt(low) == fmt(value) == fmt(high)):
        return fmt(value)
    return f"{fmt(value)} ({fmt(low)}-{fmt(high)})"


def _ms(x: float) -> str:
    return f"{x * 1e3:,.1f} ms"


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"


EFFICIENCY_REFERENCE = "the step without its collectives over the step (same chip, same batch per chip)"


def format_table(predictions: Sequence[planning.Prediction]) -> str:
    """The predictions as a Markdown table: calibrated (or measured) figures with their interval; the host
    cores column only where an input rate was given."""
    cores = any(p.host_cores_needed for p in predictions)
    lines = ["| system | chips | batch | step (interval) | basis | images/sec | scaling eff.¹ | epochs | "
             "time to target (interval) | cost (interval) |" + (" host cores |" if cores else ""),
             "|" + "---|" * (11 if cores else 10)]
    for p in predictions:
        t = p.time_to_target
        step = ("-" if p.step_sec.value is None else
                _range(p.step_sec.value, p.step_low_sec, p.step_high_sec, _ms))
        efficiency = "-" if p.scaling_efficiency is None else f"{p.scaling_efficiency.value:.0%}"
        rate = "-" if p.images_per_sec is None else f"{p.images_per_sec:,.0f}"
        epochs = f"{t.epochs.value:.3g}" + (" (MLPerf)" if t.epochs.basis == "published" else "")
        cost = _range(t.cost_usd, t.cost_low_usd, t.cost_high_usd, _usd)
        line = (f"| {p.system} | {p.num_chips} x {p.device_kind} | {p.global_batch:,} | {step} | "
                f"{p.step_sec.basis} | {rate} | {efficiency} | {epochs} | "
                f"{_range(t.total_sec, t.low_sec, t.high_sec, format_duration)} | {cost} |")
        if cores:
            line += " - |" if p.host_cores_needed is None else f" {p.host_cores_needed.value:,.1f} |"
        lines.append(line)
    return "\n".join(lines)


def format_best(predictions: Sequence[planning.Prediction]) -> str:
    """Which system reaches the target first, and which for least, overall and per family (TPU, GPU)."""
    timed = [p for p in predictions if p.time_to_target.total_sec is not None]
    if not timed:
        return ""
    lines = ["| to the target | fastest | cheapest |", "|---|---|---|"]
    for label, rows in (("any system", timed), ("TPU", [p for p in timed if "TPU" in p.device_kind]),
                        ("GPU", [p for p in timed if "TPU" not in p.device_kind])):
        if not rows:
            continue
        fast = min(rows, key=lambda p: p.time_to_target.total_sec)
        costed = [p for p in rows if p.time_to_target.cost_usd is not None]
        cheap = min(costed, key=lambda p: p.time_to_target.cost_usd) if costed else None
        cheapest = "-" if cheap is None else (f"{cheap.system}: {_usd(cheap.time_to_target.cost_usd)} in "
                                              f"{format_duration(cheap.time_to_target.total_sec)}")
        lines.append(f"| {label} | {fast.system}: {format_duration(fast.time_to_target.total_sec)} | "
                     f"{cheapest} |")
    return "\n".join(lines)


def format_notes(predictions: Sequence[planning.Prediction]) -> str:
    """Where the figures come from: each step's model and calibration (the raw model beside it), the
    prices in one line, and why a row has no step or no cost."""
    notes, prices, hosts = [], {}, {}
    for p in predictions:
        if p.step_sec.value is None:
            notes.append(f"- {p.system}: not predicted ({p.step_sec.note}).")
            continue
        raw = "" if p.raw_step_sec is None else f"; raw model {_ms(p.raw_step_sec.value)}"
        notes.append(f"- {p.system}: {p.step_sec.basis} step, {p.step_sec.note}{raw}.")
        if not p.time_to_target.eval_sec:
            notes.append(f"- {p.system}: no evaluation time (no evaluation program); the time to target "
                         "is training only.")
        if p.price is None:  # A time to cost, and nothing to cost it at.
            notes.append(f"- {p.system}: no price for {p.device_kind}; give one as "
                         f"--price='{p.system}=USD_PER_CHIP_HOUR:SOURCE, DATE' or in a --prices file.")
        else:
            date = p.price.date if p.price.date not in ("", "undated") else "undated"
            usd = p.price.usd_per_chip_hour
            prices.setdefault(f"{p.device_kind} ${usd:.2f} ({p.price.basis}, {date})", 0)
        if p.host is not None:
            hosts.setdefault(f"{p.host.machine} ${p.host.usd_per_hour:.2f}/h a node", 0)
    if prices:
        notes.append("- Prices per chip-hour (sources and dates: planning/prices.json, and --json_out): "
                     + "; ".join(prices) + "." + (f" Host VMs billed apart: {'; '.join(hosts)}." if hosts
                                                  else ""))
    setup = format_duration(planning.ASSUMED_SETUP_SEC)
    notes.append("- Costs: one bill for every row: the chips (and host VMs billed apart) over the training, "
                 f"its evaluations and {setup} of set-up before the clock "
                 "(assumed, the same for every system: compiling and starting on the accelerator's hosts); "
                 "--json_out has each term. Intervals: the step's calibration (leave-one-out, or a borrowed "
                 "fit's measured miss; each row's note says which) and, in MLPerf mode, the reference runs' "
                 f"fewest and most epochs. ¹ Scaling efficiency: {EFFICIENCY_REFERENCE}.")
    return "\n".join(notes)


def require_matplotlib() -> None:
    """One `error:` line where --chart_out cannot be drawn, before anything is planned or printed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("error: --chart_out needs matplotlib: "
                         "pip install 'resnet_scaling[benchmarks]'") from None


def plot(predictions: Sequence[planning.Prediction], path: str) -> None:
    """Time and cost to the target against chips, log scale, one line per device kind, the intervals as
    error bars; the case study's published pod (7.9 minutes) marked on the time axis."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # No display: write the file only.
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (time_ax, cost_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    timed = [p for p in predictions if p.time_to_target.total_sec is not None]
    for i, kind in enumerate(sorted({p.device_kind for p in timed})):
        rows = sorted((p for p in timed if p.device_kind == kind), key=lambda p: p.num_chips)
        chips = [p.num_chips for p in rows]
        clocks = [p.time_to_target for p in rows]
        minutes = [c.total_sec / 60 for c in clocks]
        spread = [[(c.total_sec - (c.low_sec or c.total_sec)) / 60 for c in clocks],
                  [((c.high_sec or c.total_sec) - c.total_sec) / 60 for c in clocks]]
        time_ax.errorbar(chips, minutes, yerr=spread, fmt="o-", color=f"C{i}", capsize=3,
                         label=f"{kind} ({rows[0].step_sec.basis})")
        costed = [(p.num_chips, p.time_to_target) for p in rows if p.time_to_target.cost_usd is not None]
        if costed:
            cost_ax.errorbar([n for n, _ in costed], [c.cost_usd for _, c in costed],
                             yerr=[[c.cost_usd - (c.cost_low_usd or c.cost_usd) for _, c in costed],
                                   [(c.cost_high_usd or c.cost_usd) - c.cost_usd for _, c in costed]],
                             fmt="o-", color=f"C{i}", capsize=3, label=kind)
    case = planning.CASE_STUDY_POD
    time_ax.plot([case.num_chips], [case.minutes], "k*", markersize=12,
                 label=f"the case study: {case.minutes} min on {case.num_chips} x {case.device_kind} "
                       "(published)")
    time_ax.set(xscale="log", yscale="log", xlabel="chips",
                ylabel="minutes to the target (the recipe's epochs)",
                title="Time to target")
    cost_ax.set(xscale="log", yscale="log", xlabel="chips", ylabel="USD to the target",
                title="Cost to target (price file's dated prices)")
    dollars = FuncFormatter(lambda usd, _: f"${usd:,.0f}")  # Log axes label "6x10^1" otherwise.
    cost_ax.yaxis.set_major_formatter(dollars)
    cost_ax.yaxis.set_minor_formatter(dollars)
    for ax in (time_ax, cost_ax):
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
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


def _reference() -> dict[str, Any] | None:
    """The shipped compile report a program that cannot be compiled here is scaled from, while current."""
    name = planning.REFERENCE_CONFIG
    return shipped_reports.load_shipped_report(name, config_lib.config_hash(config_lib.load_config(name)))


def main(argv: list[str]) -> None:
    console.configure_command_line_logging()
    if _CHART_OUT.value:
        require_matplotlib()
    inputs = argv[1:]
    not_systems: list[str] = []
    what_if = None
    if _CONFIG.value is not None:  # A what-if: one config with train's overrides, read here at the edge.
        config = command_line.read_config_flag(_CONFIG)
        flag = config_lib.flag_values(sys.argv, "config")
        what_if = os.path.splitext(os.path.basename(flag[-1][2] if flag else "config"))[0], config
    if _ALL_CONFIGS.value or not inputs:  # Every shipped system, from the shipped reports (beside a what-if).
        systems, not_systems = shipped_systems()
        inputs += systems
    try:
        prices = planning.load_prices()
        if _PRICE_TABLE.value:
            prices.update(planning.load_prices(_PRICE_TABLE.value, basis="given"))
        by_system = dict(parse_price(text) for text in _PRICES.value)
        rate = parse_input_rate(_INPUT_RATE.value) if _INPUT_RATE.value else None
        fits = step_model.load_calibrations()
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    systems, names = [], []
    if what_if is not None:
        name, config = what_if
        try:
            system = system_of_config(name, config)
        except (OSError, ValueError, KeyError, errors.RunError) as e:
            raise SystemExit(f"error: --config: {e}") from None
        overrides = config_lib.command_line_overrides(sys.argv)
        if overrides:  # The row says what was asked, not the config's own name for other hardware.
            asked = ", ".join(f"{k}={v}" for k, v in overrides.items())
            system = dataclasses.replace(system, name=f"what-if: {name} with {asked}")
        systems.append(system)
        names.append({name, config.system.name, system.name})
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
    predictions = []
    for system, keys in zip(systems, names, strict=True):
        price = next((by_system[k] for k in keys if k in by_system), None) or planning.price_for(
            system.device_kind, prices)
        try:
            predictions.append(planning.predict(system, fits, price, rate))
        except ValueError as e:
            raise SystemExit(f"error: {system.name}: {e}") from None
    predictions = planning.with_scaling_efficiency(predictions, fits, systems)
    print(format_table(predictions))
    print()
    if len(predictions) > 1 and (best := format_best(predictions)):
        print(best)
        print()
    print(format_notes(predictions))
    if not_systems:
        print(f"- {', '.join(not_systems)}: not planned; these configs name no system "
              "(config.system.name is empty): they are not written for any hardware.")
    if _JSON_OUT.value:
        workdir.write_text_atomically(_JSON_OUT.value, json.dumps(
            {"efficiency_reference": EFFICIENCY_REFERENCE,
             "predictions": [dataclasses.asdict(p) for p in predictions]}, indent=2) + "\n")
        logger.info("Wrote %s.", _JSON_OUT.value)
    if _CHART_OUT.value:
        plot(predictions, _CHART_OUT.value)
        logger.info("Wrote %s.", _CHART_OUT.value)


if __name__ == "__main__":
    app.run(main, flags_parser=command_line.parse_config_flags)
