"""benchmarks/throughput.py: images/sec over device counts, in process on the tests' 8 fake devices."""

import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


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
    throughput.main(["--real_devices", "--device_counts=1,2", "--model=resnet_tiny", "--image_size=32",
                     "--per_device_batch_size=2", "--steps=1", "--warmup_steps=1", "--repeats=1",
                     f"--json_out={out}"])
    result = json.loads(out.read_text())
    assert [p["num_devices"] for p in result["points"]] == [1, 2]
    assert [p["global_batch_size"] for p in result["points"]] == [2, 4]
    assert all(p["images_per_sec"] > 0 and p["flops_per_step"] > 0 for p in result["points"])
    assert result["points"][0]["scaling_efficiency"] == 1.0 and result["scaling"] == "weak"
    assert "| 2 | 4 |" in capsys.readouterr().out
