"""A plugin whose own time does not pay for itself steps aside (scorers/step_aside.py, and the adapter's use of it)."""
import numpy as np
import pytest

from freespec.proposers.base import Draft
from freespec.scorers import step_aside as sa
from freespec.scorers.policy import rows_group
from freespec.scorers.step_aside import StepAside
from freespec.testing.adapter_checks import adapter_for
from freespec.vllm_plugins import adapter as adapter_module


def run(aside, steps, drafting, plain, rows=1):
    """``steps`` engine steps; ``drafting`` and ``plain``: (seconds, tokens produced, plugin seconds) of a step
    with the plugin and without it. Returns how many steps the plugin sat out."""
    out = 0
    for _ in range(steps):
        drafts = aside.drafts(rows)
        seconds, produced, own = drafting if drafts else plain
        aside.observe(rows, drafts, seconds, produced, own if drafts else 0.0)
        out += not drafts
    return out


# A draft model that does not keep up: the target waits 300 ms for its chain, 2.4 tokens a step of 600 ms,
# against 200 ms a token without it (0.8x; the Qwen pair's pearl run was 0.72x).
SLOW = (0.600, 2.4, 0.300)
PLAIN = (0.200, 1, 0.0)


def test_a_draft_that_does_not_keep_up_steps_aside():
    aside = StepAside()
    out = run(aside, 2000, SLOW, PLAIN)
    assert out > 0.9 * 2000
    assert aside.stepped_aside() == {1: True}
    assert any("steps aside" in change for change in aside.changes)


def test_a_draft_that_pays_keeps_drafting_and_rechecks_less_and_less_often():
    aside = StepAside()
    out = run(aside, 4000, (0.300, 2.4, 0.100), PLAIN)  # 125 ms a token drafting
    # its first comparison, then rechecks after 128, 256, 512, 1024, 2048 steps: each PHASE_STEPS + SETTLE_STEPS
    assert out <= 6 * (sa.PHASE_STEPS + sa.SETTLE_STEPS)
    assert aside.stepped_aside() == {1: False}


def test_rechecks_of_a_slow_draft_cost_at_most_a_small_share_of_the_steps():
    """A draft that loses by a wide margin is measured again only when that costs RECHECK_SHARE of the steps."""
    for drafting, loss in ((SLOW, 0.25), ((0.800, 2.0, 0.500), 1.0)):  # 250 and 400 ms a token against 200
        aside = StepAside()
        run(aside, 200, drafting, PLAIN)
        assert aside.stepped_aside() == {1: True}
        drafted = 2000 - run(aside, 2000, drafting, PLAIN)
        assert drafted * loss <= 2 * sa.RECHECK_SHARE * 2000  # step-equivalents lost to rechecks
        assert drafted >= sa.EARLY_STEPS  # but rechecked (a wide loss ends a recheck EARLY_STEPS steps in)


def test_a_first_comparison_measures_plain_decoding_first_and_ends_a_wide_loss_early():
    """The Qwen pair's first question at one request served 0.68x no speculation: it ran sixteen drafting steps of
    a draft that lost by 40% before plain decoding was measured. Plain decoding is now measured first, and a
    drafting measurement losing by more than WIDE_LOSS ends EARLY_STEPS measured steps in."""
    aside = StepAside()
    run(aside, sa.PHASE_STEPS, SLOW, PLAIN, rows=1)  # the plugin's share is measured: a costly one
    slow2, plain2 = (1.000, 2 * 1.2, 0.600), (0.250, 2, 0.0)  # 417 ms a token drafting against 125
    plain_phase = sa.PHASE_STEPS + sa.SETTLE_STEPS
    assert run(aside, plain_phase, slow2, plain2, rows=2) == plain_phase  # plain first
    first = sa.SETTLE_STEPS + sa.EARLY_STEPS
    assert run(aside, first, slow2, plain2, rows=2) == 0
    assert aside.groups[2].best is None
    assert run(aside, 50, slow2, plain2, rows=2) == 50  # decided after those steps: aside
    assert aside.stepped_aside()[2] is True
    # a narrow loss (10%) is measured the whole phase: a few steps cannot tell it from a tie
    aside = StepAside()
    run(aside, sa.PHASE_STEPS, SLOW, PLAIN, rows=1)
    near2 = (0.550, 2 * 2.0, 0.300)  # 137.5 ms a token against 125
    assert run(aside, plain_phase, near2, plain2, rows=2) == plain_phase
    assert run(aside, plain_phase - 1, near2, plain2, rows=2) == 0
    assert aside.groups[2].best is None


def test_a_cheap_plugin_never_steps_aside_even_when_its_steps_are_slower():
    """Below COSTLY_SHARE of a step the policy's bar decides; a text source is not switched off for noise."""
    aside = StepAside()
    assert run(aside, 1000, (0.250, 1.0, 0.002), PLAIN) == 0


