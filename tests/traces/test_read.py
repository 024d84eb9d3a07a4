import warnings

import numpy as np
import pandas as pd
import pytest

from traces import Trace, TraceWarning, bundled, bundled_names, read_trace


def test_bundled_samples_are_listed_and_exist():
    assert set(bundled_names()) == {"azure-conv", "azure-code", "mooncake"}
    for name in bundled_names():
        assert bundled(name).is_file(), name
    with pytest.raises(KeyError, match="azure-conv"):
        bundled("nope")


@pytest.mark.parametrize("name", ["azure-conv", "azure-code"])
def test_azure_samples_read_as_2000_sorted_requests(name):
    trace = read_trace(bundled(name))
    assert len(trace) == 2000
    arrival = trace.df["arrival_s"].to_numpy()
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert (trace.df["prompt_tokens"] > 0).all() and not trace.has_hashes


def test_azure_timestamps_keep_sub_microsecond_digits(write):
    path = write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951697,396,109\n")
    trace = read_trace(path)
    assert trace.df["arrival_s"].iloc[1] == pytest.approx(4.3145797, abs=1e-9)
    assert trace.df["prompt_tokens"].tolist() == [374, 396]


def test_azure_2024_zoned_timestamps(write):
    path = write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                          "2024-05-10 00:00:00.0000000+00:00,10,1\n2024-05-10 00:00:01.5000000+00:00,20,2\n")
    assert read_trace(path).df["arrival_s"].tolist() == [0.0, 1.5]


def test_mooncake_sample_has_512_token_hashes():
    trace = read_trace(bundled("mooncake"))
    assert len(trace) == 2000 and trace.hash_block_tokens == 512
    blocks = trace.df["prefix_hashes"].list.len().to_numpy()
    assert np.array_equal(blocks, -(-trace.df["prompt_tokens"].to_numpy() // 512))
    assert trace.df["arrival_s"].iloc[2] == pytest.approx(0.040), "timestamps are milliseconds"


def test_burstgpt_drops_failed_requests_and_counts_them(write):
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,100,20,120,Conversation log\n6,GPT-4,50,0,50,Conversation log\n"
            "8,ChatGPT,70,7,77,API log\n")
    path = write("burst.csv", text)
    with pytest.warns(TraceWarning, match="1 failed requests"):
        dropped = read_trace(path)
    assert len(dropped) == 2 and dropped.report.failed_rows == 1 and not dropped.report.failed_kept
    assert dropped.df["arrival_s"].tolist() == [0.0, 3.0]
    with pytest.warns(TraceWarning, match="kept"):
        kept = read_trace(path, keep_failed=True)
    assert len(kept) == 3 and kept.report.failed_kept
    assert kept.df["output_tokens"].tolist() == [20, 0, 7]


def test_generic_csv_with_mapping_and_time_unit(write):
    path = write("g.csv", "ts,in,out,prio\n2000,5,1,3\n1000,7,2,1\n")
    trace = read_trace(path, mapping={"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out",
                                      "priority": "prio"}, time_unit="ms")
    assert trace.df["arrival_s"].tolist() == [0.0, 1.0], "sorted by arrival and rebased"
    assert trace.df["request_id"].tolist() == [1, 0], "ids follow file order"
    assert trace.df["priority"].tolist() == [1, 3]


def test_generic_jsonl_and_parquet(tmp_path, write):
    mapping = {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}
    jsonl = write("g.jsonl", '{"t": 0.5, "p": 3, "o": 4}\n\n{"t": 1.5, "p": 5, "o": 6}\n')
    assert read_trace(jsonl, mapping=mapping).df["prompt_tokens"].tolist() == [3, 5]
    parquet = tmp_path / "g.parquet"
    pd.DataFrame({"t": [0.0, 2.0], "p": [1, 2], "o": [3, 4]}).to_parquet(parquet)
    assert read_trace(parquet, mapping=mapping).df["arrival_s"].tolist() == [0.0, 2.0]


def test_generic_text_time_column_is_parsed_as_datetime(write):
    path = write("g.csv", "when,in,out\n2024-01-01T00:00:00,1,1\n2024-01-01T00:01:00,1,1\n")
    trace = read_trace(path, mapping={"arrival_s": "when", "prompt_tokens": "in", "output_tokens": "out"})
    assert trace.df["arrival_s"].tolist() == [0.0, 60.0]


def test_canonical_csv_and_parquet_are_detected(tmp_path, write):
    path = write("c.csv", "arrival_s,prompt_tokens,output_tokens,n\n0,10,2,4\n1.25,5,1,1\n")
    trace = read_trace(path)
    assert trace.df["n"].tolist() == [4, 1]
    trace.to_parquet(tmp_path / "c.parquet")
    back = read_trace(tmp_path / "c.parquet")
    assert isinstance(back, Trace) and back.df.equals(trace.df)


def test_forced_format_overrides_detection(write):
    path = write("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n")
    assert len(read_trace(path, format="azure-2023")) == 1


def test_ties_keep_file_order(write):
    path = write("m.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [7]}\n'
                            '{"timestamp": 0, "input_length": 2, "output_length": 1, "hash_ids": [8]}\n'
                            '{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [9]}\n')
    trace = read_trace(path)
    assert trace.df["prompt_tokens"].tolist() == [2, 1, 3]


def test_shared_azure_files_match_their_published_statistics(shared_traces):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conv = read_trace(shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    assert len(conv) == 19366
    assert conv.df["arrival_s"].iloc[-1] == pytest.approx(3501.7, abs=0.1)


def test_shared_mooncake_file_reads_whole(shared_traces):
    trace = read_trace(shared_traces / "mooncake" / "synthetic_trace.jsonl")
    assert len(trace) == 3993
    assert trace.df["arrival_s"].iloc[-1] == pytest.approx(1022.025)
