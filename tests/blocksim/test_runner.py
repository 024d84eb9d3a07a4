"""blocksim/experiments/runner.py: the up-front warning about requests the scheduler will reject."""

import pytest

import traces
from blocksim.cli import main
from blocksim.config import ConfigError
from blocksim.experiments.runner import check_options, rejected_on_arrival, rejection_warning, replay


@pytest.fixture(scope="module")
def conv():
    return traces.read_trace(traces.bundled("azure-conv"))


def test_the_prediction_matches_what_the_scheduler_rejects(conv, tmp_path):
    trace = traces.head(conv, 400)
    for overrides in ({}, {"model": "mistral-7b", "max_num_batched_tokens": 1024}):
        summary = replay(trace, tmp_path / str(len(overrides)), overrides=overrides)
        predicted = sum(rejected_on_arrival(trace, check_options("vllm", overrides)))
        assert predicted == summary["rejected"] > 0, overrides


@pytest.mark.parametrize("overrides", [{"chunked_prefill_size": 1024},
                                       {"chunked_prefill_size": -1, "max_prefill_tokens": 1024}])
def test_sglang_has_no_step_budget_rejection(conv, tmp_path, overrides):
    """SGLang truncates a long prompt into chunks, or admits a batch's first request over its prefill
    budget: prompts over the budget are served, and the warning does not promise otherwise."""
    trace = traces.head(conv, 400)
    overrides = {"model": "mistral-7b", **overrides}
    assert (trace.df["prompt_tokens"] > 1024).any()
    summary = replay(trace, tmp_path / "run", policy="sglang", overrides=overrides)
    assert summary["rejected"] == 0 and summary["finished"] == len(trace)
    assert rejected_on_arrival(trace, check_options("sglang", overrides)) == (0, 0)
    assert rejection_warning(trace, "sglang", overrides) is None


def test_the_warning_names_the_count_and_the_fixes(conv):
    line = rejection_warning(conv)
    assert line.startswith("warning: 143 of 2,000 requests (7.1%) will be rejected: 143 longer than llama-2-7b's "
                           "4,096-token context; --clip-to-model clips them"), line
    assert "longer-context model (--model)" in line
    assert rejection_warning(conv, overrides={"clip_to_model": True}) is None
    assert rejection_warning(conv, overrides={"model": "mistral-7b"}) is None, "32k context: all fit"
    budget = rejection_warning(conv, overrides={"model": "mistral-7b", "max_num_batched_tokens": 1024})
    assert "prompts over the step budget of 1,024 tokens (raise --max-num-batched-tokens)" in budget
    assert "--clip-to-model" not in budget, "clipping to the context does not help a budget rejection"


def test_one_percent_or_less_stays_quiet(conv):
    df = conv.df.copy()
    df["prompt_tokens"] = 100
    df.loc[:19, "prompt_tokens"] = 5000  # 20 of 2,000: exactly 1%
    assert rejection_warning(traces.Trace(df, conv.hash_block_tokens, "t")) is None
    df.loc[20, "prompt_tokens"] = 5000
    assert "21 of 2,000" in rejection_warning(traces.Trace(df, conv.hash_block_tokens, "t"))


def test_replay_warns_before_it_runs(tmp_path, capsys):
    code = main(["replay", str(traces.bundled("azure-conv")), "--out", str(tmp_path / "r"), "--max-requests", "300",
                 "--no-report", "--quiet"])
    assert code == 0
    err = capsys.readouterr().err
    assert "blocksim: warning: 12 of 300 requests (4.0%) will be rejected" in err


def test_an_unknown_option_lists_the_run_options_too():
    with pytest.raises(ConfigError, match="unknown option") as exc:
        check_options("vllm", {"clip_to_modl": True})
    assert "'clip_to_model'" in str(exc.value) and "'max_requests'" in str(exc.value)
    assert isinstance(check_options("vllm", {"clip_to_model": True}).model.max_model_len, int)
