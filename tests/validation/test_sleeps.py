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


def test_a_lead_refuses_an_empty_window():
    with pytest.raises(ValueError, match="window"):
        Lead(LEAD_S, window=0)


def test_the_profilers_clock_sleeps_a_graph_replays_lead_before_a_graph_and_keeps_block_moves_out(
        monkeypatch, host_clock_cuda):
    """`_Clock.once`: a function marked `graph` (as `_graph` marks its replays) sleeps the graph
    lead and feeds it; an eager one the eager lead; a block move's fixed sleep (`begin(lead)`)
    feeds neither."""
    torch = pytest.importorskip("torch")
    from validation.profile import _Clock
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    clock = _Clock(torch, cuda=True)
    seen = []

    def graph(timer):
        seen.append(timer.lead_s)
        timer.begin()
        timer.end()
    graph.graph = True

    def eager(timer):
        seen.append(timer.lead_s)
        for _ in range(3):
            timer.begin()
            timer.end()

    def move(timer):
        timer.begin(6e-3)
        timer.end()
    clock.once(graph)
    clock.once(eager)
    clock.once(move)
    assert seen == [GRAPH_LEAD_S, LEAD_S]
    assert len(clock.graph_lead._recent) == 1 and len(clock.eager_lead._recent) == 3
