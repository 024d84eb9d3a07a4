"""The `blocksim` command line. Every command that writes does so under `--out DIR`."""

from __future__ import annotations

import argparse
import difflib
import gc
import importlib
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path

from blocksim import options, plugins
from blocksim.catalog import Catalog
from blocksim.config import ConfigError
from blocksim.engine import EngineError
from blocksim.experiments.configfile import read_config_file
from blocksim.experiments.rundir import check_out_dir
from blocksim.experiments.runner import build_config, check_options, rejection_warning, replay
from blocksim.policies import PRESETS, policy_config
from traces import TraceError
from traces.cli import add_trace_read_options, read_trace_from_args

# The commands other modules add (module, the function adding them, their names), in help order.
# A module is imported only to run one of its commands or for the whole parser (`blocksim --help`,
# an unknown command), so that `blocksim replay` loads none of them.
COMMAND_MODULES = (
    ("traces.cli", "add_traces_command", ("traces",)),
    ("analysis.cli", "add_analysis_commands", ("report", "fragmentation")),
    ("analysis.fidelity_report", "add_fidelity_command", ("fidelity",)),
    ("blocksim.experiments.cost_fit", "add_cost_fit_command", ("cost-fit",)),
    ("blocksim.experiments.compare", "add_compare_command", ("compare",)),
    ("blocksim.experiments.sweep", "add_sweep_command", ("sweep",)),
    ("validation.validate", "add_validate_command", ("validate",)),  # imports torch only when a validation runs
    ("validation.profile", "add_profile_command", ("profile",)),
)
BUILT_IN_COMMANDS = ("replay", "demo", "catalog", "policies")

SUMMARY_ROWS = [
    ("requests", "requests", "{:.0f}"), ("finished", "finished", "{:.0f}"), ("rejected", "rejected", "{:.0f}"),
    ("throughput", "requests_per_s", "{:.2f} req/s"), ("output tokens", "output_tokens_per_s", "{:.0f} tok/s"),
    ("TTFT p50 / p99", ("ttft_p50_s", "ttft_p99_s"), "{:.3f} / {:.3f} s"),
    ("TPOT p50 / p99", ("tpot_p50_s", "tpot_p99_s"), "{:.1f} / {:.1f} ms"),
    ("end-to-end p50 / p99", ("e2e_p50_s", "e2e_p99_s"), "{:.2f} / {:.2f} s"),
    ("normalized latency", "norm_latency_mean_s", "{:.4f} s/token"),
    ("preemptions", "preemptions", "{:.0f}"), ("blocks swapped out", "blocks_swapped_out", "{:.0f}"),
    ("prefix cache hits", ("prefix_cache_hits", "prefix_cache_queries"), "{:.0f} of {:.0f} blocks"),
    ("prefix tokens saved", "prefix_saved_tokens", "{:.0f}"),
    ("prefix evictions", "prefix_cache_evictions", "{:.0f}"),
    ("tier hits gpu/host/disk", ("tier_gpu_hit_rate", "tier_host_hit_rate", "tier_disk_hit_rate"),
     "{:.1%} / {:.1%} / {:.1%} of prompt tokens"),
    ("tier loads host/disk", ("tier_bytes_host_to_gpu", "tier_bytes_disk_to_gpu"), "{:.3g} / {:.3g} bytes"),
    ("tier onload wait mean", "tier_onload_wait_mean_s", "{:.4f} s"),
    ("GPU blocks", "num_gpu_blocks", "{:.0f}"), ("engine steps", "steps", "{:.0f}"),
    ("simulated", "simulated_s", "{:.1f} s"), ("wall", "wall_s", "{:.2f} s"),
]


def format_summary(s: dict) -> str:
    lines = []
    for label, key, fmt in SUMMARY_ROWS:
        keys = key if isinstance(key, tuple) else (key,)
        if any(k not in s for k in keys) and label.startswith(("prefix", "tier")):
            continue
        vals = [s.get(k, float("nan")) for k in keys]
        if "ms" in fmt:
            vals = [v * 1e3 for v in vals]
        lines.append(f"  {label:<22} {fmt.format(*vals)}")
    return "\n".join(lines)


