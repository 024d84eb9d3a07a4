"""Step-by-step check of `vllm-v1` against vLLM V1's own Scheduler and KVCacheManager (vLLM 0.11.0).

vLLM V1's scheduler and KV cache manager are pure Python and run on a CPU without a model. This
script drives vLLM's `Scheduler` and blocksim's `V1Scheduler` with the same requests, arriving at
the same steps, and compares every step: tokens scheduled per request, preempted requests,
prefix-hit tokens of admitted requests and free blocks. vLLM is not a dependency of blocksim: run
this with an interpreter that has vLLM 0.11.0 and sees blocksim, e.g.

    python -m venv --system-site-packages /tmp/venv-vllm
    /tmp/venv-vllm/bin/pip install --no-deps vllm==0.11.0
    /tmp/venv-vllm/bin/pip install cachetools cbor2 psutil setproctitle pyzmq transformers aiohttp \\
        blake3 msgspec prometheus_client fastapi openai openai_harmony pybase64 diskcache
    PYTHONPATH=. /tmp/venv-vllm/bin/python benchmarks/vllm_v1_check.py [--random N]

`--random N` adds N random configurations (requests, GPU blocks, block size, budget,
max_num_seqs, threshold, policy) to the fixed ones.

Block contents: request i's prompt is made of blocks drawn from a few shared prefixes (equal
content ids give equal token blocks on both sides), its other tokens and its outputs are unique
to it. vLLM's model runner is replaced by sampling one token for each request whose scheduled
tokens reach its end (none for a partial prefill). Prints one line per configuration and the
first differing step, if any; exits 1 on a difference other than the known one (`KNOWN`).
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import torch
from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.utils import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from blocksim.config import PolicyConfig
from blocksim.config import SchedulerConfig as BlocksimSchedulerConfig
from blocksim.memory.kv_cache_manager import KVCacheManager
from blocksim.scheduling.v1_scheduler import V1PriorityScheduler, V1Scheduler
from blocksim.sequence import SequenceGroup

MAX_MODEL_LEN = 4096


def workload(seed: int, n: int, bs: int):
    """(arrival_step, content ids of full prompt blocks, prompt tokens, output tokens, priority) per request."""
    rng = random.Random(seed)
    prefixes = [[1000 * p + j for j in range(rng.randint(1, 12))] for p in range(4)]
    reqs = []
    for i in range(n):
        prefix = rng.choice(prefixes)[: rng.randint(0, 12)]
        prompt = len(prefix) * bs + rng.randint(1, 6 * bs)
        keys = prefix + [10_000_000 + 1000 * i + j for j in range(prompt // bs - len(prefix))]
        reqs.append((rng.randint(0, 3 * n), keys, prompt, rng.randint(1, 60), rng.randint(0, 2)))
    return sorted(reqs, key=lambda r: r[0])


def prompt_tokens(i: int, keys: list[int], prompt: int, bs: int) -> list[int]:
    full = [k * bs + t for k in keys for t in range(bs)]  # equal content ids, equal token blocks
    return full + [900_000_000 + 10_000 * i + p for p in range(len(full), prompt)]


def make_vllm(num_blocks, bs, budget, max_seqs, threshold, policy):
    sched_cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN,
                                enable_chunked_prefill=True, long_prefill_token_threshold=threshold, policy=policy)
    cache_cfg = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
                            enable_prefix_caching=True)
    cache_cfg.num_gpu_blocks = num_blocks
    model_cfg = SimpleNamespace(is_encoder_decoder=False, is_multimodal_model=False, max_model_len=MAX_MODEL_LEN,
                                uses_mrope=False)
    vllm_config = SimpleNamespace(scheduler_config=sched_cfg, cache_config=cache_cfg, lora_config=None,
                                  kv_events_config=None, parallel_config=ParallelConfig(), model_config=model_cfg,
                                  kv_transfer_config=None, speculative_config=None)
    kv_cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    structured = SimpleNamespace(should_advance=lambda r: False, grammar_bitmask=lambda *a, **k: None)
    return Scheduler(vllm_config, kv_cfg, structured_output_manager=structured, log_stats=False)


def make_blocksim(num_blocks, bs, budget, max_seqs, threshold, policy):
    kv = KVCacheManager(bs, num_blocks, MAX_MODEL_LEN)
    kv.hash_block_tokens = bs
    cls = V1PriorityScheduler if policy == "priority" else V1Scheduler
    cfg = BlocksimSchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                                  long_prefill_token_threshold=threshold)
    return cls(cfg, kv, MAX_MODEL_LEN, PolicyConfig(allocator="v1", scheduler="v1", prefix_caching=True,
                                                    chunked_prefill=True))


def run(seed, n, num_blocks, bs, budget, max_seqs, threshold, policy):
    init_none_hash(sha256)
    reqs = workload(seed, n, bs)
    v = make_vllm(num_blocks, bs, budget, max_seqs, threshold, policy)
    b = make_blocksim(num_blocks, bs, budget, max_seqs, threshold, policy)
    hasher = get_request_block_hasher(bs, sha256)
    vreq: dict[str, Request] = {}
    groups: dict[str, SequenceGroup] = {}
    nxt, step, done, steps_compared = 0, 0, 0, 0
    stats = {"preemptions": 0, "hit_tokens": 0}
    while done < len(reqs):
        while nxt < len(reqs) and reqs[nxt][0] <= step:
            arrival, keys, prompt, output, prio = reqs[nxt]
            rid = str(nxt)
            r = Request(rid, prompt_tokens(nxt, keys, prompt, bs), SamplingParams(max_tokens=output, ignore_eos=True),
                        None, None, arrival_time=float(nxt), priority=prio, block_hasher=hasher)
            vreq[rid] = r
            v.add_request(r)
            g = SequenceGroup(nxt, nxt, float(nxt), prompt, output, 1, prio, nxt, prefix_hashes=keys)
            groups[rid] = g
            b.add_request(g)
            nxt += 1
        was_running = {rid for rid, r in vreq.items() if r.status == RequestStatus.RUNNING}
        was_waiting = {rid for rid, r in vreq.items() if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)}
        so = v.schedule()
        out = b.schedule()
        got_v = dict(so.num_scheduled_tokens)
        got_b = {str(p.group.request_id): p.stop - p.start for p in out.prefills}
        got_b.update({str(g.request_id): 1 for g in out.decode_groups})
        hits_v = {rid: vreq[rid].num_computed_tokens - got_v[rid] for rid in got_v if rid in was_waiting}
        hits_b = {str(p.group.request_id): p.start for p in out.prefills if p.group.prefill_pos == p.start
                  and str(p.group.request_id) in was_waiting}
        pre_vs = sorted(rid for rid in was_running if vreq[rid].status == RequestStatus.PREEMPTED)
        pre_bs = sorted(str(g.request_id) for g in out.preempted)
        free_v = v.kv_cache_manager.block_pool.get_num_free_blocks()
        free_b = b.kv.num_free_gpu_blocks
        if (got_v, pre_vs, hits_v, free_v) != (got_b, pre_bs, hits_b, free_b):
            known = any(rid in got_v for rid in pre_vs)  # see KNOWN below
            return (f"step {step}: vLLM tokens {got_v} preempted {pre_vs} hits {hits_v} free {free_v}; "
                    f"blocksim tokens {got_b} preempted {pre_bs} hits {hits_b} free {free_b}"
                    + (f" ({KNOWN})" if known else "")), steps_compared, stats
        steps_compared += 1
        stats["preemptions"] += len(pre_bs)
        stats["hit_tokens"] += sum(hits_b.values())
        sampled = [[800_000_000 + 10_000 * int(rid) + len(vreq[rid].output_token_ids)]
                   if vreq[rid].num_computed_tokens >= vreq[rid].num_tokens else [] for rid in so.num_scheduled_tokens]
        ids = list(so.num_scheduled_tokens)
        v.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                   sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                                   pooler_output=[]))
        done += len(b.complete_step(out, float(step)))
        step += 1
        if step > 100_000:
            return "no end after 100,000 steps", steps_compared, stats
    return None, steps_compared, stats


KNOWN = ("vLLM 0.11.0 keeps a priority victim scheduled earlier in the step in the step's tokens, does not "
         "return them to the budget and skips the next running request; later releases undo the victim's "
         "tokens, as blocksim does")

CONFIGS = [  # (seed, requests, GPU blocks, block size, budget, max_num_seqs, long_prefill_token_threshold, policy)
    (0, 40, 400, 16, 8192, 1024, 0, "fcfs"),
    (1, 60, 60, 16, 512, 256, 0, "fcfs"),
    (2, 60, 40, 16, 256, 8, 0, "fcfs"),
    (3, 60, 80, 16, 300, 16, 64, "fcfs"),
    (4, 60, 50, 8, 128, 128, 0, "fcfs"),
    (5, 60, 60, 16, 512, 256, 0, "priority"),
    (6, 80, 45, 16, 200, 32, 48, "priority"),
]


def random_configs(n: int, seed: int = 7) -> list[tuple]:
    """`n` random configurations (those vLLM accepts: max_num_seqs <= the token budget)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        cfg = (100 + k, rng.choice([40, 80, 120]), rng.choice([30, 50, 100, 300]), rng.choice([8, 16, 32]),
               rng.choice([64, 128, 256, 1024]), rng.choice([4, 16, 64]), rng.choice([0, 0, 32]),
               rng.choice(["fcfs", "fcfs", "priority"]))
        if cfg[5] <= cfg[4]:
            out.append(cfg)
    return out


def main() -> int:
    bad = 0
    configs = CONFIGS + (random_configs(int(sys.argv[2])) if sys.argv[1:2] == ["--random"] else [])
    for cfg in configs:
        diff, steps, stats = run(*cfg)
        print(f"seed={cfg[0]} requests={cfg[1]} blocks={cfg[2]} block_size={cfg[3]} budget={cfg[4]} "
              f"max_num_seqs={cfg[5]} threshold={cfg[6]} policy={cfg[7]}: {steps} steps equal "
              f"({stats['preemptions']} preemptions, {stats['hit_tokens']} prefix-hit tokens)"
              + (f"; FIRST DIFFERENCE {diff}" if diff else ""), flush=True)
        bad += diff is not None and KNOWN not in diff
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
