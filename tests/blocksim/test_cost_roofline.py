"""The roofline cost model's prefill attention: one prompt priced on Python floats, several on arrays."""

import numpy as np

from blocksim.cost import RooflineCostModel
from blocksim.experiments.runner import build_config


def array_price(cm: RooflineCostModel, new, cached) -> float:
    """The roofline's prefill attention written on arrays: coefficient x sum(p (c + p / 2)) / FLOP/s, scaled."""
    p = np.asarray(new, dtype=np.float64)
    c = 0.0 if cached is None else np.asarray(cached, dtype=np.float64)
    return float(cm.attn_flops_coef * np.sum(p * (c + p / 2)) / cm.flops) * cm.params.scale_attn_prefill


def test_one_prompt_is_priced_bit_for_bit_as_on_arrays():
    """A step of one prompt (most prompt steps) gives the value of the array arithmetic exactly, with
    and without a cached prefix, and several prompts keep the array path."""
    cm = RooflineCostModel(build_config(model="llama-2-7b", gpu="h100-80gb"))
    rng = np.random.default_rng(11)
    for new, cached in zip(rng.integers(1, 40_000, 2_000), rng.integers(0, 40_000, 2_000)):
        assert cm.attn_prefill(np.array([new]), np.array([cached])) == array_price(cm, [new], [cached])
        assert cm.attn_prefill(np.array([new])) == array_price(cm, [new], None)
    several = (np.array([300, 1_000, 7]), np.array([0, 512, 64]))
    assert cm.attn_prefill(*several) == array_price(cm, *several)