def add_option(p, name: str, **changes) -> None:
    """Add the flag of option `name` (from `blocksim.options.OPTIONS`) to a parser or group;
    `changes` override argparse keywords (e.g. another help text). The flag's default is None
    (or [] for a file list), so an unset flag never hides a config-file value."""
    o = options.BY_NAME[name]
    kw: dict = {"dest": o.name, "default": None, "help": o.help_text}
    if o.type is bool:
        kw["action"] = argparse.BooleanOptionalAction if o.negatable else "store_true"
    elif o.type is tuple:
        kw.update(action="append", default=[])
    else:
        kw["type"] = o.parse or o.type
    if o.choices:
        kw["choices"] = o.choices
    if o.metavar:
        kw["metavar"] = o.metavar
    kw.update(changes)
    p.add_argument(*o.cli_flags, **kw)


def add_option_group(p: argparse.ArgumentParser, group: str) -> None:
    """Every option of `group`, under its title."""
    g = p.add_argument_group(options.GROUP_TITLES[group])
    for name in options.names(group):
        add_option(g, name)


def add_config_options(p: argparse.ArgumentParser) -> None:
    """The configuration flags (model, GPU and cache; scheduler; policy knobs) and --config."""
    for group in ("model", "scheduler", "policy", "tiers"):
        add_option_group(p, group)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML/TOML file of the options above (policy, model, block_size, ...); flags override it")


def settings_from_args(args: argparse.Namespace) -> tuple[str, dict]:
    """(policy, options) from the --config file, then the command-line flags over it."""
    o = read_config_file(args.config) if getattr(args, "config", None) else {}
    policy = getattr(args, "policy", None) or o.pop("policy", None) or options.DEFAULT_POLICY
    o.pop("policy", None)
    flags = (k for k in options.CONFIG_OPTIONS + options.RUN_OPTIONS if k != "catalog")
    o.update({k: getattr(args, k) for k in flags if getattr(args, k, None) is not None})
    if getattr(args, "catalog", None):
        o["catalog"] = tuple(args.catalog)
    elif "catalog" in o:
        o["catalog"] = tuple(o["catalog"])
    return policy, o


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """`--executor` and its knobs: execute every step with the model on a GPU (validation.step_executor)."""
    g = p.add_argument_group("GPU-in-the-loop execution")
    g.add_argument("--executor", choices=("cuda", "cpu"), default=None,
                   help="execute every step with the model (random weights) and advance the clock by its measured "
                        "time: cuda (CUDA events; CUDA graphs for pure decodes), cpu (the same code on the CPU, "
                        "for tiny catalog models)")
    g.add_argument("--executor-dtype", choices=("float16", "bfloat16"), default="float16",
                   help="the executed model's dtype (default float16)")
    g.add_argument("--executor-attention", choices=("fast", "vllm"), default="fast",
                   help="decode attention: the fast kernel (default) or the vLLM-layout v1/v2 kernels")
    g.add_argument("--executor-prefill", choices=("auto", "kernel", "wgmma", "sdpa"), default="auto",
                   help="prefill attention: the paged prefill kernel's mma.sync configurations (kernel, as the "
                        "committed cost profiles measured it), its own choice with the warpgroup kernels on "
                        "Hopper (wgmma), or gather + torch SDPA (default auto: kernel when the kernels package "
                        "has it)")
    g.add_argument("--executor-eager", action="store_true", help="no CUDA graphs: every step runs eagerly")


def executor_from_args(args: argparse.Namespace):
    """The `config -> StepExecutor` factory that `--executor` asks for, or None."""
    kind = getattr(args, "executor", None)
    if kind is None:
        return None
    from validation.step_executor import ExecutorError, make_executor  # imports torch: only when asked for

    factory = make_executor(kind, dtype=args.executor_dtype, attention=args.executor_attention,
                            prefill=args.executor_prefill, graphs=not args.executor_eager)

    def build(config):
        try:
            return factory(config)
        except (ExecutorError, ValueError) as e:
            raise ConfigError(str(e)) from e
    return build


