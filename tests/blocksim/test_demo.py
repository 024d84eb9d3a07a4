"""blocksim/experiments/demo.py: the demo's comparison, its console story and its report."""

import pandas as pd

from blocksim.cli import main
from blocksim.experiments import demo


def test_the_demo_compares_the_policies_where_memory_is_the_bottleneck(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--quiet", "--workers", "2"]) == 0
    text = capsys.readouterr().out
    summary = pd.read_parquet(out / "summary.parquet")
    assert set(summary["policy"]) == set(demo.POLICIES) >= {"vllm", "orca-oracle", "orca-max"}
    assert set(summary["rate_scale"]) == set(demo.RATE_SCALES)
    assert (summary["status"] == "ok").all() and (summary["rejected"] == 0).all(), "the demo clips, never rejects"
    at = summary[summary["rate_scale"] == demo.HEADLINE_RATE].set_index("policy")
    # memory is the bottleneck: paged blocks fill the used memory with token states, orca-max does not,
    # and the difference shows in the queue
    assert at.loc["vllm", "token_states_of_used_frac"] > 0.9 > 0.5 > at.loc["orca-max", "token_states_of_used_frac"]
    assert at.loc["vllm", "preemptions"] > 0, "vllm runs out of free blocks at the headline rate"
    assert at.loc["orca-max", "ttft_p99_s"] > 10 * at.loc["vllm", "ttft_p99_s"]
    for heading in ("throughput", "TTFT p99", "TPOT p99", "used KV holding tokens", "preemptions", "rejected"):
        assert heading in text, f"the console comparison shows {heading}"
    assert "143 longer than the model's 4,096 tokens are clipped" in text
    assert f"{at.loc['vllm', 'token_states_of_used_frac']:.0%}" in text
    assert len(text.splitlines()) <= 45, "the story fits one screen"
    assert max(len(line.replace(str(out), "DIR")) for line in text.splitlines()) <= 100
    assert (out / "report.html").is_file()
    html = (out / "report.html").read_text()
    assert html.index('id="headline"') < html.index('id="memory-breakdown"') < html.index('id="configuration"')
