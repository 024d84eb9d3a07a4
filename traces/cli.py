"""Command line: ``blocksim traces info|convert|synth`` and the trace-reading flags shared with ``replay``.

The main ``blocksim`` parser calls :func:`add_traces_command` on its sub-parsers and then
``args.func(args)``. Commands that read a trace call :func:`add_trace_read_options` on
their parser and :func:`read_trace_from_args` to read it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .columns import TIME_UNITS
from .errors import TraceError
from .formats import format_names
from .lengths import parse_length
from .read import read_trace
from .shaping import (
    clip_to_max_len,
    head,
    poisson_retime,
    scale_rate,
    subsample,
    window,
)
from .stats import describe
from .synth import multi_turn_trace, shared_prefix_trace, synth_trace
from .trace import Trace
from .write import OUTPUT_FORMATS, output_format, write_trace


def add_trace_read_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--format``, ``--map``, ``--time-unit``, ``--hash-block-tokens``, ``--lenient``, ``--keep-failed``."""
    group = parser.add_argument_group("trace reading (see traces/FORMATS.md)")
    group.add_argument("--format", dest="trace_format", default=None, metavar="NAME",
                       help=f"trace format, detected from the columns when omitted: {', '.join(format_names())}")
    group.add_argument("--map", dest="trace_map", action="append", default=[], metavar="FIELD=COLUMN", type=_map_item,
                       help="read canonical FIELD (arrival_s, prompt_tokens, output_tokens, request_id, n, priority, "
                            "beam_width, prefix_hashes) from source COLUMN; repeatable")
    group.add_argument("--time-unit", dest="trace_time_unit", default=None, choices=TIME_UNITS,
                       help="unit of the arrival column (default: the format's; generic files: datetime for text, else s)")
    group.add_argument("--hash-block-tokens", dest="trace_hash_block_tokens", type=int, default=None, metavar="N",
                       help="tokens per prefix-hash block (mooncake: 512)")
    group.add_argument("--lenient", dest="trace_lenient", action="store_true",
                       help="skip bad rows (reported with their line numbers) instead of failing")
    group.add_argument("--keep-failed", dest="trace_keep_failed", action="store_true",
                       help="keep failed requests (BurstGPT rows with zero response tokens); dropped and counted otherwise")


def _map_item(text: str) -> str:
    """Argparse type of ``--map``: ``FIELD=COLUMN``."""
    try:
        parse_mapping([text])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_mapping(items) -> dict[str, str]:
    """``["arrival_s=ts", ...]`` -> ``{"arrival_s": "ts", ...}``."""
    mapping = {}
    for item in items or []:
        field, sep, column = item.partition("=")
        if not sep or not field.strip() or not column:
            raise ValueError(f"--map expects FIELD=COLUMN, got {item!r}")
        mapping[field.strip()] = column
    return mapping


def read_trace_from_args(path, args: argparse.Namespace, *, mapping: dict[str, str] | None = None,
                         format: str | None = None, time_unit: str | None = None) -> Trace:
    """Read ``path`` with the flags of :func:`add_trace_read_options` (absent flags mean defaults).

    ``mapping``, ``format`` and ``time_unit`` are defaults from a configuration file;
    command-line flags override them.
    """
    merged = {**(mapping or {}), **parse_mapping(getattr(args, "trace_map", None))}
    return read_trace(
        path,
        getattr(args, "trace_format", None) or format,
        mapping=merged or None,
        lenient=bool(getattr(args, "trace_lenient", False)),
        keep_failed=bool(getattr(args, "trace_keep_failed", False)),
        time_unit=getattr(args, "trace_time_unit", None) or time_unit,
        hash_block_tokens=getattr(args, "trace_hash_block_tokens", None),
    )


