"""benchmarks/decode_step_repeat.py: the spreads between two measurements of a decode_step table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("decode_step_repeat", ROOT / "benchmarks" / "decode_step_repeat.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _table(seconds, batch=(1, 2), context=(16, 64, 256)):
    return {"grid": {"batch": list(batch), "context": list(context)}, "seconds": seconds}


def test_a_drift_in_measuring_order_shows_as_runs_of_one_sign():
    m = _module()
    a = _table([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
    # the first batch's cells 1% slower, the second's 1% faster: two runs, ratios to 16 unchanged
    b = _table([[1.01, 2.02, 4.04], [0.99, 1.98, 3.96]])
    c = m.compare(a, b)
    assert c["cells"] == 6 and c["sign_runs"] == [3, 3]
    assert c["cell_spread"]["median"] == pytest.approx(0.01)
    assert c["shape_spread"]["max"] == pytest.approx(0.0, abs=1e-12)
    assert c["lag1_correlation"] > 0.5
    # shared cells only: a wider grid on one side is cut to the common cells
    wide = _table([[1.0, 2.0, 4.0, 8.0]] * 3, batch=(1, 2, 4), context=(16, 64, 256, 1024))
    assert m.compare(a, wide)["cells"] == 6


def test_unreadable_inputs_get_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    m = _module()
    (tmp_path / "p.json").write_text(json.dumps({"components": {"linear": {}}}))
    (tmp_path / "q.json").write_text("{")
    for bad, says in (("p.json", "no decode_step table"), ("q.json", "not a readable JSON profile")):
        monkeypatch.setattr("sys.argv", ["decode_step_repeat.py", str(tmp_path / bad), str(tmp_path / bad)])
        assert m.main() == 2
        assert says in capsys.readouterr().err
    one = {"components": {"decode_step": _table([[1.0]], batch=(1,), context=(16,))}}
    (tmp_path / "one.json").write_text(json.dumps(one))
    monkeypatch.setattr("sys.argv", ["decode_step_repeat.py", str(tmp_path / "one.json"), str(tmp_path / "one.json")])
    assert m.main() == 2
    assert "share 1 cell(s)" in capsys.readouterr().err
    # one shared context: no ratio between contexts, still one summary line
    col = {"components": {"decode_step": _table([[1.0], [2.0]], context=(64,))}}
    (tmp_path / "col.json").write_text(json.dumps(col))
    monkeypatch.setattr("sys.argv", ["decode_step_repeat.py", str(tmp_path / "col.json"), str(tmp_path / "col.json")])
    assert m.main() == 0
    assert "one shared context: no ratio between contexts" in capsys.readouterr().out


def test_the_committed_same_lease_comparison_regenerates():
    m = _module()
    d = ROOT / "benchmarks" / "results" / "fidelity-h100-decode-repeat"
    got = m.compare(m.table(str(d / "llama-3-8b-decode_step-pass1.json")),
                    m.table(str(d / "llama-3-8b-decode_step-pass2.json")))
    want = json.loads((d / "same-lease.json").read_text())
    assert got["cell_spread"] == pytest.approx(want["cell_spread"])
    assert got["sign_runs"] == want["sign_runs"]
