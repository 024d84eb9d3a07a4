"""The options table: one declaration per option, read by the runner, the sweep names and the layering."""

import json
import subprocess
import sys

import pandas as pd

from blocksim.config import ADDRESS_SPACES, CacheConfig, SchedulerConfig
from blocksim.experiments.runner import build_config, replay
from blocksim.experiments.spec import Point
from blocksim.memory.address_space import CONTIGUOUS_ALLOCATORS
from blocksim.options import (
    BY_NAME,
    CONFIG_OPTIONS,
    DEFAULTS,
    OPTIONS,
    POLICY_KEYS,
    RUN_DEFAULTS,
    RUN_OPTIONS,
    SHORT_NAMES,
)


def test_every_option_is_declared_once_with_a_known_group():
    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names))
    assert {o.group for o in OPTIONS} == {"preset", "model", "scheduler", "policy", "tiers", "run"}
    assert RUN_OPTIONS == ("max_requests", "rate_scale", "clip_to_model")
    assert not set(RUN_OPTIONS) & set(CONFIG_OPTIONS) and "policy" not in CONFIG_OPTIONS
    assert len({s for o in OPTIONS for s in o.cli_flags}) == sum(len(o.cli_flags) for o in OPTIONS), "no shared flag"
    assert len(set(SHORT_NAMES.values())) == len(SHORT_NAMES), "run directory prefixes are unambiguous"


def test_the_runner_defaults_are_the_config_dataclasses_own():
    cfg = build_config()
    assert cfg.cache == CacheConfig(), "block size, utilization, swap space and watermark defaults"
    assert cfg.scheduler.max_num_seqs == SchedulerConfig().max_num_seqs == DEFAULTS["max_num_seqs"]
    assert cfg.scheduler.preemption_mode == SchedulerConfig().preemption_mode == DEFAULTS["preemption"]
    assert (cfg.model.name, cfg.gpu.name, cfg.tensor_parallel) == (DEFAULTS["model"], DEFAULTS["gpu"], 1)
    assert BY_NAME["watermark"].help.endswith(f"(default {CacheConfig.watermark:g})")


def test_policy_keys_are_the_policy_config_fields_a_user_may_set():
    cfg = build_config("vllm", **{k: None for k in POLICY_KEYS})
    assert set(POLICY_KEYS) == set(vars(cfg.policy_config)), "every PolicyConfig field, nothing else"


def test_sweep_run_directories_use_the_short_names():
    point = Point("conv", {"block_size": 8, "watermark": 0.05, "tensor_parallel": 2, "victim": "largest",
                           "seed": 3}, ("block_size", "watermark", "tensor_parallel", "victim", "seed"))
    assert point.name().startswith("conv_bs8_wm0.05_tp2_victimlargest_s3_")


def test_the_address_space_names_in_the_config_are_the_allocators_in_memory():
    assert tuple(CONTIGUOUS_ALLOCATORS) == ADDRESS_SPACES


def test_config_is_a_leaf_and_the_plugin_registry_does_not_import_policies():
    code = ("import sys, importlib; importlib.import_module(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith('blocksim')))")
    for module, allowed in (("blocksim.config", {"blocksim", "blocksim.config"}),
                            ("blocksim.plugins", {"blocksim", "blocksim.config", "blocksim.plugins"})):
        out = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, check=True)
        assert set(json.loads(out.stdout.replace("'", '"'))) == allowed, out.stdout


def test_run_options_come_from_overrides_then_keywords_then_defaults(tmp_path):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": [0.0, 0.5, 1.0], "prompt_tokens": [10, 20, 30],
                  "output_tokens": [2, 2, 2]}).to_csv(trace, index=False)
    default = replay(trace, tmp_path / "a", overrides={"num_gpu_blocks": 100})
    assert (default["rate_scale"], default["requests"]) == (RUN_DEFAULTS["rate_scale"], 3)
    keyword = replay(trace, tmp_path / "b", rate_scale=2.0, max_requests=2)
    assert (keyword["rate_scale"], keyword["requests"]) == (2.0, 2)
    both = replay(trace, tmp_path / "c", rate_scale=2.0, overrides={"rate_scale": 4.0, "max_requests": 1})
    assert (both["rate_scale"], both["requests"]) == (4.0, 1), "an override wins over the keyword"