def add_traces_command(subparsers) -> argparse.ArgumentParser:
    """Register ``traces`` with ``info``, ``convert`` and ``synth`` on an argparse sub-parsers object."""
    parser = subparsers.add_parser("traces", help="inspect, convert and synthesize request traces",
                                   description="Inspect, convert and synthesize request traces.")
    commands = parser.add_subparsers(dest="traces_command", metavar="{info,convert,synth}", required=True)

    info = commands.add_parser("info", help="summary statistics of a trace file")
    info.add_argument("file", help="trace to read (Azure, BurstGPT, Mooncake, generic CSV/JSONL/Parquet)")
    info.add_argument("--json", action="store_true", help="print the statistics as JSON")
    add_trace_read_options(info)
    info.set_defaults(func=run_info)

    convert = commands.add_parser("convert", help="read any format, shape it, write it as Parquet, CSV or JSONL")
    convert.add_argument("file", help="trace to read (Azure, BurstGPT, Mooncake, generic CSV/JSONL/Parquet)")
    convert.add_argument("out", metavar="OUT", help="file to write, in the format its extension names "
                                                   "(.parquet, .csv, .jsonl) or --to")
    _add_output_option(convert)
    add_trace_read_options(convert)
    _add_shaping_options(convert)
    convert.set_defaults(func=run_convert)

    synth = commands.add_parser("synth", help="write a synthetic workload as Parquet, CSV or JSONL")
    synth.add_argument("out", metavar="OUT", help="file to write, in the format its extension names "
                                                 "(.parquet, .csv, .jsonl) or --to")
    _add_output_option(synth)
    _add_synth_options(synth)
    synth.set_defaults(func=run_synth)
    return parser


def _add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", choices=OUTPUT_FORMATS, default=None,
                        help="output format (default: the one OUT's extension names)")


def _write(trace: Trace, args: argparse.Namespace) -> str:
    """Write the trace as asked; a note when the block size of its prefix hashes must be given again."""
    fmt = write_trace(trace, args.out, args.to)
    if fmt != "parquet" and trace.has_hashes:
        print(f"note: {args.out} holds prefix hashes of {trace.hash_block_tokens}-token blocks; read it back "
              f"with --hash-block-tokens {trace.hash_block_tokens}", file=sys.stderr)
    return fmt


def _add_shaping_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shaping, applied in this order")
    group.add_argument("--window", nargs=2, type=float, metavar=("START_S", "END_S"),
                       help="keep requests arriving in [START_S, END_S); re-timed to start at 0")
    group.add_argument("--head", type=int, metavar="N", help="keep the first N requests")
    group.add_argument("--subsample", type=float, metavar="X",
                       help="keep a random subset: a fraction if X < 1, else X requests")
    group.add_argument("--scale-rate", type=float, metavar="FACTOR",
                       help="multiply the request rate by FACTOR (inter-arrival times divided by it)")
    group.add_argument("--poisson-rate", type=float, metavar="PER_S",
                       help="replace arrivals by a Poisson process at PER_S requests per second")
    group.add_argument("--clip-max-len", type=int, metavar="TOKENS",
                       help="clip prompt + output to TOKENS (a model's max length); reports how many changed")
    group.add_argument("--seed", type=int, default=0, help="seed for --subsample and --poisson-rate (default %(default)s)")


