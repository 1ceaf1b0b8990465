"""What a user sees: the demo (what it learns from its JPEG files, its console: short, ending with the
headline), a config file with overrides and the flags that bring back what the console hides, the TensorBoard
tags, and progress for library users who configured no logging."""

import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from resnet_scaling.training import trainer
from tests.helpers import launch_xla_flags, random_arrays, tiny_config, users_compile, without_suite_cache

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cli_env():
    # A user's environment: no fake devices, the repository importable as an installed package is.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return {**env, "PYTHONPATH": str(REPO)}


def _run_timing_its_exit(command, *, cwd, env, timeout_sec):
    """Runs `command`, reading its stdout and stderr as they come; returns (the finished process, with its
    output as text, as `subprocess.run` gives it; the seconds from its last output line to its exit)."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    texts, last_line_at = {"stdout": [], "stderr": []}, [time.monotonic()]

    def read(stream, into):
        for line in stream:
            into.append(line)
            last_line_at[0] = time.monotonic()

    readers = [threading.Thread(target=read, args=(getattr(proc, name), into))
               for name, into in texts.items()]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout_sec)
        exited_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
        for reader in readers:
            reader.join()
    done = subprocess.CompletedProcess(command, proc.returncode, "".join(texts["stdout"]),
                                       "".join(texts["stderr"]))
    return done, exited_at - last_line_at[0]


@pytest.mark.slow
def test_the_demo_command_learns_from_jpeg_files_and_prints_under_60_lines_ending_with_the_headline(
        tmp_path, demo_dataset):
    """The README's demo command, run by its short name from another directory, as a user would: the suite's
    one run of the whole demo, so it also checks what the run learnt, read and measured. Its dataset is the
    session's (conftest's `demo_dataset`, written once for this test and the MLPerf demo's)."""
    workdir, cache = tmp_path / "demo", pathlib.Path(demo_dataset["cache_dir"])
    command = [sys.executable, "-m", "resnet_scaling.train", "--config=demo", f"--workdir={workdir}",
               f"--config.data.cache_dir={cache}"]
    # Compiled as a user's run is, with the workdir's compilation cache (not the suite's).
    env = without_suite_cache(users_compile(_cli_env()))
    start = time.perf_counter()
    proc, exit_sec = _run_timing_its_exit(command, cwd=tmp_path, env=env, timeout_sec=600)
    test_wall_sec = time.perf_counter() - start  # Measured here, apart from the trainer's clocks.
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Each console line is the local time of day and the message, without absl's prefix (level, date,
    # thread id, file and line).
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) < 60, "\n".join(lines)
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in lines), "\n".join(lines)
    assert not any(re.search(r"[IWEF]\d{4} |\.py:\d+\]", line) for line in lines), "\n".join(lines)
    messages = [line.split(" ", 1)[1] for line in lines]
    # 6 epochs of 12,000 images at 128 a step: 562.5 steps, the last one partial.
    headline_start = max(i for i, m in enumerate(messages) if m.startswith("Done: step 563 of 563"))
    headline = messages[headline_start:]
    # The process ends soon after its last log line (the headline's), not half a minute later: that is how
    # long deleting the tf.data training iterator could wait on its autotuning thread (data/pipeline.py,
    # _delete_iterator). Both ends are seen here, on one clock: the line as it arrived, the exit as it came.
    # The bound is a quarter of this run's training loop (11 s of 44 on a quiet machine), so that a loaded
    # machine, which slows both, does not fail it, while that fixed wait of 30 s still would.
    summary = json.loads((workdir / "summary.json").read_text())
    loop_sec = summary["time"]["wall_sec"]
    assert exit_sec < loop_sec / 4, (exit_sec, loop_sec)
    top1 = re.fullmatch(r"  top-1: final (\d+\.\d\d)%, best (\d+\.\d\d)%", headline[1])
    assert top1, headline[1]
    # The README's figure is 98% top-1 on the held-out images, 10 classes (chance: 10%).
    assert 90.0 <= float(top1[1]) <= float(top1[2]), headline[1]
    assert "images/sec in the steady state" in headline[2]
    assert headline[3].startswith("  time to 76.00% top-1: ") and "not reached" not in headline[3]
    assert headline[4].startswith("  goodput: ") and "over 1 launch(es); badput: " in headline[4]
    assert {m.split(":")[0].strip() for m in headline[5:]} == {
        "summary", "TensorBoard", "checkpoints", "best weights", "exported weights"}
    assert all(pathlib.Path(m.split(": ", 1)[1]).exists() for m in headline[5:])
    # What the console leaves out by default (the flags of the next test bring it back): other libraries'
    # INFO lines, the config, the allocator's setting (a debug line; the freed memory is kept, and set
    # before JAX's backend started: no warning that it came too late).
    assert not any("checkpoint_manager" in line or "E0000" in line or "oneDNN" in line for line in lines)
    assert "crop_area_range" not in proc.stdout + proc.stderr
    assert not any("what a step frees is kept for the next" in m or "glibc" in m for m in messages)
    assert "asynchronous CPU dispatch is on" not in proc.stderr
    # The set-up in words a newcomer reads once: the devices, the learning rate's warm-up and the untimed
    # steps named apart, the compilation cache named once the run has started.
    assert "Devices: 1 x cpu in 1 process; mesh axes {'data': 1}." in messages
    assert any(m.startswith("Batch: 128 global, 128 per device; 563 steps") and
               m.endswith("learning rate 0.05 at its peak after 46 warm-up steps.")
               for m in messages), messages
    assert "Timing: images/sec and time to accuracy are measured after step 94 (training.timing_warmup_*)." \
        in messages
    assert sum(f"compilation cache {workdir}/compilation_cache" in m for m in messages) == 1
    # Progress at every log point: where it is, the loss, images/sec and the time left. Every 25 steps and
    # at the end; on a machine slow enough, also 30 s after the last line (training.log_every_sec).
    line = r"step (\d+)/563 \(epoch [\d.]+\): loss [\d.]+, .*, [\d.]+ images/sec, ETA \S+"
    progress = [re.fullmatch(line, m) for m in messages if m.startswith("step ")]
    logged = [int(p[1]) for p in progress if p]
    assert all(progress) and logged == sorted(set(logged)) and {*range(25, 563, 25), 563} <= set(logged), \
        messages
    assert f"final {100 * summary['accuracy']['final_eval_top1']:.2f}%" in headline[1]
    # The README's table of what the workdir holds names what is there: each path, and nothing left out.
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("The workdir holds what the run wrote"):].split("\n\n")[1]
    listed = {re.sub(r"<[^>]+>", "*", name) for name in re.findall(r"`([^`]+)`", "\n".join(
        row.split(" | ")[0] for row in table.splitlines()[2:]))}
    assert all(list(workdir.glob(name.rstrip("/"))) for name in listed), listed
    assert {p.name for p in workdir.iterdir()} <= {name.split("/")[0] for name in listed}, listed
    assert json.loads((workdir / "config.json").read_text())["model"]["name"] == "resnet18"

    # It read real files through the input pipeline: JPEGs in 10 class folders, written once into the
    # cache, 12,000 to train on and 2,000 held out (the classes take turns: 1,200 and 200 each).
    (root,) = cache.glob("shapes-*")
    assert str(root) == demo_dataset["root"]  # The folder the demo's config names: not written again.
    assert f"Input: class folders in {root}" in proc.stderr
    assert not any(m.startswith("Writing the demo dataset") for m in messages), messages
    # A first run writes it, in about half a minute, saying so first (the session's writer logged it so).
    written = demo_dataset["messages"]
    assert written[0] == f"Writing the demo dataset (14,000 JPEGs) to {root}, once; about 30 s.", written
    for split, per_class in (("train", 1200), ("val", 200)):
        folders = list((root / split).iterdir())
        assert len(folders) == 10 and all(len(list(f.glob("*.jpg"))) == per_class for f in folders), split
    assert next((root / "train").glob("*/*.jpg")).read_bytes()[:2] == b"\xff\xd8"  # A JPEG's first bytes.

    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_top1" in r]
    # A log point every 25 steps and at the end (and any by time, as above); the training loss falls (2.3
    # to 0.1 on this machine).
    assert [r["step"] for r in train] == logged
    assert train[-1]["loss"] < 0.2 * train[0]["loss"], [r["loss"] for r in train]
    # An evaluation every 2 epochs (187.5 steps) and at the end, each of every held-out image once; the
    # last is the headline's.
    assert [(r["step"], r["eval_count"]) for r in evals] == [(188, 2000), (376, 2000), (563, 2000)]
    assert evals[-1]["eval_top1"] == summary["accuracy"]["final_eval_top1"]
    # Each log interval's seconds, and the seconds its images (128 a step) take at its images/sec, fit
    # with all the others within the run's time as this test measured it.
    interval_sec = implied_sec = 0.0
    for previous, record in zip([{"step": 0}, *train], train, strict=False):
        steps = record["step"] - previous["step"]
        interval_sec += steps * record["sec_per_step"]
        implied_sec += steps * 128 / record["images_per_sec"]
    assert interval_sec < test_wall_sec and implied_sec < test_wall_sec
    throughput = summary["throughput"]
    assert throughput["steady_state_steps"] * 128 / throughput["images_per_sec"] < test_wall_sec


