"""The command line: bad input gets a one-line message and exit status 2, config files and flags combine."""

import json

import pandas as pd
import pytest

from blocksim.cli import build_parser, main, read_config_file
from blocksim.options import BY_NAME, CONFIG_OPTIONS, FILE_KEYS, RUN_OPTIONS
from tests.blocksim.test_policies import IGNORED_KNOBS


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [100, 200, 300],
                  "output_tokens": [5, 6, 7]}).to_csv(path, index=False)
    return path


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("text, message", [
    ("max_num_seqs: '8'\n", "scheduler.max_num_seqs: expected an integer"),
    ("num_gpu_blocks: 100.5\n", "cache.num_gpu_blocks: expected an integer"),
    ("chunked_prefill: 'false'\n", "policy.chunked_prefill: expected true/false"),
    ("watermark_blocks: 100000\n", "policy.watermark_blocks"),
    ("blok_size: 16\n", "unknown option(s) ['blok_size']"),
    ("- 1\n- 2\n", "config file"),
])
def test_bad_config_files_name_the_field(tmp_path, trace, capsys, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--config", cfg, "--quiet", "--no-report"], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_config_file_options_and_flags_combine(tmp_path, trace, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: orca-oracle\nmax_requests: 1\nrate_scale: 2.0\nnum_gpu_blocks: 400\n")
    code, out, _ = run(["replay", trace, "--out", tmp_path / "o", "--config", cfg, "--max-requests", "2",
                        "--quiet", "--no-report"], capsys)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert code == 0 and summary["config"]["policy"] == "orca-oracle"
    assert summary["requests"] == 2, "the flag overrides the file"
    assert summary["rate_scale"] == 2.0, "the file's rate_scale applies"


@pytest.mark.parametrize("flag, value", [("--rate-scale", "0"), ("--rate-scale", "-2"), ("--max-requests", "-1")])
def test_impossible_numbers_are_refused_by_the_parser(tmp_path, trace, flag, value):
    with pytest.raises(SystemExit) as e:
        main(["replay", str(trace), "--out", str(tmp_path / "o"), flag, value])
    assert e.value.code == 2


def test_bad_trace_rows_and_cost_profiles_get_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,0\n")
    code, _, err = run(["replay", bad, "--out", tmp_path / "o", "--quiet", "--no-report"], capsys)
    assert code == 2 and "Traceback" not in err and "output_tokens" in err
    good = tmp_path / "good.csv"
    good.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,3\n")
    for text in ('{"params": {"flops_efficiency": "0.5"}}', "[1, 2]"):
        prof = tmp_path / "p.json"
        prof.write_text(text)
        code, _, err = run(["replay", good, "--out", tmp_path / "o", "--cost-profile", prof, "--quiet",
                            "--no-report"], capsys)
        assert code == 2 and "cost" in err and "Traceback" not in err


def _flags(knobs: dict) -> list[str]:
    out = []
    for name, value in knobs.items():
        flag = BY_NAME[name].flag
        if isinstance(value, bool):
            out.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            out += [flag, str(value)]
    return out


@pytest.mark.parametrize("preset, knobs, flag, why", IGNORED_KNOBS)
def test_a_flag_the_chosen_allocator_or_scheduler_ignores_exits_2_with_one_line(tmp_path, trace, capsys, preset,
                                                                                 knobs, flag, why):
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--policy", preset, *_flags(knobs), "--quiet",
                        "--no-report"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert why in err and f"drop {flag}" in err
    assert not (tmp_path / "o" / "summary.json").exists(), "nothing ran"


def test_an_ignored_knob_from_a_config_file_is_refused_too(tmp_path, trace, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: orca-max\nwatermark: 0.0\n")
    code, _, err = run(["replay", trace, "--out", tmp_path / "o", "--config", cfg, "--quiet", "--no-report"], capsys)
    assert code == 2 and "watermark (--watermark)" in err and "contiguous allocator" in err


def test_every_option_of_the_table_is_a_flag_of_replay_and_a_config_file_key(tmp_path):
    replay_parser = build_parser()._subparsers._group_actions[0].choices["replay"]
    dests = {a.dest for a in replay_parser._actions}
    assert set(FILE_KEYS) <= dests
    flags = {s for a in replay_parser._actions for s in a.option_strings}
    assert {"--swap-space", "--tp", "--tensor-parallel", "--no-prefix-caching", "--clip-to-model"} <= flags
    cfg = tmp_path / "all.yaml"
    cfg.write_text("".join(f"{k}: null\n" for k in FILE_KEYS))
    assert set(read_config_file(str(cfg))) == set(FILE_KEYS)


def test_the_demo_is_a_fixed_story_with_no_configuration_flags():
    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    dests = {a.dest for a in demo._actions}
    assert not (set(CONFIG_OPTIONS) | set(RUN_OPTIONS)) & dests, "the demo's setup is its own, not the user's"


def test_replay_loads_no_other_commands_module():
    """`blocksim replay` builds its parser without importing the modules of the other commands
    (`COMMAND_MODULES`, but traces.cli, whose trace-reading options replay shares); the whole
    parser (`blocksim --help`) has every command."""
    import subprocess
    import sys

    from blocksim.cli import BUILT_IN_COMMANDS, COMMAND_MODULES

    code = ("import sys; from blocksim.cli import build_parser, COMMAND_MODULES; build_parser('replay'); "
            "print(' '.join(m for m, _, _ in COMMAND_MODULES if m in sys.modules and m != 'traces.cli'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"blocksim replay imported {loaded}"
    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(commands) == set(BUILT_IN_COMMANDS).union(*(names for _, _, names in COMMAND_MODULES))