def _run_and_report(trace, args, out: Path, *, progress: bool) -> int:
    policy, options = settings_from_args(args)
    warning = rejection_warning(trace, policy, options)
    if warning:
        print(f"blocksim: {warning}", file=sys.stderr)
    summary = replay(trace, out, policy=policy, overrides=options, progress=progress,
                     record_plan=getattr(args, "record_plan", False), write_report=not args.no_report,
                     overwrite=getattr(args, "overwrite", False), executor=executor_from_args(args))
    cm = summary.get("cost_model") or {}
    print(f"\nblocksim: {summary['config']['model']['name']} on {summary['config']['gpu']['name']}, "
          f"policy {summary['config']['policy']}, block size {summary['block_size']}, cost model {cm.get('name')}"
          f"{' (' + str(cm['profile']) + ')' if cm.get('profile') else ''}")
    print(format_summary(summary))
    reasons = summary.get("reject_reasons") or {}
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:3]:
        print(f"  rejected x{count}: {reason}")
    if not args.no_report:
        print(f"\nreport: {out / 'report.html'}\n        {out / 'report.md'}")
    print(f"run directory: {out}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    check_out_dir(args.out, args.overwrite)
    check_options(*settings_from_args(args))  # bad options are refused before a large trace is read
    # One replay leaves no cyclic garbage worth a collection before its process ends: the cyclic
    # collector pauses for the whole command (the engine pauses it for a run anyway; on resuming,
    # its first full collection would walk every request and sequence of the run once more).
    collecting = gc.isenabled()
    gc.disable()
    try:
        trace = read_trace_from_args(args.trace, args)
        return _run_and_report(trace, args, Path(args.out), progress=not args.quiet)
    finally:
        if collecting:
            gc.enable()


def cmd_demo(args: argparse.Namespace) -> int:
    from blocksim.experiments import demo

    summary = demo.run_demo(args.out, workers=args.workers, progress=not args.quiet, report=not args.no_report)
    return 1 if (summary["status"] != "ok").any() else 0


def cmd_catalog(args: argparse.Namespace) -> int:
    cat = Catalog(args.catalog)
    print("models:")
    for m in cat.models.values():
        print(f"  {m.name:<14} layers={m.num_layers:<3} heads={m.num_heads:<3} kv_heads={m.num_kv_heads:<3} "
              f"head_size={m.head_size} params={m.num_params / 1e9:.1f}B max_len={m.max_model_len}")
    print("gpus:")
    for g in cat.gpus.values():
        print(f"  {g.name:<12} memory={g.memory_bytes / 2**30:.0f}GiB hbm={g.hbm_bw_gbps:.0f}GB/s "
              f"fp16={g.fp16_tflops:.0f}TFLOP/s host_link={g.host_link_gbps:.0f}GB/s "
              f"gpu_link={g.gpu_link_gbps:.0f}GB/s")
    if args.model:
        cfg = build_config(model=args.model, gpu=args.gpu, catalog=tuple(args.catalog))
        print(f"\n{args.model} on {cfg.gpu.name}: {cfg.num_gpu_blocks} GPU blocks, {cfg.num_cpu_blocks} CPU blocks "
              f"of {cfg.block_bytes / 2**20:.1f} MiB")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    print("presets:")
    for name in PRESETS:
        p = policy_config(name)
        knobs = ", ".join(f"{k}={v}" for k, v in vars(p).items() if v != getattr(type(p)(), k)) or "defaults"
        print(f"  {name:<13} {knobs}")
    for kind in ("allocator", "scheduler", "victim", "cost_model"):
        print(f"{kind}: {', '.join(plugins.names(kind))}")
    return 0


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line: the command, the problem, where to look."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}; see `{self.prog} --help`\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, and an unknown flag is answered with the closest known one."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            unknown = " ".join(extras)
            flags = sorted({f for p in _parsers(self) for a in p._actions for f in a.option_strings})
            close = [m for e in extras if e.startswith("--")
                     for m in difflib.get_close_matches(e.split("=")[0], flags, n=1)]
            self.error(f"unrecognized arguments: {unknown}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        return parsed


def _parsers(parser: argparse.ArgumentParser):
    """`parser` and every sub-command parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def add_verbose_option(p: argparse.ArgumentParser, top: bool = False) -> None:
    """-v / --verbose: log what is read and written (-v), and tracebacks of handled errors (-vv)."""
    p.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                   help="say more on stderr: -v logs what is read and written, -vv adds tracebacks of "
                        "handled errors (default: warnings and errors only)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command, or (`command`) the built-in commands and the
    module that adds `command` (`COMMAND_MODULES`)."""
    p = Parser(prog="blocksim", description="KV-cache memory management simulator for LLM serving")
    p.add_argument("--version", action=_VersionAction)
    add_verbose_option(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay a trace through the simulated engine")
    r.add_argument("trace", help="trace file (Azure, BurstGPT, Mooncake, generic CSV/JSONL/Parquet)")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="run directory to write (summary.json, requests/steps tables, report); built aside and "
                        "renamed into place when complete")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an existing non-empty --out whole (default: refuse it)")
    add_option(r, "policy")
    r.add_argument("--no-report", action="store_true", help="skip report.html / report.md")
    r.add_argument("--record-plan", action="store_true",
                   help="write the execution plan (plan/) for `blocksim validate`; steps one by one")
    r.add_argument("--quiet", action="store_true", help="no progress bar (drawn only when stderr is a terminal)")
    add_option_group(r, "run")
    add_config_options(r)
    add_trace_read_options(r)
    add_executor_options(r)
    r.set_defaults(func=cmd_replay)

    d = sub.add_parser("demo", help="compare KV-cache policies on a bundled trace slice where memory is the "
                                    "bottleneck, print the findings and write a report",
                       description=_demo_description(command))
    d.add_argument("--out", default="blocksim-demo", metavar="DIR", help="default ./blocksim-demo")
    d.add_argument("--workers", type=options.positive_int, default=None,
                   help="parallel runs (default: local cores)")
    d.add_argument("--no-report", action="store_true", help="skip report.html / report.md")
    d.add_argument("--quiet", action="store_true", help="no progress bar (drawn only when stderr is a terminal)")
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("catalog", help="list built-in and user models and GPUs")
    c.add_argument("--catalog", action="append", default=[], metavar="FILE",
                   help="YAML/TOML file adding models and GPUs; repeatable")
    c.add_argument("--model", default=None, help="also print this model's block counts on --gpu")
    c.add_argument("--gpu", default=options.DEFAULT_GPU,
                   help=f"GPU for --model's block counts (default {options.DEFAULT_GPU})")
    c.set_defaults(func=cmd_catalog)

    pol = sub.add_parser("policies", help="list policy presets and the registered plug-ins")
    pol.set_defaults(func=cmd_policies)

    for module, add, names in COMMAND_MODULES:
        if command is None or command in names:
            getattr(importlib.import_module(module), add)(sub)
    for command in sub.choices.values():
        add_verbose_option(command)
    return p


def _demo_description(command: str | None) -> str | None:
    """The demo's long description, where its module is loaded anyway (its command or the whole parser)."""
    if command not in (None, "demo"):
        return None
    from blocksim.experiments import demo

    return demo.DESCRIPTION


def _command_of(argv: list[str]) -> str | None:
    """The command `argv` names when it is a known one (after the top-level flags), "" for
    --version (which needs no command), else None (the whole parser)."""
    known = set(BUILT_IN_COMMANDS).union(*(names for _, _, names in COMMAND_MODULES))
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in known else None
        if arg in ("-h", "--help"):
            return None
        if arg == "--version":
            return ""
    return None


class _VersionAction(argparse.Action):
    """--version: prints the installed version (read from the package metadata only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"blocksim {version()}")
        parser.exit()


def version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("blocksim")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed; run `pip install -e .`)"


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = " ".join(str(message).split())
    print(f"blocksim: warning: {text}", file=sys.stderr if file is None else file)


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="blocksim: %(levelname)s: %(message)s", stream=sys.stderr, force=True)


def _fail(message: str, exc: BaseException, verbosity: int) -> int:
    """Print `message` as one line (the traceback too with -vv) and return exit status 2."""
    if verbosity >= 2:
        traceback.print_exception(exc)
    print(f"blocksim: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`blocksim ... | head`): stop quietly, as command-line tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, the status of a tool killed by a broken pipe


def main(argv: list[str] | None = None) -> int:
    """The `blocksim` command. Exit status: 0 done, 1 some runs failed, 2 bad input (one line on
    stderr naming the file, field or option and the fix), 130 interrupted (Ctrl-C), 141 broken pipe."""
    verbosity = 0
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(_command_of(argv)).parse_args(argv)
        args.cli_argv = list(argv)  # what a command records of how it was called (a profile's "command")
        verbosity = getattr(args, "verbose", 0) or 0
        _setup_logging(verbosity)
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            code = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        print("blocksim: interrupted; nothing half-written is left and earlier output is unchanged",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except plugins.PluginError as e:
        return _fail(f"plugin error: {e}", e, verbosity)
    except ConfigError as e:
        return _fail(f"configuration error: {e}", e, verbosity)
    except (TraceError, FileNotFoundError, EngineError) as e:  # errors that carry a user-facing message
        return _fail(str(e), e, verbosity)
    except OSError as e:
        if e.filename is None:
            raise
        return _fail(f"{e.filename}: {e.strerror or e}; check the path and its permissions", e, verbosity)
    except Exception as e:
        which = plugins.blame(e)
        if which is None:
            raise
        return _fail(f"plugin error: {which}", e, verbosity)


if __name__ == "__main__":
    sys.exit(main())
