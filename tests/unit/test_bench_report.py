"""``bench/report.py``: the results page's table from the benchmarks' acceptance checks, put
between its markers at the top of bench/RESULTS.md (replaced, not appended, on a rerun), and
a failed benchmark stops the report before anything is written."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PATH = Path(__file__).resolve().parents[2] / "bench" / "report.py"
spec = importlib.util.spec_from_file_location("bench_report", PATH)
assert spec is not None and spec.loader is not None
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

ROWS = [{"bench": "p2p", "what": "P=2 sendrecv 16MiB", "value": 1.0625, "target": ">= 1.0",
         "ok": True},
        {"bench": "allreduce", "what": "busbw P=3 64MiB", "impl": "pccl_aio", "value": 0.5,
         "target": ">= 1.0", "ok": False}]


def test_the_table_goes_between_the_markers_and_a_rerun_replaces_it(tmp_path, monkeypatch):
    page = tmp_path / "RESULTS.md"
    page.write_text("# Benchmark results\n\n## Older section\n\ntext\n")
    monkeypatch.setattr(report, "RESULTS", page)
    report.write(report.section(ROWS, ["p2p", "allreduce"]))
    first = page.read_text()
    assert first.startswith("# Benchmark results\n\n<!-- report:start -->\n## Current figures")
    assert "| p2p | P=2 sendrecv 16MiB | 1.062 | >= 1.0 | yes |" in first
    assert "| allreduce | busbw P=3 64MiB (pccl_aio) | 0.500 | >= 1.0 | **no** |" in first
    assert "1 of 2 targets met" in first and "`python bench/p2p.py --world 2 3" in first
    assert first.endswith("## Older section\n\ntext\n")
    report.write(report.section(ROWS[:1], ["p2p"]))
    second = page.read_text()
    assert second.count("<!-- report:start -->") == 1 and "allreduce" not in second
    assert "1 of 1 targets met" in second and second.endswith("## Older section\n\ntext\n")


def test_a_failing_benchmark_stops_the_report(monkeypatch):
    monkeypatch.setattr(report, "HERE", Path(sys.executable).parent)  # (no such script there)
    with pytest.raises(SystemExit, match="failed"):
        report.run("p2p", ["no_such_bench.py"])
