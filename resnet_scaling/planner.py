"""Entry point: time and cost to MLPerf's ResNet-50 target (75.90% top-1), from compiled steps.

    python -m resnet_scaling.compile --config=pod --json_out=pod.json          # once per system
    python -m resnet_scaling.planner pod.json tpu_v2_8.json \
        --price="pod=USD_PER_CHIP_HOUR:where and when the price was read"

Prints one row per compile report: chips, global batch, epochs to the target at that batch (MLPerf's
reference runs), libtpu's estimate of the step time, images/sec, the training time to the target and,
where a price per chip-hour is given, its cost; every figure says where it comes from
(`resnet_scaling.analysis.planning` has the model and what it leaves out).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from absl import app, flags

from resnet_scaling import console
from resnet_scaling.analysis import planning
from resnet_scaling.metrics import format_duration
from resnet_scaling.resilience import workdir

logger = logging.getLogger("resnet_scaling.planner")  # Not __name__: "__main__" under `python -m`.

_PRICES = flags.DEFINE_multi_string(
    "price", [], 'A price per chip-hour for one system, "SYSTEM=USD:SOURCE" (SYSTEM: its report\'s file '
    'name without .json, or the system name in it), e.g. "pod=1.35:cloud.google.com/tpu/pricing, read '
    '2026-12-02"; none: no cost.')
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the predictions as JSON to this path.")


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


def format_table(predictions: list[planning.Prediction]) -> str:
    """The predictions as a Markdown table, each column's source in its header."""
    def hours(seconds: float | None) -> str:
        return "-" if seconds is None else format_duration(seconds)

    lines = ["| system | chips | global batch | epochs (published) | step (compiled) | images/sec | "
             "time to target, training | cost (given price) |", "|---|---|---|---|---|---|---|---|"]
    for p in predictions:
        step = "-" if p.step_sec is None else f"{p.step_sec * 1e3:,.2f} ms"
        images = "-" if p.images_per_sec is None else f"{p.images_per_sec:,.0f}"
        cost = "-" if p.cost_usd is None else f"${p.cost_usd:,.2f}"
        lines.append(f"| {p.system} | {p.num_chips} x {p.device_kind} | {p.global_batch:,} | "
                     f"{p.epochs:.1f} | {step} | {images} | {hours(p.train_sec)} | {cost} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    console.configure_command_line_logging()
    if len(argv) < 2:
        raise app.UsageError("Give one or more compile reports (python -m resnet_scaling.compile "
                             "--config=NAME --json_out=NAME.json).")
    try:
        prices = dict(parse_price(text) for text in _PRICES.value)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    predictions, names = [], set()
    for path in argv[1:]:
        try:
            report = json.loads(workdir.as_path(path).read_text())
            # A price names a system by its report's file name ("pod" for pod.json) or by its system name.
            keys = (workdir.as_path(path).stem, report.get("system", ""))
            names.update(keys)
            price = next((prices[key] for key in keys if key in prices), None)
            predictions.append(planning.predict(report, price))
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"error: {path}: {e}") from None
    unknown = set(prices) - names
    if unknown:
        raise SystemExit(f"error: --price names {', '.join(sorted(unknown))}, which no report is for.")
    print(format_table(predictions))
    if _JSON_OUT.value:
        workdir.write_text_atomically(_JSON_OUT.value, json.dumps(
            [dataclasses.asdict(p) for p in predictions], indent=2) + "\n")
        logger.info("Wrote %s.", _JSON_OUT.value)


if __name__ == "__main__":
    app.run(main, flags_parser=console.parse_flags)
