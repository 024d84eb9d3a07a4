"""Command-line conventions: version, module entry, quiet pipes, --quiet / --config / -v, help texts,
progress bars only on a terminal, README examples that run."""

import argparse
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from blocksim import options
from blocksim.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def parsers(parser=None, path=("blocksim",)):
    """Every (command path, parser) of the CLI, sub-commands of sub-commands included."""
    parser = parser or build_parser()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, path + (name,))


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.match(r"blocksim \S+", capsys.readouterr().out)


def test_python_dash_m_blocksim_is_the_command():
    done = subprocess.run([sys.executable, "-m", "blocksim", "--version"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("blocksim "), done.stderr


def test_a_closed_pipe_ends_quietly():
    """`blocksim policies | head -0`: the reader is gone before anything is written."""
    with subprocess.Popen([sys.executable, "-m", "blocksim", "policies"], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
    assert proc.returncode == 141 and err == "", err


def test_every_option_has_help_and_states_its_default():
    missing, no_default = [], []
    for path, parser in parsers():
        for a in parser._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if a.help == argparse.SUPPRESS:
                continue
            where = f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
            if not a.help:
                missing.append(where)
            elif a.option_strings and a.default not in (None, False, [], 0, argparse.SUPPRESS) \
                    and "default" not in a.help:
                no_default.append(where)
    assert not missing, f"options without help: {missing}"
    assert not no_default, f"options whose help does not state the default: {no_default}"
    for o in options.OPTIONS:
        assert "default" in o.help_text, o.name


def test_commands_that_run_simulations_take_quiet_and_config():
    commands = dict((path[-1], p) for path, p in parsers() if len(path) == 2)
    for name in ("replay", "compare", "sweep"):
        flags = {s for a in commands[name]._actions for s in a.option_strings}
        assert {"--quiet", "--config", "--overwrite", "-v"} <= flags, name
    assert "--quiet" in {s for a in commands["demo"]._actions for s in a.option_strings}
    args = build_parser().parse_args(["compare", "t.csv", "--policy", "vllm", "--out", "o", "--no-progress"])
    assert args.quiet, "--no-progress stays as an alias of --quiet"


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["replay", "t.csv", "--out", "o", "--block-size", "many"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--block-size" in err[0] and "--help" in err[0], err


def test_verbose_logs_what_is_read_and_written(tmp_path, capsys, restore_logging):
    code = main(["replay", str(ROOT / "traces/data/azure_code_2023_sample.csv"), "--out", str(tmp_path / "run"),
                 "--max-requests", "20", "--clip-to-model", "--no-report", "--quiet", "-v"])
    err = capsys.readouterr().err
    assert code == 0
    assert "INFO: read 2000 requests" in err and f"INFO: wrote {tmp_path / 'run'}" in err, err


def test_progress_bars_are_drawn_only_on_a_terminal():
    from blocksim.engine import Engine
    from blocksim.experiments.runner import build_config

    trace = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [10, 10], "output_tokens": [2, 2]})
    bar = Engine(build_config(), trace, progress=True)._progress_bar()
    assert not sys.stderr.isatty() and bar.disable, "stderr is not a terminal here: no bar"


def test_readme_examples_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README.md").read_text()
    keys = re.findall(r"`(\w+): [^`]+`", readme)
    assert keys and set(keys) <= set(options.FILE_KEYS), f"README config keys {keys} are not all option names"
    commands = [c for c in re.findall(r"^blocksim replay .*$", readme, flags=re.M)
                if (ROOT / shlex.split(c)[2]).is_file()]  # examples on a bundled trace (not TRACE placeholders)
    assert len(commands) == 1, commands
    argv = shlex.split(commands[0], comments=True)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "run")
    code = main([*argv, "--max-requests", "50", "--clip-to-model", "--no-report", "--quiet"])
    assert code == 0 and (tmp_path / "run" / "summary.json").exists()


def test_very_verbose_adds_the_traceback_before_the_one_line(tmp_path, capsys, restore_logging):
    code = main(["replay", str(ROOT / "traces/data/azure_conv_2023_sample.csv"), "--out", str(tmp_path / "run"),
                 "--victim", "os:getcwd", "--quiet", "-vv"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and any(line.startswith("Traceback") for line in err), err
    assert err[-1].startswith("blocksim: plugin error: victim 'os:getcwd'"), err


def test_ctrl_c_while_the_command_loads_is_one_line_and_130(monkeypatch, capsys):
    """The `blocksim` entry point (`blocksim.__main__:run`) catches a Ctrl-C that lands while
    blocksim.cli and its libraries are being imported, before `main` can catch anything."""
    from blocksim.__main__ import run

    class Interrupted:
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "blocksim.cli", Interrupted())
    assert run() == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "Traceback" not in err
