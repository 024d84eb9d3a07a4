"""Configs and catalog: block counts as vLLM derives them, and clear errors for impossible values."""

import dataclasses

import pytest

from blocksim.catalog import Catalog
from blocksim.config import GiB, CacheConfig, ConfigError, SchedulerConfig, SimConfig
from blocksim.cost import CostParams, RooflineCostModel
from blocksim.experiments.runner import build_config
from blocksim.policies import make_memory_manager


def test_block_bytes_and_block_counts():
    cfg = build_config(model="llama-2-7b", gpu="h100-80gb")
    m = cfg.model
    assert cfg.block_bytes == 2 * 32 * 32 * 128 * 16 * 2
    expected = int((80 * GiB * 0.9 - m.num_params * 2 - cfg.activation_bytes) // cfg.block_bytes)
    assert cfg.num_gpu_blocks == expected
    assert cfg.num_cpu_blocks == 4 * GiB // cfg.block_bytes


def test_gqa_and_tensor_parallel_shrink_blocks():
    a = build_config(model="llama-2-70b", gpu="h100-80gb", tensor_parallel=4)
    assert a.kv_heads_per_gpu == 2 and a.block_bytes == 2 * 80 * 2 * 128 * 16 * 2
    b = build_config(model="llama-2-70b", gpu="h100-80gb", tensor_parallel=8)
    assert b.kv_heads_per_gpu == 1


@pytest.mark.parametrize("kwargs, field", [
    ({"block_size": 0}, "block_size"),
    ({"block_size": 12}, "block_size"),
    ({"watermark": 1.0}, "watermark"),
    ({"watermark": -0.1}, "watermark"),
    ({"tensor_parallel": 3}, "tensor_parallel"),
    ({"model": "opt-175b", "gpu": "a100-40gb"}, "gpu"),
    ({"preemption": "evict"}, "preemption_mode"),
    ({"model": "gpt-9"}, "unknown model"),
    ({"gpu": "tpu"}, "unknown GPU"),
    ({"bogus": 1}, "unknown option"),
])
def test_invalid_configs_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        build_config(**kwargs)


def test_weights_too_large_names_the_fix():
    with pytest.raises(ConfigError, match="raise tensor_parallel"):
        build_config(model="llama-2-70b", gpu="a100-80gb")


def test_user_catalog_files(tmp_path):
    y = tmp_path / "mine.yaml"
    y.write_text("models:\n  tiny: {num_layers: 2, hidden_size: 256, num_heads: 4, num_kv_heads: 2, head_size: 64,"
                 " num_params: 1.0e7, max_model_len: 1024, intermediate_size: 512, vocab_size: 1000}\n"
                 "gpus:\n  small: {memory_gib: 8, hbm_bw_gbps: 300, fp16_tflops: 50, host_link_gbps: 16}\n")
    t = tmp_path / "mine.toml"
    t.write_text('[gpus.other]\nmemory_gib = 16\nhbm_bw_gbps = 500\nfp16_tflops = 80\nhost_link_gbps = 20\n')
    cat = Catalog([y, t])
    assert cat.model("tiny").num_kv_heads == 2 and cat.gpu("other").memory_bytes == 16 * GiB
    cfg = build_config(model="tiny", gpu="small", catalog=(str(y),))
    assert cfg.num_gpu_blocks > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  x: {memory_gib: 8}\n")
    with pytest.raises(ConfigError, match="missing field"):
        Catalog([bad])


def test_frozen_dataclasses_validate_directly():
    with pytest.raises(ConfigError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=1.5)
    cfg = build_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tensor_parallel = 2
    assert isinstance(cfg, SimConfig)


def test_swap_cost_per_block_copies_or_batched(tmp_path):
    cfg = build_config(model="llama-2-7b", gpu="h100-80gb")
    v0 = RooflineCostModel(cfg)
    batched = RooflineCostModel(cfg, CostParams(swap_batched=True))
    link = cfg.block_bytes / (cfg.gpu.host_link_gbps * 1e9)
    lat = cfg.gpu.transfer_latency_s * 2 * cfg.model.num_layers
    assert v0.swap(10) == pytest.approx(10 * link + 10 * lat)
    assert batched.swap(10) == pytest.approx(10 * link + lat)
    profile = tmp_path / "p.json"
    profile.write_text('{"params": {"swap_batched": true, "scale_swap": 0.5}, "source": "test"}')
    assert CostParams.from_json(profile).swap_batched is True


def test_watermark_blocks_are_the_fraction_of_gpu_blocks_unless_set_explicitly():
    assert build_config(num_gpu_blocks=1000).watermark_blocks == 10, "vLLM's default 1% of 1000 blocks"
    assert build_config(num_gpu_blocks=1000, watermark=0.05).watermark_blocks == 50
    assert build_config(num_gpu_blocks=999, watermark=0.05).watermark_blocks == 49, "rounded down, as vLLM does"
    assert build_config(num_gpu_blocks=1000, watermark_blocks=7).watermark_blocks == 7
    assert build_config(num_gpu_blocks=1000, watermark=0.3, watermark_blocks=0).watermark_blocks == 0, \
        "an explicit block count replaces the fraction"


def test_the_memory_manager_keeps_the_configured_watermark_free():
    for options, blocks in (({}, 10), ({"watermark_blocks": 3}, 3), ({"watermark": 0.2}, 200)):
        cfg = build_config(num_gpu_blocks=1000, **options)
        assert make_memory_manager(cfg).watermark_blocks == cfg.watermark_blocks == blocks
    assert make_memory_manager(build_config("vllm-prefix", num_gpu_blocks=1000)).watermark_blocks == 10
