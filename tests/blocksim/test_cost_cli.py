"""--cost-model and --cost-profile on the command line: one line and exit 2 for bad input, and the
cost model a run used recorded in summary.json."""

import json

import pytest
from cost_profiles import synthetic_profile

from blocksim.cli import main


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n0.01,30,4\n")
    return p


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_profiled_run_records_its_profile(tmp_path, trace, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(synthetic_profile()))
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--cost-profile", prof, "--quiet", "--no-report"],
                       capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["cost_model"]["name"] == "profiled" and s["cost_model"]["profile"] == str(prof)
    assert s["cost_model"]["extrapolated_steps"] == {}


@pytest.mark.parametrize("change, expect", [
    ({"model": "mistral-7b"}, "'mistral-7b'"),
    ({"gpu": "h200-141gb"}, "'h200-141gb'"),
    ({"format": "blocksim-profile/2"}, "blocksim-profile/2"),
])
def test_bad_profiles_get_one_line_and_exit_2(tmp_path, trace, capsys, change, expect):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({**synthetic_profile(), **change}))
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--cost-profile", prof, "--quiet", "--no-report"],
                       capsys)
    assert code == 2 and expect in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_profiled_without_a_profile_is_refused(tmp_path, trace, capsys, monkeypatch):
    monkeypatch.setattr("blocksim.cost.profile_file.PROFILES_DIR", tmp_path)
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--cost-model", "profiled", "--quiet",
                        "--no-report"], capsys)
    assert code == 2 and "no shipped profile" in err and "--cost-profile" in err


def test_extrapolated_steps_are_warned_in_one_line(tmp_path, capsys):
    prof = synthetic_profile()
    prof["components"]["attn_prefill"]["grid"]["new_tokens"] = [16, 32]
    prof["components"]["attn_prefill"]["seconds"] = [[[1e-4] * 4] * 2] * 4
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n")
    code, _, err = run(["replay", t, "--out", tmp_path / "o", "--cost-profile", path, "--quiet", "--no-report"], capsys)
    assert code == 0
    assert err.startswith("blocksim: warning: cost profile") and "attn_prefill.new_tokens 1" in err
