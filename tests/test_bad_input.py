"""The bad-input corpus: every case exits with status 2 and one line on stderr that names the file,
field or option at fault and the fix, with no traceback.

The files are in tests/bad_inputs/ (written by its make_corpus.py, one fault each); the cases run
`blocksim.cli.main` in this process. A case is (id, argv, what the line must name, the fix it must
give): `{d}` is the corpus folder, `{tmp}` a fresh temporary folder, `{trace}` a good bundled trace.
"""

from pathlib import Path

import pytest

from blocksim.cli import main

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "bad_inputs"
TRACE = ROOT / "traces" / "data" / "azure_conv_2023_sample.csv"
PLUGINS = "tests.bad_inputs.bad_plugins"
REPLAY = ["replay", "{trace}", "--out", "{tmp}/run", "--no-report", "--quiet", "--max-requests", "20",
          "--clip-to-model"]
TIGHT = ["--num-gpu-blocks", "300", "--max-requests", "200"]  # preemptions happen: victims are called


def info(name, *flags):
    return ["traces", "info", "{d}/" + name, *flags]


CASES = [
    # trace files: CSV
    ("csv-empty", info("empty.csv"), ["empty.csv", "empty"], "header"),
    ("csv-header-only", info("header_only.csv"), ["header_only.csv", "no requests"], "at least one request"),
    ("csv-unknown-columns", info("unknown_columns.csv"), ["unknown_columns.csv", "a, b, c"], "--map"),
    ("csv-non-numeric", info("non_numeric.csv"), ["non_numeric.csv", "line 3", "ContextTokens", "'abc'"], "--lenient"),
    ("csv-negative", info("negative_tokens.csv"), ["negative_tokens.csv", "line 3", "GeneratedTokens"], "--lenient"),
    ("csv-zero-output", info("zero_output.csv"), ["zero_output.csv", "line 3", "output_tokens", "zero token count"],
     "--lenient"),
    ("csv-zero-prompt", REPLAY[:1] + ["{d}/zero_prompt.csv"] + REPLAY[2:], ["zero_prompt.csv", "line 2",
                                                                            "prompt_tokens"], "remove the row"),
    ("csv-fractional", info("fractional.csv"), ["fractional.csv", "line 3", "fractional value"], "integer"),
    ("csv-bad-timestamp", info("bad_timestamp.csv"), ["bad_timestamp.csv", "line 3", "'yesterday noon'"],
     "--time-unit"),
    ("csv-too-many-fields", info("too_many_fields.csv"), ["too_many_fields.csv", "line 3", "fields"], "--lenient"),
    ("csv-blank-line", info("blank_line_inside.csv"), ["blank_line_inside.csv", "line 3", "blank line"],
     "remove blank lines"),
    ("csv-duplicate-ids", info("duplicate_ids.csv"), ["duplicate_ids.csv", "line 3", "duplicate request id 7"],
     "unique"),
    ("csv-missing-value", info("missing_value.csv"), ["missing_value.csv", "line 3", "missing value"], "--lenient"),
    ("csv-latin1", info("latin1.csv"), ["latin1.csv", "line 2", "0xe9", "not UTF-8"], "save the file as UTF-8"),
    ("csv-holding-broken-parquet", info("parquet_named.csv"), ["parquet_named.csv", "Parquet"], "write it again"),
    ("csv-not-found", info("no_such.csv"), ["no_such.csv", "no such file"], "check the path"),
    ("csv-unknown-format", info("zero_output.csv", "--format", "azure-2025"), ["'azure-2025'"], "use one of"),
    ("csv-bad-map", info("unknown_columns.csv", "--map", "arrival_s"), ["--map", "'arrival_s'"], "FIELD=COLUMN"),
    ("csv-unknown-time-unit", info("unknown_columns.csv", "--time-unit", "fortnight"), ["--time-unit", "fortnight"],
     "choose from"),
    # trace files: JSONL
    ("jsonl-empty", info("empty.jsonl"), ["empty.jsonl", "empty"], "at least one request"),
    ("jsonl-not-json", info("not_json.jsonl"), ["not_json.jsonl", "line 2", "not valid JSON"], "--lenient"),
    ("jsonl-array-line", info("array_line.jsonl"), ["array_line.jsonl", "line 2", "not a JSON object"], "--lenient"),
    ("jsonl-truncated", info("truncated.jsonl"), ["truncated.jsonl", "line 2", "truncated"], "--lenient"),
    ("jsonl-hash-count", info("hash_count.jsonl"), ["hash_count.jsonl", "line 2", "hash_ids"], "ceil("),
    ("jsonl-hash-not-list", info("hash_not_list.jsonl"), ["hash_not_list.jsonl", "line 2", "not a list"],
     "JSON list of integer"),
    ("jsonl-zero-output", info("zero_output.jsonl"), ["zero_output.jsonl", "line 2", "output_length"], "--lenient"),
    # trace files: Parquet
    ("parquet-truncated", info("truncated.parquet"), ["truncated.parquet", "not a readable Parquet file"],
     "write it again"),
    ("parquet-garbage", info("garbage.parquet"), ["garbage.parquet", "PAR1"], "write it again"),
    ("parquet-unknown-columns", info("unknown_columns.parquet"), ["unknown_columns.parquet", "x, y"], "--map"),
    ("parquet-zero-prompt", info("zero_prompt.parquet"), ["zero_prompt.parquet", "row 2", "prompt_tokens"],
     "--lenient"),
    ("convert-unknown-extension", ["traces", "convert", "{trace}", "{tmp}/out.txt"], ["out.txt", "'.txt'"], "--to"),
    ("convert-missing-folder", ["traces", "convert", "{trace}", "{tmp}/no/out.csv"], ["out.csv", "does not exist"],
     "create it"),
    # configuration files
    ("config-unknown-key", REPLAY + ["--config", "{d}/config_unknown_key.yaml"],
     ["config_unknown_key.yaml", "'swap_space'"], "swap_space_gib"),
    ("config-syntax", REPLAY + ["--config", "{d}/config_syntax.yaml"], ["config_syntax.yaml", "cannot parse"], "line"),
    ("config-list", REPLAY + ["--config", "{d}/config_list.yaml"], ["config_list.yaml", "top level"], "mapping"),
    ("config-json", REPLAY + ["--config", "{d}/config.json"], ["config.json", "unknown extension"], ".yaml"),
    ("config-bad-value", REPLAY + ["--config", "{d}/config_bad_value.yaml"], ["block_size", "-16"], "positive"),
    ("config-ignored-knob", REPLAY + ["--config", "{d}/config_ignored_knob.yaml"], ["watermark", "orca-max"],
     "choose a paged policy"),
    ("config-unknown-policy", REPLAY + ["--config", "{d}/config_unknown_policy.toml"], ["'vllm-turbo'"],
     "known presets"),
    ("config-latin1", REPLAY + ["--config", "{d}/config_latin1.yaml"], ["config_latin1.yaml", "not UTF-8"],
     "save the file as UTF-8"),
    ("config-before-trace", REPLAY[:1] + ["{d}/milliseconds.csv"] + REPLAY[2:] + ["--config",
                                                                           "{d}/config_unknown_key.yaml"],
     ["config_unknown_key.yaml"], "swap_space_gib"),  # refused before the trace is read (and warned about)
    ("config-not-found", REPLAY + ["--config", "{d}/no_such.yaml"], ["no_such.yaml", "not found"], "config file"),
    ("compare-config-unknown-key", ["compare", "{trace}", "--out", "{tmp}/cmp", "--config",
                                    "{d}/config_unknown_key.yaml"], ["config_unknown_key.yaml", "'swap_space'"],
     "swap_space_gib"),
    # catalogs
    ("catalog-missing-field", REPLAY + ["--catalog", "{d}/catalog_missing_field.yaml"],
     ["catalog_missing_field.yaml", "tiny", "missing"], "head_size"),
    ("catalog-unknown-field", ["catalog", "--catalog", "{d}/catalog_unknown_field.yaml"],
     ["catalog_unknown_field.yaml", "'color'"], "known"),
    ("catalog-not-mapping", ["catalog", "--catalog", "{d}/catalog_not_mapping.yaml"], ["catalog_not_mapping.yaml"],
     "mapping"),
    ("catalog-unknown-model", REPLAY + ["--model", "llama-9"], ["'llama-9'"], "llama-2-7b"),
    # plugin strings
    ("plugin-no-module", REPLAY + ["--scheduler", "nope.module:Scheduler"], ["scheduler", "'nope.module'"],
     "PYTHONPATH"),
    ("plugin-no-attribute", REPLAY + ["--victim", f"{PLUGINS}:nothing_here"], ["victim", "'nothing_here'"], "has no"),
    ("plugin-malformed", REPLAY + ["--victim", "mypkg:"], ["victim", "'mypkg:'"], "package.module:Class"),
    ("plugin-wrong-signature", REPLAY + ["--victim", "os:getcwd"], ["victim 'os:getcwd'", "takes ()"],
     "f(candidates)"),
    ("plugin-allocator-signature", REPLAY + ["--allocator", f"{PLUGINS}:TwoArgumentAllocator"],
     ["allocator", "TwoArgumentAllocator"], "f(config)"),
    ("plugin-not-callable", REPLAY + ["--victim", f"{PLUGINS}:NOT_CALLABLE"], ["NOT_CALLABLE", "of type int"],
     "class or function"),
    ("plugin-victim-raises", REPLAY + TIGHT + ["--victim", f"{PLUGINS}:raising_victim"],
     ["victim", "raising_victim", "ValueError: no victim today", "bad_plugins.py:"], "fix the plugin"),
    ("plugin-victim-bad-index", REPLAY + TIGHT + ["--victim", f"{PLUGINS}:out_of_range_victim"],
     ["out_of_range_victim", "returned"], "index"),
    ("plugin-scheduler-raises", REPLAY + ["--scheduler", f"{PLUGINS}:RaisingScheduler"],
     ["scheduler", "RaisingScheduler", "RuntimeError"], "fix the plugin"),
    # sweep specs
    ("spec-unknown-key", ["sweep", "{d}/spec_unknown_key.yaml", "--out", "{tmp}/sw"], ["'axis'"], "axes"),
    ("spec-unknown-option", ["sweep", "{d}/spec_unknown_option.yaml", "--out", "{tmp}/sw"], ["blok_size"],
     "block_size"),
    ("spec-missing-trace", ["sweep", "{d}/spec_missing_trace.yaml", "--out", "{tmp}/sw"], ["no_such_trace.csv"],
     "path"),
    ("spec-no-trace", ["sweep", "{d}/spec_no_trace.yaml", "--out", "{tmp}/sw"], ["trace"], "bundled"),
    ("spec-axis-not-list", ["sweep", "{d}/spec_axis_not_list.yaml", "--out", "{tmp}/sw"], ["block_size"], "list"),
    # cost profiles
    ("profile-string-value", REPLAY + ["--cost-profile", "{d}/profile_string_value.json"],
     ["profile_string_value.json", "flops_efficiency"], "number"),
    ("profile-list", REPLAY + ["--cost-profile", "{d}/profile_list.json"], ["profile_list.json"], "object"),
    ("profile-unknown-key", REPLAY + ["--cost-profile", "{d}/profile_unknown_key.json"],
     ["profile_unknown_key.json", "warp_speed"], "known"),
    ("profile-not-json", REPLAY + ["--cost-profile", "{d}/profile_not_json.json"], ["profile_not_json.json",
                                                                                   "not valid JSON"], "line"),
    # execution plans
    ("plan-wrong-version", ["validate", "{d}/plan_wrong_version"], ["meta.json", "plan version 99"], "record"),
    ("plan-incomplete", ["validate", "{d}/plan_incomplete"], ["plan_incomplete", "incomplete"], "--record-plan"),
    ("plan-not-json", ["validate", "{d}/plan_not_json"], ["meta.json", "not valid JSON"], "--record-plan"),
    ("plan-none", ["validate", "{d}/plan_none"], ["plan_none", "no execution plan"], "--record-plan"),
    # run directories and flags
    ("out-is-a-file", REPLAY[:3] + ["{d}/out_is_a_file"] + REPLAY[4:], ["out_is_a_file", "is a file"],
     "name a directory"),
    ("out-under-a-file", REPLAY[:3] + ["{d}/out_is_a_file/run"] + REPLAY[4:], ["out_is_a_file", "is a file"],
     "name a directory"),
    ("out-not-empty", REPLAY[:3] + ["{d}"] + REPLAY[4:], ["bad_inputs", "not empty"], "--overwrite"),
    ("compare-out-foreign", ["compare", "{trace}", "--policy", "vllm", "--out", "{d}"],
     ["bad_inputs", "not an earlier output"], "--overwrite"),
    ("compare-no-policy", ["compare", "{trace}", "--out", "{tmp}/cmp"], ["--policy"], "--config"),
    ("flag-bad-number", REPLAY + ["--block-size", "sixteen"], ["--block-size", "'sixteen'"], "--help"),
    ("flag-zero-rate", REPLAY + ["--rate-scale", "0"], ["--rate-scale", "positive"], "--help"),
    ("flag-unknown", REPLAY + ["--blocksize", "8"], ["--blocksize"], "did you mean --block-size?"),
    # KV tiers
    ("tier-capacity-below-chunk", REPLAY + ["--policy", "vllm-v1", "--tier-host-gib", "0.001"],
     ["--tier-host-gib", "0.001 GiB", "one 16-token chunk"], "give at least"),
    ("tier-chunk-not-block-multiple", REPLAY + ["--policy", "vllm-v1", "--tier-host-gib", "4", "--tier-chunk-tokens",
                                                "24"], ["--tier-chunk-tokens", "24", "block size 16"], "multiple of 16"),
    ("tier-disk-path-not-writable", REPLAY + ["--policy", "vllm-v1", "--tier-disk-gib", "4", "--tier-disk-path",
                                              "{d}/out_is_a_file"], ["--tier-disk-path", "out_is_a_file"],
     "name a directory you can write"),
    ("tier-without-prefix-caching", REPLAY + ["--config", "{d}/config_tier_no_prefix.yaml"],
     ["--tier-host-gib", "'vllm'", "without prefix caching"], "choose vllm-prefix, vllm-v1 or sglang"),
    ("tier-option-without-tier", REPLAY + ["--policy", "vllm-v1", "--tier-onload", "recompute"],
     ["--tier-onload", "no tier is on"], "add --tier-host-gib or --tier-disk-gib"),
]


