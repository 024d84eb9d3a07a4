"""Write the bad-input corpus files of this folder (run from the repository root:
``python tests/bad_inputs/make_corpus.py``). Each file is wrong in one way; tests/test_bad_input.py
says how and what the one-line answer must name."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
CANON = "arrival_s,prompt_tokens,output_tokens\n"


def moon(ts=0, inp=600, out=5, hashes="[1, 2]"):
    return f'{{"timestamp": {ts}, "input_length": {inp}, "output_length": {out}, "hash_ids": {hashes}}}\n'


TEXT = {
    # traces: CSV
    "empty.csv": "",
    "header_only.csv": AZ,
    "unknown_columns.csv": "a,b,c\n1,2,3\n",
    "non_numeric.csv": AZ + AZ_ROW + "2023-11-16 18:15:47.0,abc,3\n",
    "negative_tokens.csv": AZ + AZ_ROW + "2023-11-16 18:15:47.0,12,-3\n",
    "zero_output.csv": CANON + "0,10,3\n1,10,0\n",
    "zero_prompt.csv": CANON + "0,0,3\n1,10,4\n",
    "fractional.csv": AZ + AZ_ROW + "2023-11-16 18:15:47.0,12.5,3\n",
    "bad_timestamp.csv": AZ + AZ_ROW + "yesterday noon,12,3\n",
    "too_many_fields.csv": AZ + AZ_ROW + "2023-11-16 18:15:47.0,12,3,99\n",
    "blank_line_inside.csv": AZ + AZ_ROW + "\n" + AZ_ROW,
    "duplicate_ids.csv": "request_id," + CANON + "7,0,10,3\n7,1,10,3\n",
    "missing_value.csv": CANON + "0,10,3\n1,,3\n",
    "milliseconds.csv": CANON + "".join(f"{i * 300},100,10\n" for i in range(100)),  # read as seconds: a warning
    # traces: JSONL
    "empty.jsonl": "",
    "not_json.jsonl": moon() + "{timestamp: 5}\n",
    "array_line.jsonl": moon() + "[1, 2, 3]\n",
    "truncated.jsonl": moon() + moon(ts=5)[:30],
    "hash_count.jsonl": moon() + moon(ts=5, inp=2000, hashes="[1, 2]"),
    "hash_not_list.jsonl": moon() + moon(ts=5, hashes='"abc"'),
    "zero_output.jsonl": moon() + moon(ts=5, out=0),
    # configs
    "config_unknown_key.yaml": "swap_space: 8\n",
    "config_syntax.yaml": "block_size: [16\npolicy: vllm\n",
    "config_list.yaml": "- block_size: 16\n",
    "config.json": '{"block_size": 16}\n',
    "config_bad_value.yaml": "block_size: -16\n",
    "config_tier_no_prefix.yaml": "policy: vllm\ntier_host_gib: 8\n",
    "config_ignored_knob.yaml": "policy: orca-max\nwatermark: 0.05\n",
    "config_unknown_policy.toml": 'policy = "vllm-turbo"\n',
    # catalogs
    "catalog_missing_field.yaml": "models:\n  tiny: {num_layers: 2, num_heads: 2}\n",
    "catalog_unknown_field.yaml": "gpus:\n  g1: {memory_gib: 8, hbm_bw_gbps: 100, fp16_tflops: 10, host_link_gbps: 8, "
                                  "color: red}\n",
    "catalog_not_mapping.yaml": "- a\n- b\n",
    # sweep specs
    "spec_unknown_key.yaml": "trace: bundled:azure-conv\nbase: {max_requests: 5}\naxis: {block_size: [8]}\n",
    "spec_unknown_option.yaml": "trace: bundled:azure-conv\naxes: {blok_size: [8, 16]}\n",
    "spec_missing_trace.yaml": "trace: no_such_trace.csv\naxes: {block_size: [8]}\n",
    "spec_no_trace.yaml": "axes: {block_size: [8]}\n",
    "spec_axis_not_list.yaml": "trace: bundled:azure-conv\naxes: {block_size: 16}\n",
    # cost profiles
    "profile_string_value.json": '{"params": {"flops_efficiency": "0.5"}}\n',
    "profile_list.json": "[1, 2]\n",
    "profile_unknown_key.json": '{"params": {"warp_speed": 9}}\n',
    "profile_not_json.json": "{params: 1\n",
    # plans (run directories holding plan/)
    "plan_wrong_version/plan/meta.json": '{"plan_version": 99, "chunks": 0}\n',
    "plan_incomplete/plan/meta.json": '{"plan_version": 1, "chunks": 2}\n',
    "plan_not_json/plan/meta.json": "{plan_version\n",
    "plan_none/summary.json": "{}\n",
    # --out that is a file
    "out_is_a_file": "not a directory\n",
}

BYTES = {
    "latin1.csv": (AZ + "2023-11-16 18:15:46.6805900,37").encode() + b"\xe9" + b"4,44\n" + AZ_ROW.encode(),
    "garbage.parquet": bytes(range(256)) * 4,
    "config_latin1.yaml": b"model: llama-2-7b # caf\xe9\n",
}


def main() -> None:
    for name, text in TEXT.items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_text(text)
    for name, data in BYTES.items():
        (HERE / name).write_bytes(data)
    good = pa.table({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [10, 0, 12], "output_tokens": [3, 4, 5]})
    pq.write_table(good, HERE / "zero_prompt.parquet")
    pq.write_table(pa.table({"x": [1, 2], "y": [3, 4]}), HERE / "unknown_columns.parquet")
    whole = (HERE / "zero_prompt.parquet").read_bytes()
    (HERE / "truncated.parquet").write_bytes(whole[: len(whole) // 2])
    (HERE / "parquet_named.csv").write_bytes(whole[: len(whole) // 2])  # a broken Parquet file named .csv


if __name__ == "__main__":
    main()