def _add_synth_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=("plain", "shared-prefix", "multi-turn"), default="plain",
                        help="plain: independent requests; shared-prefix: k-shot prompts sharing a prefix; "
                             "multi-turn: conversations whose turns extend the context (default %(default)s)")
    parser.add_argument("--requests", type=int, default=1000, help="requests (multi-turn: conversations) (default %(default)s)")
    parser.add_argument("--rate", type=float, default=1.0, metavar="PER_S",
                        help="mean arrival rate, requests (multi-turn: conversations) per second (default %(default)s)")
    parser.add_argument("--arrivals", choices=("poisson", "gamma"), default="poisson",
                        help="inter-arrival process (default %(default)s)")
    parser.add_argument("--cv", type=float, default=2.0,
                        help="coefficient of variation of inter-arrival times for gamma arrivals (>1 is bursty; "
                             "default %(default)s)")
    parser.add_argument("--prompt-len", default="lognormal:1000:1.0", metavar="DIST",
                        help="prompt (shared-prefix: suffix; multi-turn: user message) length: fixed:N, "
                             "uniform:LOW:HIGH, lognormal:MEAN:CV[:MAX], empirical:FILE[:prompt|output] (default %(default)s)")
    parser.add_argument("--output-len", default="lognormal:200:1.0", metavar="DIST", help="output length, same forms (default %(default)s)")
    parser.add_argument("--n", type=int, default=1, help="parallel samples per request (default %(default)s)")
    parser.add_argument("--beam-width", type=int, default=1, help="beam search width (sets n to it; default %(default)s)")
    parser.add_argument("--hash-block-tokens", type=int, default=None, metavar="N",
                        help="tokens per prefix-hash block (default 16 for shared-prefix and multi-turn, none for plain)")
    parser.add_argument("--prefix-tokens", type=int, default=1024,
                        help="shared-prefix: tokens of the shared prefix (system prompt + k examples; default %(default)s)")
    parser.add_argument("--prefixes", type=int, default=1, help="shared-prefix: number of distinct shared prefixes (default %(default)s)")
    parser.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation (default %(default)s)")
    parser.add_argument("--think-s", type=float, default=10.0, help="multi-turn: mean seconds between turns (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--name", default=None, help="trace name stored in the Parquet file")


def run_info(args: argparse.Namespace) -> int:
    stats = describe(read_trace_from_args(args.file, args))
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    for key, value in stats.items():
        shown = f"{value:,.3f}" if isinstance(value, float) and math.isfinite(value) else value
        print(f"{key:>22}  {shown}")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    output_format(args.out, args.to)  # refuse an unknown output format before reading
    trace = read_trace_from_args(args.file, args)
    if args.window:
        trace = window(trace, *args.window)
    if args.head is not None:
        trace = head(trace, args.head)
    if args.subsample is not None:
        x = args.subsample
        trace = subsample(trace, x, seed=args.seed) if x < 1 else subsample(trace, count=int(x), seed=args.seed)
    if args.scale_rate is not None:
        trace = scale_rate(trace, args.scale_rate)
    if args.poisson_rate is not None:
        trace = poisson_retime(trace, args.poisson_rate, seed=args.seed)
    if args.clip_max_len is not None:
        trace, changed = clip_to_max_len(trace, args.clip_max_len)
        print(f"clipped {changed} of {len(trace)} requests to {args.clip_max_len} tokens", file=sys.stderr)
    fmt = _write(trace, args)
    note = trace.report.summary()
    print(f"wrote {len(trace)} requests to {args.out} as {fmt}" + (f" ({note})" if note else ""))
    return 0


def run_synth(args: argparse.Namespace) -> int:
    prompt = parse_length(args.prompt_len, "prompt_tokens")
    output = parse_length(args.output_len, "output_tokens")
    cv = 1.0 if args.arrivals == "poisson" else args.cv
    common = {"rate_per_s": args.rate, "output": output, "cv": cv, "n": args.n, "beam_width": args.beam_width, "seed": args.seed}
    if args.workload == "plain":
        trace = synth_trace(args.requests, prompt=prompt, hash_block_tokens=args.hash_block_tokens, **common)
    elif args.workload == "shared-prefix":
        trace = shared_prefix_trace(args.requests, prefix_tokens=args.prefix_tokens, suffix=prompt,
                                    n_prefixes=args.prefixes, hash_block_tokens=args.hash_block_tokens or 16, **common)
    else:
        trace = multi_turn_trace(args.requests, turns=args.turns, user=prompt, think_s=args.think_s,
                                 hash_block_tokens=args.hash_block_tokens or 16, **common)
    if args.name:
        trace = Trace(trace.df, trace.hash_block_tokens, args.name)
    fmt = _write(trace, args)
    print(f"wrote {len(trace)} requests to {args.out} as {fmt}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m traces ...``), the same as ``blocksim traces ...``."""
    parser = argparse.ArgumentParser(prog="python -m traces")
    add_traces_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["traces", *(sys.argv[1:] if argv is None else argv)])
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except (TraceError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; no output file was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
