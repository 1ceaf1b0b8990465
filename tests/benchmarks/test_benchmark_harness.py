"""benchmarks/harness.py: what the benchmarks share (alternation, medians, ratios, JSON)."""

import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import harness

    return harness


def test_variants_alternate_within_each_repeat(harness):
    calls = []
    runs = harness.alternate({"a": lambda: calls.append("a") or len(calls),
                              "b": lambda: calls.append("b") or len(calls)}, repeats=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert runs == {"a": [1, 3, 5], "b": [2, 4, 6]}


def test_a_ratio_is_the_median_of_the_ratios_within_each_repeat(harness):
    fast, slow = [10.0, 30.0, 11.0, 12.0], [20.0, 33.0, 44.0, 12.0]
    # Load that drifts between repeats cancels: not the ratio of the medians (11.5 / 26.5). By hand: the
    # repeats' ratios 0.5, 10/11, 0.25 and 1, whose median is (0.5 + 10/11) / 2 = 31/44.
    assert harness.median_ratio(fast, slow) == pytest.approx(31 / 44)
    assert harness.medians({"fast": fast}) == {"fast": 11.5}
    with pytest.raises(ValueError):
        harness.median_ratio([1.0], [1.0, 2.0])


def test_the_json_records_where_it_was_measured_and_the_table_is_markdown(harness, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "result.json"
    harness.write_json(out, {"figure": 1.5, "environment": harness.environment(extra="x")})
    written = json.loads(out.read_text())
    assert written["figure"] == 1.5 and written["environment"]["extra"] == "x"
    assert {"command", "date", "cpu_model", "cpu_count", "python"} <= set(written["environment"])
    assert f"Wrote {out}" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["result.json"]  # No temporary file left beside it.
    assert harness.markdown_table(["a", "b"], [[1, "x"]]).splitlines() == ["| a | b |", "|---|---|",
                                                                            "| 1 | x |"]


def test_a_child_gives_the_json_of_its_last_line_or_its_stderr_as_the_error(harness, tmp_path):
    script = "import json, os, sys\nprint('noise')\nprint(json.dumps([sys.argv[1:], os.getcwd()]))\n"
    assert harness.run_child_json(script, ["a", "b"], {}, cwd=tmp_path) == [["a", "b"], str(tmp_path)]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        harness.run_child_json("print('{}')\n1 / 0", [], {}, cwd=tmp_path)
