"""analysis/headline.py: the headline columns as text, on a console and in the reports."""

import math

import pandas as pd

from analysis.headline import RUN_KEYS, comparison_findings, headline_frame, text_table

ROWS = [
    {"policy": "vllm", "rate_scale": 0.5, "requests_per_s": 2.3412, "ttft_p99_s": 3.4321, "tpot_p99_s": 0.0561,
     "token_states_of_used_frac": 0.9912, "preemptions": 6, "rejected": 0, "running_mean": 19.2, "waiting_mean": 0.3},
    {"policy": "orca-max", "rate_scale": 0.5, "requests_per_s": 1.7836, "ttft_p99_s": 266.37, "tpot_p99_s": 0.0302,
     "token_states_of_used_frac": 0.2771, "preemptions": 0, "rejected": 1234, "running_mean": 10.5,
     "waiting_mean": 219.9},
]


def test_headline_frame_formats_each_metric_with_its_unit():
    frame = headline_frame(ROWS, RUN_KEYS)
    assert list(frame.columns) == ["policy", "rate", "throughput (req/s)", "TTFT p99 (s)", "TPOT p99 (ms)",
                                   "used KV holding tokens (%)", "preemptions", "rejected"]
    assert frame.iloc[1].tolist() == ["orca-max", "x0.5", "1.78", "266.37", "30", "28", "0", "1,234"]
    assert headline_frame([{"policy": "p", "requests_per_s": math.nan}]).iloc[0, 1] == "-"


def test_text_table_puts_units_on_a_second_line_and_aligns_numbers_right():
    lines = text_table(headline_frame(ROWS, RUN_KEYS[:1])).splitlines()
    assert lines[0].split() == ["policy", "throughput", "TTFT", "p99", "TPOT", "p99", "used", "KV", "holding",
                                "tokens", "preemptions", "rejected"]
    assert lines[1].split() == ["(req/s)", "(s)", "(ms)", "(%)"]
    assert lines[3].startswith("  orca-max ") and lines[3].endswith("1,234")
    assert len({len(line) for line in lines[2:]}) == 1, "rows line up"


def test_findings_compare_the_most_and_least_memory_efficient_policies():
    text = comparison_findings(pd.DataFrame(ROWS))
    assert text.startswith("vllm keeps 99% of the KV memory it uses for token states, orca-max 28%")
    assert "orca-max runs 10.5 requests at a time on average against 19.2 with 219.9 waiting against 0.3;" in text
    assert "TTFT p99 is 266.4 s against 3.4 s and throughput 1.78 against 2.34 req/s." in text
    assert comparison_findings(pd.DataFrame(ROWS[:1])) == "", "one policy: nothing to compare"