@pytest.mark.slow
def test_a_config_file_with_overrides_trains_and_flags_bring_back_what_the_console_hides(tmp_path):
    """The config given as a file path (from the repository) with overrides, and the flags that undo the
    console's defaults (the demo test above checks those defaults; test_command_line_edges checks
    --print_config, which prints the config and exits): --verbosity=0 brings back other libraries' INFO
    lines, --nokeep_freed_memory turns the kept memory off."""
    workdir = tmp_path / "run"
    args = ["--config=configs/demo.py", f"--workdir={workdir}", "--config.model.name=resnet_tiny",
            "--config.data.num_train_examples=256", "--config.data.num_eval_examples=64",
            "--config.training.num_train_steps=4", "--config.training.global_batch_size=32",
            "--config.training.log_every_steps=2", "--config.eval.global_batch_size=32",
            "--config.training.tensorboard=false", f"--config.data.cache_dir={tmp_path / 'cache'}",
            "--verbosity=0", "--nokeep_freed_memory"]
    # One CPU device, as a user's shell has, compiling as the suite's launches do (XLA's older CPU emitters:
    # this run's programs in about a third of the time); the demo above compiles as a user's run does.
    env = {**_cli_env(), "XLA_FLAGS": launch_xla_flags()}
    proc = subprocess.run([sys.executable, "-m", "resnet_scaling.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stderr
    # The overrides: the model, the batch, the dataset's sizes and the run's length; progress every 2 steps.
    assert json.loads((workdir / "config.json").read_text())["model"]["name"] == "resnet_tiny"
    for expected in ("Devices: 1 x cpu", "32 global, 32 per device", "Compiled the train step",
                     "step 4/4", "images/sec", "ETA", "over 64 images"):
        assert expected in log, expected
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [2, 4]
    # The flags.
    assert "checkpoint_manager.py" in log
    assert "what a step frees is kept for the next" not in proc.stdout + log


def test_tensorboard_groups_train_and_eval_tags_and_holds_the_config(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    config = tiny_config(training__tensorboard=True, eval__every_epochs=0.5)
    trainer.train_and_evaluate(config, str(tmp_path), arrays=random_arrays())
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"),
                                                size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])  # clu writes scalars and text as tensor summaries.
    assert {"train/loss", "train/top1", "train/learning_rate", "train/images_per_sec", "eval/top1",
            "eval/loss", "config"} <= tags
    assert not {t for t in tags if t.endswith(("/step", "/eval_count", "/count"))}
    assert "resnet_tiny" in events.Tensors("config")[0].tensor_proto.string_val[0].decode()
    # Each point is metrics.jsonl's record of that step, as float32 (what TensorBoard keeps).
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for tag, key in (("train/loss", "loss"), ("eval/top1", "eval_top1")):
        points = [(e.step, e.tensor_proto.float_val[0]) for e in events.Tensors(tag)]
        expected = [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in records if key in r]
        assert points == expected and len(points) == 2, (tag, points, expected)


def test_a_second_event_file_of_the_same_second_and_process_leaves_the_first_whole(tmp_path, monkeypatch):
    """A run resumed in the same process within a second (a library user's retry) opens a second event file:
    named apart, so that the first run's points are all still read."""
    from tensorboard.backend.event_processing import event_accumulator

    from resnet_scaling.metrics import writers

    monkeypatch.setattr(writers.time, "time", lambda: 1_800_000_000.0)  # Both files in one second.
    for step, loss in ((1, 2.5), (2, 1.5)):
        writer = writers.TensorBoardWriter(str(tmp_path))
        writer.write(step, {"loss": loss})
        writer.close()
    assert len(list(tmp_path.glob("events.out.tfevents.1800000000.*"))) == 2
    events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    points = [(e.step, e.tensor_proto.float_val[0]) for e in events.Tensors("train/loss")]
    assert points == [(1, 2.5), (2, 1.5)]


def test_show_progress_prints_the_time_past_a_bare_basic_config_and_gives_way_to_a_configured_handler(
        capsys):
    """In-process, the two states of a script's logging: only absl's implicit `logging.basicConfig()` (our
    line once, with the time), then a handler the user added (our lines go to it; ours is gone)."""
    import io
    import logging

    from resnet_scaling.job import console

    root, ours = logging.root, logging.getLogger("resnet_scaling")
    root_handlers, our_handlers, our_level, our_propagate = (
        root.handlers[:], ours.handlers[:], ours.level, ours.propagate)
    try:
        root.handlers, ours.handlers, ours.propagate = [], [], True
        ours.setLevel(logging.NOTSET)
        logging.basicConfig()  # What absl.logging.log calls when the root has no handler.
        console.show_progress()
        console.show_progress()  # Every run calls it: one handler, whatever the number of runs.
        assert len(ours.handlers) == 1
        logging.getLogger("resnet_scaling.training.trainer").info("step 1/2")
        assert re.fullmatch(r"\d\d:\d\d:\d\d step 1/2\n", capsys.readouterr().err)
        stream = io.StringIO()
        users = logging.StreamHandler(stream)
        users.setFormatter(logging.Formatter("user: %(message)s"))
        root.addHandler(users)
        console.show_progress()  # The next run.
        logging.getLogger("resnet_scaling.training.trainer").info("step 2/2")
        assert stream.getvalue() == "user: step 2/2\n" and ours.handlers == []
    finally:
        root.handlers, ours.handlers, ours.propagate = root_handlers, our_handlers, our_propagate
        ours.setLevel(our_level)


def test_the_console_shows_the_time_and_the_message_and_names_other_libraries_warnings():
    """absl's prefix ("I1205 18:31:42.725527 139642937236352 trainer.py:439] ") is gone from the console;
    a warning or an error says so, with the library's name when it is another's, whose traceback is one
    pointer to the log file (ours stays whole: it is the error the user reads)."""
    import logging

    from resnet_scaling.job.console import ConsoleFormatter

    def record(name, level, message, exc_info=None):
        made = logging.LogRecord(name, level, "trainer.py", 439, message, (), exc_info)
        made.created = time.mktime((2026, 12, 5, 18, 31, 42, 0, 0, -1)) + 0.725
        return made

    try:
        raise ValueError("boom")
    except ValueError:
        failure = sys.exc_info()
    formatter = ConsoleFormatter("/w/logs/h-1.log")
    assert formatter.format(record("resnet_scaling.training.trainer", logging.INFO, "step 25/563")) == \
        "18:31:42 step 25/563"
    assert formatter.format(record("resnet_scaling.training.trainer", logging.WARNING, "Resuming")) == \
        "18:31:42 warning: Resuming"
    assert formatter.format(record("absl", logging.WARNING, "Variant folder")) == \
        "18:31:42 warning (absl): Variant folder"
    assert formatter.format(record("orbax.checkpoint.x", logging.ERROR, "save failed", failure)) == \
        "18:31:42 error (orbax): save failed [traceback: /w/logs/h-1.log]"
    ours = formatter.format(record("resnet_scaling.train", logging.ERROR, "The run failed:", failure))
    assert ours.startswith("18:31:42 error: The run failed:\nTraceback") and ours.endswith("ValueError: boom")


_LATE_CALLBACKS = """
import asyncio, sys
from absl import app
from resnet_scaling.job import console

def main(argv):
    print(console.configure_command_line_logging(sys.argv[1]))
    loop = asyncio.new_event_loop()
    loop.close()

    class LateWrite:  # As TensorStore's writes that finish after orbax closed their save's loop.
        def __del__(self):
            loop.call_soon_threadsafe(print)

    class Broken:
        def __del__(self):
            raise ValueError("another kind")

    LateWrite(), LateWrite(), Broken()

app.run(main)
"""


def test_callbacks_into_a_closed_event_loop_go_to_the_log_file_and_other_ignored_exceptions_still_print(
        tmp_path):
    """A full disk made each of a failed save's later writes print a traceback ("Event loop is closed"),
    dozens above the run's error line. Python's own hook prints them (the run with --verbosity, which
    keeps the console as Python and absl make it, shows they are real); the console's set-up sends them whole
    to the log file, and leaves any other exception Python cannot raise to Python's hook."""
    script = tmp_path / "late_callbacks.py"
    script.write_text(_LATE_CALLBACKS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(workdir, *flags):
        return subprocess.run([sys.executable, str(script), str(workdir), *flags], env=env,
                              capture_output=True, text=True, timeout=120, check=True)

    python_s = run(tmp_path / "verbose", "--verbosity=0")
    assert python_s.stderr.count("RuntimeError: Event loop is closed") == 2
    ours = run(tmp_path / "run")
    log_file = ours.stdout.strip()
    assert pathlib.Path(log_file).parent == tmp_path / "run" / "logs"
    assert "Event loop is closed" not in ours.stderr and "LateWrite" not in ours.stderr  # Not even a line.
    assert "Exception ignored in: <function" in ours.stderr and "ValueError: another kind" in ours.stderr
    logged = pathlib.Path(log_file).read_text()
    assert logged.count("RuntimeError: Event loop is closed") == 2
    assert logged.count("Exception ignored in: <function main.<locals>.LateWrite.__del__") == 2
    assert "another kind" not in logged
