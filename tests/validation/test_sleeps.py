"""`validation.sleeps.Lead`: the sleep before a kind of timed segment, kept ahead of the host."""

import pytest

from validation.sleeps import GRAPH_LEAD_S, LEAD_S, RETIME_LEAD_S, Lead


def test_a_lead_starts_at_its_base_and_stays_there_while_the_host_keeps_ahead_of_it():
    lead = Lead(GRAPH_LEAD_S)
    assert lead.s == GRAPH_LEAD_S
    lead.observe([20e-6] * 100)  # launches well within the sleep: 1.25 x 20 us < 50 us
    assert lead.s == GRAPH_LEAD_S


def test_a_slow_host_raises_the_lead_to_a_margin_over_its_90th_percentile_and_never_past_the_cap():
    lead = Lead(GRAPH_LEAD_S, window=10)
    lead.observe([100e-6] * 9 + [10e-3])  # one outlier in ten: the 90th percentile is the last
    assert lead.s == pytest.approx(min(RETIME_LEAD_S, 1.25 * 10e-3))
    lead.observe([100e-6] * 9 + [200e-6] * 1)  # the window holds the last ten only
    assert lead.s == pytest.approx(1.25 * 200e-6)
    lead.observe([120e-6] * 10)
    assert lead.s == pytest.approx(1.25 * 120e-6)
    lead.observe([1.0] * 10)
    assert lead.s == RETIME_LEAD_S


def test_a_host_that_speeds_up_brings_the_lead_back_down_to_its_base():
    lead = Lead(LEAD_S, window=4)
    lead.observe([3e-3] * 4)
    assert lead.s == pytest.approx(3.75e-3)
    lead.observe([0.5e-3] * 4)
    assert lead.s == LEAD_S


def test_a_lead_refuses_a_base_outside_its_cap():
    with pytest.raises(ValueError, match="base_s"):
        Lead(RETIME_LEAD_S * 2)
    with pytest.raises(ValueError, match="base_s"):
        Lead(-1e-6)
    assert Lead(0.0, 0.0).s == 0.0  # pinned at no sleep at all
