import numpy as np
import pytest

from traces import bundled
from traces.arrivals import gamma_arrivals, poisson_arrivals
from traces.lengths import Empirical, Fixed, LogNormal, Uniform, parse_length
from traces.stats import interarrival_cv, prefix_reuse
from traces.synth import multi_turn_trace, shared_prefix_trace, synth_trace


def test_arrival_processes_hit_rate_and_cv():
    rng = np.random.default_rng(0)
    poisson = poisson_arrivals(20000, 4.0, rng)
    assert poisson[0] == 0.0 and len(poisson) / poisson[-1] == pytest.approx(4.0, rel=0.05)
    assert interarrival_cv(poisson) == pytest.approx(1.0, abs=0.05)
    bursty = gamma_arrivals(20000, 4.0, 3.0, rng)
    assert interarrival_cv(bursty) == pytest.approx(3.0, rel=0.15)


def test_length_distributions():
    rng = np.random.default_rng(1)
    assert (Fixed(7).sample(5, rng) == 7).all()
    uniform = Uniform(3, 5).sample(1000, rng)
    assert set(uniform) == {3, 4, 5}
    lognormal = LogNormal(500, 1.0, max_tokens=4000).sample(50000, rng)
    assert lognormal.mean() == pytest.approx(500, rel=0.05) and lognormal.max() <= 4000 and lognormal.min() >= 1
    empirical = Empirical(np.array([2, 9])).sample(100, rng)
    assert set(empirical) <= {2, 9}


def test_parse_length_forms():
    assert parse_length("fixed:16") == Fixed(16)
    assert parse_length("uniform:1:9") == Uniform(1, 9)
    assert parse_length("lognormal:100:0.5:800") == LogNormal(100.0, 0.5, 800)
    empirical = parse_length(f"empirical:{bundled('azure-conv')}:output")
    assert len(empirical.values) == 2000
    with pytest.raises(ValueError, match="bad length distribution"):
        parse_length("normal:5")


def test_synth_is_reproducible_and_seeded():
    kwargs = {"rate_per_s": 3.0, "prompt": LogNormal(300, 1), "output": Uniform(1, 50), "cv": 2.0}
    a, b = synth_trace(200, seed=5, **kwargs), synth_trace(200, seed=5, **kwargs)
    assert a.df.equals(b.df)
    assert not a.df.equals(synth_trace(200, seed=6, **kwargs).df)


def test_synth_n_and_beam_width():
    trace = synth_trace(10, rate_per_s=1, prompt=Fixed(8), output=Fixed(4), n=3)
    assert (trace.df["n"] == 3).all() and "beam_width" not in trace.df
    beam = synth_trace(10, rate_per_s=1, prompt=Fixed(8), output=Fixed(4), beam_width=4)
    assert (beam.df["n"] == 4).all() and (beam.df["beam_width"] == 4).all()
    with pytest.raises(ValueError):
        synth_trace(10, rate_per_s=1, prompt=Fixed(8), output=Fixed(4), n=2, beam_width=4)


def test_plain_synth_hashes_are_never_shared():
    trace = synth_trace(100, rate_per_s=1, prompt=Uniform(1, 100), output=Fixed(1), hash_block_tokens=16)
    assert prefix_reuse(trace)["prefix_reuse_ratio"] == 0.0


def test_shared_prefix_requests_share_the_prefix_blocks_only():
    trace = shared_prefix_trace(50, rate_per_s=1, prefix_tokens=100, suffix=Fixed(40), output=Fixed(1),
                                n_prefixes=1, hash_block_tokens=16, seed=2)
    hashes = trace.df["prefix_hashes"].tolist()
    assert all(h[:6] == hashes[0][:6] for h in hashes), "100 prefix tokens = 6 full shared blocks"
    tails = [x for h in hashes for x in h[6:]]
    assert len(tails) == len(set(tails)), "blocks after the prefix are private"
    assert prefix_reuse(trace)["prefix_reuse_ratio"] == pytest.approx(49 * 6 / (50 * 9))


def test_multi_turn_prompts_extend_the_previous_context():
    trace = multi_turn_trace(3, turns=3, rate_per_s=0.01, user=Fixed(20), output=Fixed(10),
                             think_s=1.0, hash_block_tokens=16, seed=4)
    df = trace.df.sort_values("request_id")
    first = df[df["request_id"] // 3 == 0]
    assert first["prompt_tokens"].tolist() == [20, 50, 80]
    h0, h1, h2 = first["prefix_hashes"].tolist()
    assert h1[:1] == h0[:1] and h2[:3] == h1[:3], "full blocks are shared with later turns"
    assert h1[1] != h0[1], "a partial last block is not reused"