def test_a_cheap_plugins_one_time_first_call_does_not_make_it_step_aside_at_a_cold_start():
    """SmolLM2 in bfloat16, a cold server: the default's first call took 12 ms of a 35 ms step (a request's first
    suffix tree), every later one well under 1 ms, and its first drafts were rarely accepted (nothing learned yet:
    44 ms a token drafting against 35 without). As the running average's first value, the spike made it costly,
    and it sat out 298 steps of the first pass."""
    aside = StepAside()
    out = 0
    for step in range(400):
        drafts = aside.drafts(1)
        own = (0.012 if step == 0 else 0.0004) if drafts else 0.0
        aside.observe(1, drafts, 0.044 if drafts else 0.035, 1, own)
        out += not drafts
    assert out == 0 and aside.share < sa.COSTLY_SHARE


def test_a_tie_is_decided_once_a_measurement_ends_not_every_step():
    """Two modes level with each other while every step grows slower (the context grows): the mode running
    looks slower than the one measured earlier. The decision changes only when a phase of measuring ends (it
    once flipped, and logged, every few steps)."""
    aside = StepAside()
    for step in range(3000):
        drafts = aside.drafts(1)  # a draft model: a quarter of the step, its tokens pay exactly that
        aside.observe(1, drafts, 0.200 * (1 + step / 3000) * (1.25 if drafts else 1), 1.25 if drafts else 1,
                      0.050 if drafts else 0.0)
    rechecks = 3000 // sa.FIRST_RECHECK + 1
    assert len(aside.changes) <= rechecks, aside.changes


def test_a_plugin_that_starts_paying_is_back_within_a_recheck():
    aside = StepAside()
    run(aside, 300, SLOW, PLAIN)
    assert aside.stepped_aside() == {1: True}
    out = run(aside, sa.LAST_RECHECK + 2 * sa.PHASE_STEPS, (0.300, 3.0, 0.100), PLAIN)
    assert aside.stepped_aside() == {1: False}
    assert out < sa.LAST_RECHECK


def test_a_plugin_that_pauses_its_costly_part_while_aside_drafts_again_after_a_recheck():
    """``hybrid`` with a draft source: slow at first, it steps aside; its source pricing has paused the draft
    source by then, so at its next recheck the plugin costs 1% of a step (one step in 32 still runs the paused
    source's probe) and, like any cheap plugin, drafts, its drafts left to the policy: as
    ``hybrid`` without the draft source would. The running share alone, moved only by rechecks' few
    drafting steps, kept it out for thousands of steps."""
    aside = StepAside()
    run(aside, 200, SLOW, PLAIN)
    assert aside.stepped_aside() == {1: True}
    aside.changes.clear()
    cheap, probe = (0.210, 1.0, 0.002), (0.400, 1.0, 0.190)
    out = 0
    for step in range(3000):
        drafts = aside.drafts(1)
        seconds, produced, own = (probe if step % 32 == 0 else cheap) if drafts else PLAIN
        aside.observe(1, drafts, seconds, produced, own if drafts else 0.0)
        out += not drafts
    assert aside.stepped_aside() == {1: False}
    assert out < 2 * sa.FIRST_RECHECK + sa.LAST_RECHECK // 8, out
    assert any("drafts: its own time fell to" in change for change in aside.changes), aside.changes


def test_each_batch_size_is_decided_on_its_own_steps():
    aside = StepAside()
    run(aside, 400, SLOW, PLAIN, rows=1)
    # 8 requests: drafting pays 1.5x there; it starts aside as at 1 request and its first recheck finds it pays
    run(aside, aside.groups[1].interval + 100, (0.400, 8 * 1.5, 0.100), (0.400, 8, 0.0), rows=8)
    assert aside.stepped_aside() == {1: True, 8: False}


def test_more_requests_than_where_the_draft_lost_step_aside_from_the_first_step():
    """Measuring a slow draft at each new batch size cost pearl the most (0.77x no speculation at 16 requests):
    above a batch size where it lost it sits out at once and is measured only at that group's first recheck."""
    aside = StepAside()
    run(aside, 400, SLOW, PLAIN, rows=1)
    interval = aside.groups[1].interval
    # 16 requests: a drafting step takes 4 times a plain one
    slow16, plain16 = (1.600, 16 * 1.2, 1.200), (0.400, 16, 0.0)
    assert run(aside, interval - 1, slow16, plain16, rows=16) == interval - 1  # not one drafting step
    assert any("steps aside as at fewer requests" in change for change in aside.changes)
    drafted = 2000 - run(aside, 2000, slow16, plain16, rows=16)
    assert sa.EARLY_STEPS <= drafted <= 3 * (sa.RECHECK_STEPS + sa.SETTLE_STEPS)  # its rechecks only
    assert aside.stepped_aside() == {1: True, rows_group(16): True}


