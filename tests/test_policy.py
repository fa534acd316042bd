"""The goodput policy: step-time fit and the per-token threshold it implies."""
import numpy as np

import freespec.scorers.policy as policy_module
from freespec.scorers.policy import GoodputPolicy, StepTimeModel


def test_step_time_fit_recovers_base_and_slope_from_noisy_steps():
    rng = np.random.default_rng(0)
    model = StepTimeModel()
    for _ in range(500):
        tokens = int(rng.integers(1, 60))
        model.observe(tokens, 0.020 + 0.0015 * tokens + rng.normal(0, 0.0005))
    base, per_token = model.fit()
    assert abs(base - 0.020) < 0.001 and abs(per_token - 0.0015) < 0.0001
    # where steps vary in size, the price's slope (less one standard error) is below the point slope by under 1%
    _, cautious = model.fit(errors=1.0)
    assert 0.0 < per_token - cautious < 0.01 * per_token


def test_slope_is_not_identified_without_spread_in_tokens():
    model = StepTimeModel()
    for _ in range(100):
        model.observe(8, 0.03)
    assert model.fit() is None
    assert GoodputPolicy().token_cost() is None


def repeated_pass_bars(seed):
    """The bar through steps like a repeated pass at K 24 on a 2-core CPU (results/state-dir-qwen-k24-zen3):
    every draft token accepted, each turn three steps of 25 tokens and one of 10 to 24, 0.32 s + 0.045 s a token
    with 0.07 s of noise; the right bar at full acceptance is 0.045 * 25 / (0.32 + 0.045 * 25) = 0.78."""
    rng, policy, bars = np.random.default_rng(seed), GoodputPolicy(), []
    for _ in range(8):
        for tokens in [25, 25, 25, int(rng.integers(10, 25))]:
            policy.observe_step(tokens, tokens, 0.32 + 0.045 * tokens + rng.normal(0, 0.07))
            bars.append(policy.token_cost(rows=1))
    return [b for b in bars if b is not None]


def test_a_slope_fitted_to_steps_of_nearly_one_size_does_not_price_every_token_out(monkeypatch):
    # The point slope of such steps reads steep often enough to give a bar of 1.0 (nothing drafted) in some seeds;
    # the slope less its standard error never does, and stays near the right bar where the steps are this few.
    cautious = [repeated_pass_bars(seed) for seed in range(200)]
    monkeypatch.setattr(policy_module, "SLOPE_ERRORS", 0.0)
    point = [repeated_pass_bars(seed) for seed in range(200)]
    assert sum(max(bars) >= 0.999 for bars in point) >= 3
    assert not any(max(bars) >= 0.999 for bars in cautious)
    assert 0.6 < float(np.median([bars[-1] for bars in cautious])) < 0.78