def run_case(argv: list[str], tmp_path: Path, capsys) -> tuple[int, list[str], str]:
    args = [a.format(d=CORPUS, tmp=tmp_path, trace=TRACE) for a in argv]
    try:
        code = main(args)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.err


@pytest.mark.parametrize("argv, names, fix", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_naming_the_place_and_the_fix(argv, names, fix, tmp_path, capsys):
    code, lines, err = run_case(argv, tmp_path, capsys)
    assert "Traceback" not in err, err
    assert code == 2, f"exit status {code}: {err}"
    assert len(lines) == 1, f"one line, got {len(lines)}:\n{err}"
    for word in names:
        assert word in lines[0], f"the line names {word!r}: {lines[0]}"
    assert fix in lines[0], f"the line gives the fix ({fix!r}): {lines[0]}"


def test_the_corpus_has_at_least_forty_cases_over_every_kind_of_input():
    assert len(CASES) >= 40
    kinds = {c[0].split("-")[0] for c in CASES}
    assert {"csv", "jsonl", "parquet", "config", "catalog", "plugin", "spec", "profile", "plan"} <= kinds


def test_lenient_skips_every_bad_row_kind_of_the_corpus(capsys):
    """With --lenient the row-level faults become skipped rows, reported in one warning."""
    for name in ("non_numeric.csv", "negative_tokens.csv", "zero_output.csv", "fractional.csv", "bad_timestamp.csv",
                 "too_many_fields.csv", "blank_line_inside.csv", "missing_value.csv", "latin1.csv",
                 "not_json.jsonl", "array_line.jsonl", "truncated.jsonl", "hash_count.jsonl",
                 "hash_not_list.jsonl", "zero_output.jsonl", "zero_prompt.parquet"):
        code = main(["traces", "info", str(CORPUS / name), "--lenient", "--json"])
        err = capsys.readouterr().err
        assert code == 0, f"{name}: {err}"
        assert "skipped 1 bad rows" in err and err.count("\n") == 1, f"{name}: {err}"
