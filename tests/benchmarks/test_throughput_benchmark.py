"""benchmarks/throughput.py: images/sec over device counts, in process on the tests' 8 fake devices."""

import importlib.util
import json
import pathlib
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # It imports train_step.py from beside it.
    spec = importlib.util.spec_from_file_location("throughput", REPO / "benchmarks" / "throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scaling_is_against_the_first_point(throughput):
    points = throughput.with_scaling([
        {"images_per_sec": 100.0, "images_per_sec_per_device": 100.0},
        {"images_per_sec": 360.0, "images_per_sec_per_device": 90.0}])
    assert points[1]["speedup"] == pytest.approx(3.6)
    assert points[1]["scaling_efficiency"] == pytest.approx(0.9)


def test_weak_and_strong_scaling_batches(throughput):
    weak = throughput.parse_args(["--per_device_batch_size=4"])
    assert throughput.step_args(weak, 8).batch_size == 32 and throughput.step_args(weak, 8).num_devices == 8
    strong = throughput.parse_args(["--global_batch_size=64"])
    assert throughput.step_args(strong, 2).batch_size == 64
    with pytest.raises(SystemExit):
        throughput.parse_args(["--device_counts=0,2"])


def test_real_training_step_over_device_counts_writes_json(throughput, tmp_path, capsys):
    out = tmp_path / "tp.json"
    start = time.perf_counter()
    throughput.main(["--real_devices", "--device_counts=1,2", "--model=resnet_tiny", "--image_size=32",
                     "--per_device_batch_size=2", "--steps=1", "--warmup_steps=1", "--repeats=1",
                     f"--json_out={out}"])
    test_wall_sec = time.perf_counter() - start  # Measured here, apart from the benchmark's timers.
    result = json.loads(out.read_text())
    points = result["points"]
    assert [p["num_devices"] for p in points] == [1, 2]
    assert [p["global_batch_size"] for p in points] == [2, 4]
    # One timed repeat of one step per point: both points' timed steps fit within the benchmark's run as
    # this test measured it, so each point's images/sec is at least its batch over that run's seconds.
    assert sum(p["sec_per_step"] for p in points) < test_wall_sec
    assert all(p["images_per_sec"] >= p["global_batch_size"] / test_wall_sec for p in points), points
    # Weak scaling: each device runs the same 2 images, so twice the devices do twice the work (the
    # gradient all-reduce adds a little: measured 3%).
    assert points[1]["flops_per_step"] == pytest.approx(2 * points[0]["flops_per_step"], rel=0.05)
    # (Efficiency against the first point: test_scaling_is_against_the_first_point, with figures by hand.)
    assert result["scaling"] == "weak"
    assert "| 2 | 4 |" in capsys.readouterr().out


def test_train_step_reports_the_host_page_faults_and_memory_of_each_repeat(throughput, tmp_path, capsys):
    import train_step  # Beside throughput.py (the fixture put benchmarks/ on the path).

    out = tmp_path / "ts.json"
    train_step.main(["--model=resnet_tiny", "--image_size=32", "--batch_size=8", "--num_devices=1",
                     "--steps=2", "--warmup_steps=1", "--repeats=3", "--no-keep_freed_memory",
                     f"--json_out={out}"])
    host = json.loads(out.read_text())["host"]
    assert len(host["minor_page_faults_per_step"]) == 3 and len(host["resident_bytes_after"]) == 3
    assert all(f >= 0 for f in host["minor_page_faults_per_step"])
    # This process holds JAX, XLA and the suite's other work: far above 100 MiB, far below the machine.
    assert all(100 * 2**20 < b < 64 * 2**30 for b in host["resident_bytes_after"])
    assert "host: minor page faults per step" in capsys.readouterr().out
