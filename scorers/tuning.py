"""Every tuning constant of the scorers and of the proposers' learned estimates, with its meaning.

The controller that decides whether drafting pays (``controller``) has three measures: the goodput policy
(``policy``: step-time fit, price of a draft token, step size and padding), step-aside (``step_aside``: plain
decoding against drafting, per batch size) and source pricing (``controller.SourcePricing``: which of hybrid's
sources pay for their time). The acceptance estimates (``chain``, ``calibration``, copy's, ``fusion``) and
the proposers' own knobs (recycle's probe, pearl's chain budget) are here too. Their modules import these
names and define none of their own (a test holds them to it). Why each value is what it is: docs/policy.md
and the docstrings of the class that reads it.
"""
from __future__ import annotations

# -- The goodput policy's step-time fit (policy.StepTimeModel) -----------------------------------------------------
HALFLIFE_STEPS = 256.0  # steps over which an observation of step time loses half its weight
MIN_STEPS = 16  # steps observed before the fit is trusted at all
MIN_SPREAD = 0.5  # tokens: the least standard deviation of step sizes at which the per-token slope is identified
EXPLORE_EVERY = 8  # while the slope is not identified, every 8th step drafts as deep as it can, to vary the size
BANDWIDTH_OCTAVES = 1.0  # the local fit's kernel width in octaves of step size (one octave away counts exp(-1/2))
MIN_LOCAL_WEIGHT = 8.0  # step-equivalents near the load asked about before the local fit is trusted
SLOPE_ERRORS = 1.0  # the price of a token is the fitted slope less this many standard errors: a slope fitted
# to steps of nearly one size (a repeated pass drafting its whole K every step) read 28% steep and priced every token
# out (results/state-dir-qwen-k24-zen3); erring low drafts a token the next steps show is too dear, erring high
# drafts nothing and never learns otherwise
EXACT_SIZES = 32  # step sizes up to this each have a bucket (and can be padded to); above, buckets per octave
SIZE_BUCKETS_PER_OCTAVE = 8  # step-size buckets per octave above EXACT_SIZES
EXACT_ROWS = 8  # request counts up to this each have a group; above, groups per octave
ROWS_GROUPS_PER_OCTAVE = 4  # request-count groups per octave above EXACT_ROWS
ROWS_BANDWIDTH_OCTAVES = 0.5  # the local fit's kernel width in octaves of requests (one octave away counts exp(-2))
ROWS_REACH_OCTAVES = 1.5  # groups further than this many octaves of requests away are left out of a local fit
GOODPUT_HALFLIFE_STEPS = 32  # steps over which the averages of output, scored tokens and requests halve in weight

# -- The goodput policy's step size: padding and trimming (policy.GoodputPolicy.step_size, padding) -----------------
PAD_MIN_STEPS = 8  # steps of a size observed before its mean time is trusted
PAD_MARGIN = 0.03  # another size is taken only when its expected output per second is this much higher
PAD_EXPLORE_EVERY = 16  # one call in this many pads to a size observed fewer times, to measure it
PAD_REFRESH_EVERY = 64  # one call in this many is left unpadded, so the unpadded size's time stays current
SEARCH_TOKENS = 1024  # padding copies what followed the draft's last token within this many recent tokens

# -- Step-aside (step_aside.StepAside) -------------------------------------------------------------------------------
COSTLY_SHARE = 0.05  # a plugin whose own time stays under this share of a step always drafts
PHASE_STEPS = 16  # steps each mode (drafting, plain) is measured at a batch size first
RECHECK_STEPS = 8  # steps the mode that lost is measured again at a recheck
RECHECK_SHARE = 0.01  # a recheck of a mode that lost widely waits until it costs at most this share of the steps
EARLY_STEPS = 4  # measured steps after which a drafting measurement that loses widely ends early
WIDE_LOSS = 0.25  # drafting this much slower a token than plain decoding is a wide loss
SETTLE_STEPS = 2  # steps after a switch of mode left out of its measure
FIRST_RECHECK = 128  # steps from a decision to its first recheck
LAST_RECHECK = 2048  # the most steps between rechecks (the interval doubles while the decision stands)
MARGIN = 0.02  # drafting is kept on a tie within this share of plain decoding's time a token
GAP_FACTOR = 4.0  # a step longer than this many times its mode's average is a gap, not a step
KEEP = 1.0 - 1.0 / PHASE_STEPS  # exponential weighting of a mode's seconds and tokens per step

