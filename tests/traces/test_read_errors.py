"""Every kind of bad input raises TraceError naming the file, the line, the column and a hint."""

import pytest

from traces import TraceError, TraceWarning, read_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_AZURE = "2023-11-16 18:15:46.6805900,374,44\n"


def mooncake_line(ts=0, inp=600, out=5, hashes="[1, 2]"):
    return f'{{"timestamp": {ts}, "input_length": {inp}, "output_length": {out}, "hash_ids": {hashes}}}\n'


def raises(path, **kwargs) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_trace(path, **kwargs)
    err = info.value
    assert str(path) in str(err), "the message names the file"
    assert "Hint:" in str(err), "the message ends with a hint"
    return err


@pytest.mark.parametrize("name", ["empty.csv", "empty.jsonl"])
def test_empty_file(write, name):
    err = raises(write(name, ""))
    assert "empty" in str(err)


def test_header_without_rows(write):
    assert "no requests" in str(raises(write("h.csv", AZURE_HEADER)))


def test_missing_required_column(write):
    path = write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + GOOD_AZURE)
    err = raises(path, mapping={"output_tokens": "Output"})
    assert err.column == "Output" and err.line == 1
    assert "missing column 'Output'" in str(err)


def test_unknown_columns_ask_for_format_or_mapping(write):
    err = raises(write("x.csv", "a,b,c\n1,2,3\n"))
    assert "--map" in err.hint and "a, b, c" in str(err)


@pytest.mark.parametrize("row, column, words", [
    ("2023-11-16 18:15:47.0,abc,3", "ContextTokens", "non-numeric value 'abc'"),
    ("2023-11-16 18:15:47.0,12,-3", "GeneratedTokens", "negative value"),
    ("2023-11-16 18:15:47.0,,3", "ContextTokens", "missing value"),
    ("2023-11-16 18:15:47.0,NaN,3", "ContextTokens", "missing value"),
    ("2023-11-16 18:15:47.0,12.5,3", "ContextTokens", "fractional value"),
    ("yesterday noon,12,3", "TIMESTAMP", "unparseable timestamp 'yesterday noon'"),
])
def test_bad_value_names_line_and_column(write, row, column, words):
    path = write("a.csv", AZURE_HEADER + GOOD_AZURE + GOOD_AZURE + row + "\n" + GOOD_AZURE)
    err = raises(path)
    assert (err.line, err.column) == (4, column), str(err)
    assert words in str(err)
    assert "line 4" in str(err) and f"column {column!r}" in str(err)


def test_count_of_bad_rows_is_given(write):
    path = write("a.csv", AZURE_HEADER + "x,1,1\n" + GOOD_AZURE + "y,1,1\n")
    assert "2 bad rows in total" in str(raises(path))


def test_blank_line_inside_csv_is_a_bad_row_but_trailing_ones_are_not(write):
    err = raises(write("a.csv", AZURE_HEADER + GOOD_AZURE + "\n" + GOOD_AZURE))
    assert err.line == 3 and "blank line" in str(err)
    assert len(read_trace(write("b.csv", AZURE_HEADER + GOOD_AZURE + GOOD_AZURE + "\n\n"))) == 2


def test_wrong_field_count_in_csv(write):
    err = raises(write("a.csv", AZURE_HEADER + GOOD_AZURE + "2023-11-16 18:15:47.0,1,2,3\n"))
    assert err.line == 3 and "wrong number of fields" in str(err)


def test_truncated_last_csv_line(write):
    err = raises(write("a.csv", AZURE_HEADER + GOOD_AZURE + "2023-11-16 18:15:47.0,37"))
    assert err.line == 3 and err.column == "GeneratedTokens"
    assert "truncated" in err.hint


def test_truncated_last_jsonl_line(write):
    err = raises(write("m.jsonl", mooncake_line() + mooncake_line(ts=10)[:40]))
    assert err.line == 2 and "not valid JSON" in str(err) and "truncated" in err.hint


def test_non_numeric_length_in_jsonl(write):
    err = raises(write("m.jsonl", mooncake_line() + mooncake_line(inp='"many"')))
    assert (err.line, err.column) == (2, "input_length")


def test_hash_ids_inconsistent_with_input_length(write):
    err = raises(write("m.jsonl", mooncake_line() + "\n" + mooncake_line(inp=1500, hashes="[1, 2]")))
    assert (err.line, err.column) == (3, "hash_ids"), "blank lines still count in line numbers"
    assert "expected ceil(1500 / 512) = 3" in str(err)