def test_a_first_measurement_under_way_when_drafting_loses_at_fewer_requests_stops():
    """A warm-up of 4 requests began measuring 3 requests drafting before 1 request's comparison ended, and
    drafting lost at 1 request; the measurement at 3 went on in the next level, at 1 to 2 s a step against
    0.24 s plain (pearl 0.89x no speculation at 4 requests, 2026-12-01). It now stops there and steps aside."""
    aside = StepAside()
    slow3, plain3 = (1.500, 3 * 1.2, 1.100), (0.400, 3, 0.0)
    run(aside, sa.PHASE_STEPS, SLOW, PLAIN, rows=1)  # the plugin's share is measured: a costly one
    plain_phase = sa.PHASE_STEPS + sa.SETTLE_STEPS
    assert run(aside, plain_phase, slow3, plain3, rows=3) == plain_phase  # 3 requests: plain decoding measured
    assert run(aside, 2, slow3, plain3, rows=3) == 0  # then its first drafting measurement begins
    assert aside.groups[3].phase is True and aside.groups[3].best is None
    run(aside, 200, SLOW, PLAIN, rows=1)
    assert aside.stepped_aside()[1] is True  # drafting lost at 1 request
    assert run(aside, 50, slow3, plain3, rows=3) == 50  # not one more drafting step at 3
    assert any(c.startswith("3 request(s): steps aside as at fewer requests") for c in aside.changes)


def test_fewer_requests_than_where_the_draft_lost_and_more_than_where_it_won_are_measured():
    aside = StepAside()
    run(aside, 400, (0.300, 2.4, 0.100), PLAIN, rows=1)  # pays at 1 request
    run(aside, 400, (1.600, 16 * 1.2, 1.200), (0.400, 16, 0.0), rows=16)  # loses at 16
    assert aside.stepped_aside() == {1: False, rows_group(16): True}
    assert run(aside, 20, (0.400, 4 * 1.5, 0.100), (0.400, 4, 0.0), rows=4) < 20  # 4: between them, measured


def test_idle_gaps_and_steps_that_produce_nothing_are_not_measured():
    aside = StepAside()
    run(aside, 300, (0.300, 2.4, 0.100), PLAIN)
    before = aside.groups[1].rates[True].seconds
    aside.observe(1, True, 30.0, 3, 0.1)  # the server idle between two requests
    aside.observe(1, True, 0.3, 0, 0.1)
    assert aside.groups[1].rates[True].seconds == before


# --- in the adapter -------------------------------------------------------------------------------------


def slow_adapter(monkeypatch, step_aside=True, plugin_s=0.300):
    spec = {"plugin": "copy", "num_speculative_tokens": 4, "step_aside": step_aside}
    adapter = adapter_for(spec)
    clock = {"t": 0.0}
    monkeypatch.setattr(adapter_module.time, "perf_counter", lambda: clock["t"])

    def slow_draft(rows, step):  # a draft model's chain: slow, and right for its first token only
        clock["t"] += plugin_s
        return [Draft([int(r.tokens[-1]) + 1, 0, 0, 0]) for r in rows]

    monkeypatch.setattr(adapter.proposer, "draft", slow_draft)
    tokens = np.arange(5000, dtype=np.int32).reshape(1, -1) % 997
    length = np.array([100], dtype=np.int32)
    drafts = adapter.propose([[int(tokens[0, 99])]], length, tokens)
    for _ in range(600):
        clock["t"] += 0.200 + 0.010 * len(drafts[0])
        accepted = 1 if drafts[0] else 0
        length[0] += accepted + 1
        drafts = adapter.propose([tokens[0, length[0] - accepted - 1: length[0]].tolist()], length, tokens)
    return adapter


def test_the_adapter_keeps_a_slow_plugin_out_and_counts_the_steps(monkeypatch, caplog):
    with caplog.at_level("INFO", logger="freespec"):
        adapter = slow_adapter(monkeypatch)
    assert adapter.stats.aside_steps > 400
    assert "steps aside" in caplog.text
    assert slow_adapter(monkeypatch, step_aside=False).stats.aside_steps == 0


def test_a_plugin_that_pays_for_its_time_is_not_kept_out(monkeypatch):
    adapter = slow_adapter(monkeypatch, plugin_s=0.020)  # 230 ms for 2 tokens against 200 ms for 1
    assert adapter.stats.aside_steps < 100


def test_step_aside_is_a_boolean_checked_at_start():
    with pytest.raises(ValueError, match="'step_aside' must be true or false"):
        adapter_for({"plugin": "copy", "num_speculative_tokens": 4, "step_aside": "yes"})