def run(policy, base, per_token, batch, draft, accepted_per_step, steps=300, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        d = int(rng.integers(0, draft + 1))
        tokens = batch * (1 + d)
        output = batch + int(accepted_per_step * d / max(draft, 1))
        policy.observe_step(tokens, output, base + per_token * tokens, rows=batch)
    return policy.token_cost()


def test_cheap_verification_means_a_low_bar_and_a_full_machine_a_high_one():
    # Memory-bound accelerator at batch 1: a step costs the same whatever its size.
    assert run(GoodputPolicy(), base=0.010, per_token=0.00001, batch=1, draft=8, accepted_per_step=2) < 0.01
    # Compute-bound, 39 requests, drafts mostly rejected: a draft token must beat plain decoding,
    # whose goodput is 39 / (base + 39 * per_token): it must be nearly certain.
    cost = run(GoodputPolicy(), base=0.0005, per_token=0.002, batch=39, draft=4, accepted_per_step=4)
    assert abs(cost - 0.002 * 39 / (0.0005 + 0.002 * 39)) < 0.02
    # Batch 1 with a real per-token cost (a CPU): the bar sits at per_token / step time.
    cost = run(GoodputPolicy(), base=0.030, per_token=0.002, batch=1, draft=8, accepted_per_step=3)
    assert 0.05 < cost < 0.2


def test_speculation_turns_off_under_saturation_and_back_on_when_load_drops():
    # A 2-core CPU: a step costs 30 ms plus 2 ms per scored token. Drafts of 4 tokens, half accepted.
    policy = GoodputPolicy()
    calm = run(policy, base=0.030, per_token=0.002, batch=1, draft=4, accepted_per_step=2, steps=300)
    assert calm < 0.15  # alone: a token with a 15% chance of acceptance is worth verifying
    busy = run(policy, base=0.030, per_token=0.002, batch=39, draft=4, accepted_per_step=2 * 39, steps=300, seed=1)
    # 39 requests fill the machine: plain decoding's goodput sets the bar near 0.7 (39 * 2 ms / 108 ms).
    # A proposer with a 50% per-token acceptance drafts nothing at that bar.
    assert busy > 0.65
    # The load drops: within 200 steps (7 s of 35 ms steps) the bar is back low enough for such drafts.
    again = run(policy, base=0.030, per_token=0.002, batch=1, draft=4, accepted_per_step=2, steps=200, seed=2)
    assert again < 0.2


def convex_step(tokens):
    """A CPU's step time: ~5 ms per token at a few tokens a step, ~11 ms per token on average up to 39
    (the shape measured on the 2-core machine: 45 ms at 1 token, 460 ms at 39)."""
    return 0.040 + 0.005 * tokens + 0.00015 * tokens * tokens


def drive(policy, batch, steps, rng, max_draft):
    for _ in range(steps):
        d = int(rng.integers(0, max_draft + 1))
        tokens = batch + d
        policy.observe_step(tokens, batch + d // 3, convex_step(tokens) * (1 + rng.normal(0, 0.05)), rows=batch)


def test_the_fit_at_a_load_follows_steps_of_that_size_not_one_line_through_all():
    rng = np.random.default_rng(3)
    policy = GoodputPolicy()
    drive(policy, batch=1, steps=800, rng=rng, max_draft=8)
    drive(policy, batch=39, steps=40, rng=rng, max_draft=3)
    _, slope_small = policy.model.fit(at=2)
    _, slope_full = policy.model.fit(at=39)
    assert 0.004 < slope_small < 0.008  # the curve's slope at 1-9 tokens is 5.2-7.7 ms
    assert slope_full > 0.011  # the curve's slope at 39 is 16.7 ms; the secant from 1 is 11 ms
    # One line through both regimes prices the small steps too high: here the local fit is what keeps
    # speculation on when the burst is over.
    _, slope_global = policy.model.fit()
    assert slope_global > 1.3 * slope_small


def test_the_bar_moves_in_the_step_the_load_does():
    rng = np.random.default_rng(4)
    policy = GoodputPolicy()
    drive(policy, batch=1, steps=800, rng=rng, max_draft=8)
    assert policy.token_cost(rows=1) < 0.25
    # A burst of 39 requests: the first decode step is already priced as a full machine (drafts
    # here are accepted a third of the time, which a full CPU cannot afford), not 32 steps later.
    drive(policy, batch=39, steps=1, rng=rng, max_draft=3)
    assert policy.token_cost(rows=39) > 0.9
    drive(policy, batch=39, steps=120, rng=rng, max_draft=3)
    assert policy.token_cost(rows=39) > 0.95
    # The burst is over: the next step alone is priced as it was before.
    drive(policy, batch=1, steps=1, rng=rng, max_draft=8)
    assert policy.token_cost(rows=1) < 0.25


def shaped_steps(policy, seconds_of, sizes, rounds=20):
    """Observe ``rounds`` steps of every size in ``sizes``, each taking ``seconds_of(size)``."""
    for _ in range(rounds):
        for t in sizes:
            policy.observe_step(t, 1, seconds_of(t))


def cpu_shape(t):
    """A step-time shape like the one measured on the CPU here (results/step-shape): 2 scored tokens slower
    than 1, 3 to 5 faster, 9 slower again."""
    return {1: 0.051, 2: 0.055, 3: 0.047, 4: 0.046, 5: 0.044}.get(t, 0.044 + 0.003 * (t - 5))


def test_padding_goes_to_the_fastest_measured_step_size():
    policy = GoodputPolicy()
    shaped_steps(policy, cpu_shape, range(1, 10))
    assert policy.step_size(1, 9) == 5 and policy.step_size(2, 9) == 5 and policy.step_size(3, 9) == 5
    assert policy.step_size(5, 9) == 5 and policy.step_size(6, 9) == 6  # never fewer tokens than drafted
    assert policy.step_size(1, 3) == 3  # within the room given (K, the model length)
    assert policy.step_size(1, 1) == 1


def test_no_padding_where_step_time_grows_with_tokens_or_the_gain_is_within_the_margin():
    policy = GoodputPolicy()
    shaped_steps(policy, lambda t: 0.020 + 0.002 * t, range(1, 10))
    assert [policy.step_size(t, 9) for t in range(1, 10)] == list(range(1, 10))
    flat = GoodputPolicy()
    shaped_steps(flat, lambda t: 0.050 - 0.0002 * t, range(1, 10))  # 9 tokens 3.2% faster than 1: padded
    assert flat.step_size(1, 9) == 9
    close = GoodputPolicy()
    shaped_steps(close, lambda t: 0.050 - 0.0001 * t, range(1, 10))  # 1.6% faster: within the margin
    assert close.step_size(1, 9) == 1


def test_padding_explores_sizes_not_measured_enough_and_only_those():
    policy = GoodputPolicy()
    shaped_steps(policy, cpu_shape, [1, 2])  # sizes 3 to 9 never seen
    answers = [policy.step_size(1, 9) for _ in range(32)]
    assert answers.count(1) == 30 and answers[15] == 3 and answers[31] == 3  # one call in 16, the least measured
    shaped_steps(policy, cpu_shape, range(1, 10))
    assert [policy.step_size(1, 9) for _ in range(32)] == [5] * 31 + [1]  # all measured: no more exploring;
    # the 64th call is left unpadded, to keep the unpadded size measured
    assert policy.step_size(40, 60) == 40  # sizes above 32 share buckets: never padded
    many = GoodputPolicy()
    shaped_steps(many, cpu_shape, range(1, 10))
    for _ in range(5000):  # thousands of steps of one size later, the others are not measured again
        many.observe_step(5, 1, 0.044)
    answers = [many.step_size(1, 9) for _ in range(64)]
    assert answers.count(5) == 63 and answers.count(1) == 1


def cpu_shape_nine(t):
    """The shape of the float32 steps measured here (results/step-shape): 2 scored tokens slower than 1,
    3 to 6 fastest, 7 to 9 slower than 3 to 6 again."""
    return {1: 0.0477, 2: 0.0534, 3: 0.0410, 4: 0.0405, 5: 0.0415, 6: 0.0427, 7: 0.0493, 8: 0.0510,
            9: 0.0525}[t]


def test_a_draft_s_unlikely_last_tokens_are_dropped_where_a_smaller_step_pays_better():
    policy = GoodputPolicy()
    shaped_steps(policy, cpu_shape_nine, range(1, 10))
    halving = [0.5 ** (i + 1) for i in range(8)]  # 0.5, 0.25, ...: about 1 token expected in all
    assert policy.step_size(9, 9, halving) == 5  # (1 + 0.94) / 41.5 ms beats (1 + 1.0) / 52.5 ms
    sure = [0.98 ** (i + 1) for i in range(8)]
    assert policy.step_size(9, 9, sure) == 9  # 8.2 expected tokens are worth the slower step
    assert policy.step_size(9, 9) == 9  # without chances: never cut
    assert policy.step_size(2, 9, [0.3]) == 4  # a short draft is still padded to a faster size
    expected_with = [1.0 + sum(halving[:n]) for n in range(9)]
    rates = [expected_with[t - 1] / cpu_shape_nine(t) for t in range(1, 10)]
    assert max(range(1, 10), key=lambda t: rates[t - 1]) == 5  # the choice is the best rate, computed apart


def test_a_cut_needs_the_margin_and_measured_sizes():
    policy = GoodputPolicy()
    shaped_steps(policy, lambda t: 0.020 + 0.002 * t, range(1, 10))
    # linear: dropping the 8th token (0.3 of the 7.95 expected tokens, for 5.3% of the step) would pay 1.6%,
    # within the 3% margin; with a last chance of 0.05 it pays 4.9%
    assert policy.step_size(9, 9, [0.95] * 7 + [0.3]) == 9
    assert policy.step_size(9, 9, [0.95] * 7 + [0.05]) == 8
    young = GoodputPolicy()
    shaped_steps(young, cpu_shape_nine, range(9, 10))  # only the draft's own size measured
    assert young.step_size(9, 9, [0.5 ** (i + 1) for i in range(8)]) == 9


def test_the_price_of_a_token_at_a_load_is_not_confused_with_the_cost_of_its_requests():
    # A CPU where each request in a step costs 4 ms of its own and each scored token 1.5 ms: four requests
    # scoring 8 tokens take 48 ms, one request scoring 8 tokens 36 ms. After a stretch of one request, a load of
    # four: a line through steps of both (of about the same size) reads the requests' cost as a steep slope.
    rng = np.random.default_rng(5)
    policy = GoodputPolicy()

    def steps(rows, n):
        for _ in range(n):
            tokens = rows * (1 + int(rng.integers(0, 5)))
            seconds = 0.020 + 0.004 * rows + 0.0015 * tokens
            policy.observe_step(tokens, rows + (tokens - rows) // 3, seconds * (1 + rng.normal(0, 0.02)), rows=rows)

    steps(1, 400)
    steps(4, 100)
    _, per_token = policy.model.fit(at=10, rows=4)
    assert abs(per_token - 0.0015) < 0.0003
    _, mixed = policy.model.fit(at=10)  # the steps of that size, whatever their requests
    assert mixed > 1.4 * 0.0015
    # The bar at four requests is the true price of a token times their goodput.
    goodput = 4 * (1 + 2 / 3 * 0.5) / (0.036 + 0.0015 * 4 * 3)  # about what these steps gain per second
    assert abs(policy.token_cost(rows=4) - 0.0015 * goodput) < 0.05
    # One request's step times (what padding chooses from) hold only one-request steps.
    assert all(abs(seconds - (0.024 + 0.0015 * size)) < 0.002 for size, (seconds, _) in policy.model.means.items())