def test_hash_ids_not_a_list(write):
    err = raises(write("m.jsonl", mooncake_line() + mooncake_line(hashes='"abc"')))
    assert (err.line, err.column) == (2, "hash_ids") and "not a list" in str(err)


def test_numbers_in_a_datetime_column(write):
    err = raises(write("a.csv", AZURE_HEADER + "12,1,1\n"))
    assert err.column == "TIMESTAMP" and "--time-unit" in err.hint


def test_parquet_errors_name_the_row(tmp_path):
    import pandas as pd
    path = tmp_path / "g.parquet"
    pd.DataFrame({"t": [0.0, 1.0], "p": [1, -2], "o": [1, 1]}).to_parquet(path)
    err = raises(path, mapping={"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"})
    assert "row 2" in str(err) and err.column == "p"


def test_unknown_format_mapping_field_and_time_unit(write):
    path = write("a.csv", AZURE_HEADER + GOOD_AZURE)
    assert "unknown trace format" in str(raises(path, format="excel"))
    assert "unknown field" in str(raises(path, mapping={"arrival": "TIMESTAMP"}))
    assert "unknown time unit" in str(raises(path, time_unit="fortnights"))


def test_lenient_skips_bad_rows_and_reports_them(write):
    path = write("a.csv", AZURE_HEADER + GOOD_AZURE + "x,1,1\n" + GOOD_AZURE + "2023-11-16 18:15:47.0,-1,1\n"
                 + "2023-11-16 18:15:48.0,1,1,1\n" + GOOD_AZURE)
    with pytest.warns(TraceWarning, match=r"skipped 3 bad rows \(lines 3, 5, 6\)"):
        trace = read_trace(path, lenient=True)
    assert len(trace) == 3
    report = trace.report
    assert report.skipped_rows == 3 and report.skipped_lines == (3, 5, 6)
    assert report.skip_reasons["TIMESTAMP: unparseable timestamp"] == 1
    assert report.skip_reasons["ContextTokens: negative value"] == 1


def test_lenient_jsonl_skips_truncated_line(write):
    path = write("m.jsonl", mooncake_line() + mooncake_line(ts=10) + mooncake_line(ts=20)[:30])
    with pytest.warns(TraceWarning, match="lines 3"):
        trace = read_trace(path, lenient=True)
    assert len(trace) == 2 and trace.report.skipped_lines == (3,)


def test_lenient_with_nothing_left_is_an_error(write):
    with pytest.warns(TraceWarning):
        raises(write("a.csv", AZURE_HEADER + "x,1,1\n"), lenient=True)


def test_milliseconds_read_as_seconds_warn_naming_the_column(write):
    rows = "".join(f"{i * 3_600_000},5,1\n" for i in range(24 * 40))
    path = write("g.csv", "ts,in,out\n" + rows)
    with pytest.warns(TraceWarning, match="column 'ts'.*days"):
        read_trace(path, mapping={"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"})


def test_seconds_read_as_milliseconds_warn(write):
    rows = "".join(f"{i},5,1\n" for i in range(2000))
    path = write("g.csv", "ts,in,out\n" + rows)
    with pytest.warns(TraceWarning, match="column 'ts'.*faster than a serving trace"):
        read_trace(path, mapping={"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"}, time_unit="us")


def test_zero_length_requests_are_a_bad_row_kind_named_one_based_and_skipped_when_lenient(tmp_path, write):
    from traces import Trace, bundled, head

    path = write("z.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,3\n1,10,0\n2,0,4\n3,5,5\n")
    err = raises(path)
    assert (err.line, err.column) == (3, "output_tokens") and "zero token count" in str(err)
    assert "2 bad rows in total" in str(err)
    with pytest.warns(TraceWarning, match="skipped 2 bad rows"):
        assert len(read_trace(path, lenient=True)) == 2
    # a Trace may hold zero lengths; written to Parquet, reading names and skips them the same way
    trace = head(read_trace(bundled("mooncake")), 5)
    df = trace.df.copy()
    df.loc[2, "output_tokens"] = 0
    own = tmp_path / "own.parquet"
    Trace(df, trace.hash_block_tokens, "own").to_parquet(own)
    assert raises(own).line == 3
    with pytest.warns(TraceWarning, match=r"rows 3\)"):
        assert len(read_trace(own, lenient=True)) == 4
