"""The target_topk adapter: capturing logits rows and mapping them to the tokens at those positions."""
import numpy as np
import torch

from freespec.vllm_plugins.target_topk import TargetTopK, positions_of_step


def seq(*tokens):
    return np.asarray(tokens, dtype=np.int32)


def test_layout_mixed_prefill_decode_and_rejections():
    views = [
        (seq(1, 2, 3, 4, 5, 6), 3),  # drafted [4, 5, 9]: 4, 5 accepted, 6 is the replacement for 9
        (seq(7, 8, 9, 10), 0),  # partial prefill chunk: one row, position unknown
        (seq(20, 21, 22), 1),  # prefill just finished (no draft last step)
        (seq(30, 31, 32, 33), 1),  # drafted [40, 41], both rejected
    ]
    drafts = [[4, 5, 9], [], [], [40, 41]]
    tokens, rows = positions_of_step(views, drafts)
    # Row 0: scored at its last committed token (3) and at each draft token (4, 5, 9).
    assert rows == 4 + 1 + 1 + 3
    assert tokens.tolist() == [3, 4, 5, 9, -1, 21, 32, 40, 41]


def test_layout_refuses_a_draft_the_scheduler_changed():
    tokens, rows = positions_of_step([(seq(1, 2, 3, 4), 3)], [[2, 7]])
    assert rows == -1  # 2 accepted tokens are (2, 3) but we proposed (2, 7)


class FakeModel(torch.nn.Module):
    def compute_logits(self, hidden):
        return hidden * 2.0


def test_install_keeps_logits_and_scored_maps_rows():
    model = FakeModel()
    topk = TargetTopK(k=2)
    topk.install(model)
    topk.active = True  # as the adapter sets it after its first step
    hidden = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    out = model.compute_logits(hidden)
    assert torch.equal(out, hidden * 2.0)  # what vLLM samples from is untouched
    scored = topk.scored([(seq(5, 6, 1), 2)], [[6]])  # expects 2 rows (tokens 5, 6), 3 were captured
    assert scored is None and topk.mismatched_steps == 1
    model.compute_logits(hidden)
    scored = topk.scored([(seq(5, 6, 1), 2), (seq(9), 0)], [[6], []])
    assert scored.tokens.tolist() == [5, 6]  # the partial-prefill row is dropped
    assert scored.topk_ids.tolist() == [[1, 2], [0, 2]]
    p = torch.softmax(hidden[0] * 2.0, dim=0)
    assert np.allclose(scored.topk_probs[0], [p[1], p[2]], atol=1e-6)


def test_scored_picks_the_capture_that_matches_and_forgets_older_ones():
    model = FakeModel()
    topk = TargetTopK(k=1)
    topk.install(model)
    topk.active = True
    model.compute_logits(torch.zeros(7, 4))  # e.g. a prompt-logprobs call in the same step
    model.compute_logits(torch.eye(4)[:2])
    scored = topk.scored([(seq(3, 0), 1), (seq(4, 1), 1)], [[], []])
    assert scored.tokens.tolist() == [3, 4] and scored.topk_ids[:, 0].tolist() == [0, 1]
    assert topk.scored([(seq(3, 0, 2), 1)], [[]]) is None  # nothing captured since: nothing to map
    assert topk.mismatched_steps == 0


def test_inactive_capture_copies_nothing_and_costs_no_mismatch():
    model = FakeModel()
    topk = TargetTopK(k=1)
    topk.install(model)
    topk.active = False  # the adapter's answer when the proposer will not use the next step's top-k
    out = model.compute_logits(torch.eye(4)[:2])
    assert torch.equal(out, torch.eye(4)[:2] * 2.0)
    assert topk.scored([(seq(3, 0), 1), (seq(4, 1), 1)], [[], []]) is None
    assert topk.mismatched_steps == 0 and topk.topk_seconds == 0.0
    topk.active = True
    model.compute_logits(torch.eye(4)[:2])
    assert topk.scored([(seq(3, 0), 1), (seq(4, 1), 1)], [[], []]).tokens.tolist() == [3, 4]
    spent = topk.take_seconds()
    assert 0.0 < spent == topk.topk_seconds and topk.take_seconds() == 0.0  # each capture charged once


def test_the_engine_warm_up_before_the_first_step_is_neither_copied_nor_charged():
    model = FakeModel()
    topk = TargetTopK(k=1)
    topk.install(model)
    for _ in range(3):  # vLLM's profile and dummy sampler runs: max_num_seqs rows each, before any request
        model.compute_logits(torch.zeros(256, 4))
    assert topk.take_seconds() == 0.0 and topk.topk_seconds == 0.0
    assert topk.scored([(seq(3, 0), 1)], [[]]) is None and topk.mismatched_steps == 0


def test_a_disabled_patch_leaves_the_target_model_as_it_is(monkeypatch):
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "target_topk")
    model = FakeModel()
    own = model.compute_logits
    TargetTopK(k=2).install(model)
    assert "compute_logits" not in vars(model) and model.compute_logits == own
