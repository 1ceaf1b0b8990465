"""benchmarks/torch_baseline.py: the PyTorch row's control flow (skip where torch is missing, a tiny timed run
where it is installed) and its ResNet-50; the JAX rows are the train-step benchmark's, tested there."""

import importlib.util
import json
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def torch_baseline(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # It imports harness.py from beside it.
    spec = importlib.util.spec_from_file_location("torch_baseline", REPO / "benchmarks" / "torch_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_torch_the_row_says_so_and_the_run_succeeds(torch_baseline, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch_baseline, "torch_available", lambda: False)
    out = tmp_path / "tb.json"
    torch_baseline.main(["--frameworks=torch", f"--json_out={out}"])
    printed = capsys.readouterr().out
    assert printed.count("torch: skipped: PyTorch is not installed") == 1
    assert "| PyTorch ResNet-50 v1.5 (channels-last, eager) | skipped:" in printed
    assert "not installed" in json.loads(out.read_text())["frameworks"]["torch"]["skipped"]


def test_arguments_are_checked(torch_baseline):
    with pytest.raises(SystemExit):
        torch_baseline.parse_args(["--frameworks=ours,tensorflow"])
    with pytest.raises(SystemExit):
        torch_baseline.parse_args(["--steps=0"])
    assert torch_baseline.parse_args([]).frameworks == ["ours", "ours_nokeep", "flax_example", "torch"]


def test_torch_resnet50_is_v1_5_with_the_library_parameter_count(torch_baseline):
    torch = pytest.importorskip("torch")
    model, _ = torch_baseline.torch_resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # As models.resnet50 and torchvision.
    strided = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.stride == (2, 2)]
    # v1.5: the stem, then per downsampling block the 3x3 convolution and the projection.
    assert [m.kernel_size for m in strided] == [(7, 7)] + [(3, 3), (1, 1)] * 3


def test_a_tiny_torch_run_times_every_repeat_in_a_worker_process(torch_baseline, tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "tb.json"
    torch_baseline.main(["--frameworks=torch", "--image_size=32", "--batch_size=2", "--steps=1",
                         "--warmup_steps=0", "--repeats=2", f"--json_out={out}"])
    row = json.loads(out.read_text())["frameworks"]["torch"]
    assert len(row["images_per_sec_repeats"]) == 2 and row["images_per_sec_median"] > 0
    assert row["peak_rss_bytes"] > 100 * 2**20  # The worker's own peak: torch and a ResNet-50.
    assert row["num_params"] == 25_557_032
    assert "| PyTorch ResNet-50 v1.5" in capsys.readouterr().out


def _process_state(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_only_the_framework_being_timed_runs(torch_baseline, monkeypatch, tmp_path):
    """The others are stopped while one repeat runs: an idle PyTorch process still spins on the CPU."""
    if not pathlib.Path("/proc/self/stat").exists():
        pytest.skip("needs /proc")
    states = []

    class FakeWorker(torch_baseline.Worker):
        """A real worker process that sleeps instead of building a framework."""

        def __init__(self, name, args):
            self.name = name
            self.process = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, text=True)
            self.info = {}
            workers.append(self)

        def time_repeat(self):
            # A SIGSTOP takes effect when the process is next scheduled: the test waits for that event (the
            # others' state "T"); the minute is a guard against a stop that never comes, not a bound.
            deadline = time.monotonic() + 60
            while True:
                stopped = {w.name: _process_state(w.process.pid) == "T" for w in workers}
                if sum(stopped.values()) == len(workers) - 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            states.append(stopped)
            return 1.0

        def close(self):
            self.resume()
            self.process.kill()
            self.process.wait()
            return 0

    workers = []
    monkeypatch.setattr(torch_baseline, "Worker", FakeWorker)
    monkeypatch.setattr(torch_baseline, "torch_available", lambda: True)
    torch_baseline.main(["--repeats=2", f"--json_out={tmp_path / 'x.json'}"])
    assert states == [{name: name != timed for name in torch_baseline.FRAMEWORKS}
                      for timed in torch_baseline.FRAMEWORKS * 2]