# -- Source pricing (controller.SourcePricing, fusion.SourceWeights) --------------------------------------------------
PROBE_EVERY = 32  # a source that does not pay still runs one step in this many, to notice when it would
MIN_EVIDENCE = 64  # steps a source runs before it can be judged
# A source slow next to the engine's step (a draft model's chain on a CPU) would spend a large share of the wall
# time proving it does not pay with MIN_EVIDENCE steps and a probe every PROBE_EVERY: hence the next three.
EVIDENCE_STEPS = 8.0  # a slow source is judged once its evidence has cost this many engine steps of time ...
FEW_EVIDENCE = 16  # ... but after no fewer steps than this
PROBE_SHARE = 0.02  # a paused slow source's probes cost at most this share of the time
RESUME_MARGIN = 1.25  # a paused source resumes only when its value is this many times its cost (no flapping)
# Pausing a source loses every token only it knows until its next probe; one this cheap costs at most 1%.
CHEAP_SHARE = 0.01  # a source whose own time is below this share of an engine step is never paused
PRICE_KEEP = 1.0 - 1.0 / 64  # exponential weighting of the per-step averages (half-life about 44 steps)
PRICE_GAP_FACTOR = 4.0  # a time between steps longer than this many times the average is a gap, not a step
WEIGHT_WINDOW = 4000  # tokens a source's acceptance estimate holds before its evidence is halved

# -- Sizing a source's chain by the price (proposers/suffix_tree.SuffixTreeProposer.chain) ----------------------------
# A suffix-tree token past the end of its match was accepted 0.21-0.25 of the time on agent turns, where its learned
# chance claimed about 0.33 (results/hybrid-vs-suffix-costly-tokens): a chain runs past its match only by as many
# tokens per matched token as this share over the bar allows (between 1, vLLM's, and the option's max_spec_factor).
PAST_MATCH_ACCEPTANCE = 0.2  # how often a token past its match is accepted

# -- Acceptance of recycled candidates (chain.EdgeAcceptance, proposers/recycle) --------------------------------------
CHAIN_PROB_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95)  # recorded-probability buckets (upper edges)
CHAIN_PRIOR_STRENGTH = 4.0  # pseudo-observations behind each cell's prior mean (its bucket's recorded probability)
CHAIN_WINDOW = 4000.0  # observations kept per cell before its evidence is halved
RECYCLE_PROBE_EVERY = 16  # a request whose best chain is empty still drafts its top-1 token this often, to keep learning

# -- Calibrated token chances of the suffix and retrieval sources (calibration.TokenCalibration) ---------------------
CALIBRATION_PROB_EDGES = (0.2, 0.35, 0.5, 0.7, 0.9, 0.999)  # tree-probability buckets (conditional, per token)
CALIBRATION_MATCH_EDGES = (2, 3, 4, 6, 9, 13, 19)  # match-length buckets
CALIBRATION_DEPTH_EDGES = (1, 2, 4)  # position in the draft: 0, 1, 2-3, 4+
CALIBRATION_PRIOR_STRENGTH = 2.0  # pseudo-observations behind each cell's starting guess
CALIBRATION_WINDOW = 2000.0  # evidence kept per cell before it is halved

# -- copy (proposers/copy.CopyProposer) -------------------------------------------------------------------------------
COPY_MATCH_BUCKETS = 8  # acceptance is estimated per source and per match length (capped at this many buckets)
COPY_WINDOW = 2000.0  # evidence kept per estimate before it is halved

# -- pearl's chain budget (proposers/pearl/state.py) ------------------------------------------------------------------
PEARL_BUDGET_GROW = 2  # chain budget after a fully accepted chain: +2 ...
PEARL_BUDGET_SHRINK = 1  # ... and -1 after a rejection (as transformers' assisted generation)
