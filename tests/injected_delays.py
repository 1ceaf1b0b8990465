"""Known sleeps injected into a training run's causes of time (set-up, compiling, steps, input, evaluations,
saves), each timed where it happens: what the metrics and goodput tests hold the library's accounts to."""

import collections
import contextlib
import dataclasses
import time

from resnet_scaling import checkpointing, metrics
from resnet_scaling.training import trainer, training_setup


@dataclasses.dataclass
class InjectedDelays:
    """Known sleeps, each in one cause of a run's time, and what the test measured around them.

    `measured[cause]` holds, per occurrence, the seconds the patched call took (its sleep and the real work
    it wraps), timed inside the library's own timing of that cause: the library's figure for the cause can
    only be larger. Every other cause is timed elsewhere, so a sleep found in another cause's figure was
    booked in the wrong place.
    """

    setup_sec: float = 0.0  # In `training_setup.setup`: initialisation.
    compile_sec: float = 0.0  # In compiling the train step, inside `compile_train_step`'s timing.
    step_sec: float = 0.0  # On the host before each train step: training.
    input_sec: float = 0.0  # In `next(batches)` from each launch's second batch on: input waiting.
    eval_sec: float = 0.0  # In each `trainer.evaluate`.
    save_sec: float = 0.0  # In each `Checkpointer.save`.
    eval_top1: list[float] | None = None  # The top-1 each evaluation reports, in turn (default: its own).
    measured: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    images: list[int] = dataclasses.field(default_factory=list)  # Images each train step was given.
    step_walls: list[float] = dataclasses.field(default_factory=list)  # time.time() as each step began.
    setup_walls: list[float] = dataclasses.field(default_factory=list)  # time.time() as each set-up began.
    # time.time() as each goodput record began (the record reads the time itself after that).
    record_walls: list[float] = dataclasses.field(default_factory=list)
    # Each launch's training loop: perf_counter() before its clocks started, time.time() after.
    loop_starts: list[float] = dataclasses.field(default_factory=list)
    loop_start_walls: list[float] = dataclasses.field(default_factory=list)

    def total(self, cause: str) -> float:
        return sum(self.measured[cause])

    @contextlib.contextmanager
    def timing(self, cause: str):
        start = time.perf_counter()
        yield
        self.measured[cause].append(time.perf_counter() - start)


class _SlowToCompile:
    """The jitted train step: compiling it sleeps, and the program it compiles to sleeps before each step."""

    def __init__(self, jitted, delays: InjectedDelays):
        self._jitted, self._delays = jitted, delays

    def __getattr__(self, name):
        return getattr(self._jitted, name)

    def lower(self, *args, **kwargs):
        delays, start = self._delays, time.perf_counter()
        lowered = self._jitted.lower(*args, **kwargs)

        class Lowered:
            def compile(self):
                time.sleep(delays.compile_sec)
                compiled = lowered.compile()
                delays.measured["compile"].append(time.perf_counter() - start)  # Lowering included.
                return _SlowSteps(compiled, delays)

        return Lowered()


class _SlowSteps:
    """A compiled train step that sleeps on the host before each step and counts the images it is given."""

    def __init__(self, compiled, delays: InjectedDelays):
        self._compiled, self._delays = compiled, delays

    def __getattr__(self, name):  # cost_analysis(), memory_analysis(): the real program's.
        return getattr(self._compiled, name)

    def __call__(self, state, batch):
        self._delays.step_walls.append(time.time())
        self._delays.images.append(int(batch["images"].shape[0]))
        with self._delays.timing("step"):
            time.sleep(self._delays.step_sec)
            return self._compiled(state, batch)


class _SlowInput:
    """A data source whose training batches, from the second of each stream on, come after a sleep."""

    def __init__(self, source, delays: InjectedDelays):
        self._source, self._delays = source, delays

    def __getattr__(self, name):
        return getattr(self._source, name)

    def train_batches(self, start_step: int = 0):
        batches = iter(self._source.train_batches(start_step=start_step))
        yield next(batches)  # Fetched before compiling: set-up, not input waiting.
        while True:
            with self._delays.timing("input"):
                time.sleep(self._delays.input_sec)
                batch = next(batches)
            yield batch


def inject_delays(monkeypatch, **settings) -> InjectedDelays:
    """Patches the trainer's set-up, compilation, steps, input, evaluation and saves to sleep as
    `InjectedDelays(**settings)` says, timing each; returns it."""
    delays = InjectedDelays(**settings)
    scripted_top1 = iter(delays.eval_top1) if delays.eval_top1 is not None else None
    real_setup, real_evaluate = training_setup.setup, trainer.evaluate
    real_save, real_start = checkpointing.Checkpointer.save, metrics.RunClock.start
    real_record = metrics.GoodputRecorder.record

    def setup(*args, **kwargs):
        delays.setup_walls.append(time.time())
        with delays.timing("setup"):
            time.sleep(delays.setup_sec)
            run = real_setup(*args, **kwargs)
        return dataclasses.replace(run, train_step=_SlowToCompile(run.train_step, delays),
                                   source=_SlowInput(run.source, delays))

    def evaluate(*args, **options):
        with delays.timing("eval"):
            result = real_evaluate(*args, **options)
            time.sleep(delays.eval_sec)
        return result if scripted_top1 is None else {**result, "eval_top1": next(scripted_top1)}

    def save(self, *args, **kwargs):
        with delays.timing("save"):
            time.sleep(delays.save_sec)
            return real_save(self, *args, **kwargs)

    def start(self, *args, **kwargs):
        delays.loop_starts.append(time.perf_counter())
        real_start(self, *args, **kwargs)
        delays.loop_start_walls.append(time.time())

    def record(self, *args, **kwargs):
        delays.record_walls.append(time.time())
        real_record(self, *args, **kwargs)

    monkeypatch.setattr(training_setup, "setup", setup)
    monkeypatch.setattr(trainer, "evaluate", evaluate)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", save)
    monkeypatch.setattr(metrics.RunClock, "start", start)
    monkeypatch.setattr(metrics.GoodputRecorder, "record", record)
    return delays
