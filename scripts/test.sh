#!/usr/bin/env bash
# Run freespec's tests: unit tests, then integration tests on the real vLLM CPU engine and
# SmolLM2-135M-Instruct, then the example plugin package's own tests (pytest 40 min 18 s on 2 Zen 3 cores,
# 2026-12-07, before 75 s more moved to `long`; CI's last run took 2,979 s in all). Sets the machine up first if
# needed.
# The `cluster` tests (tensor parallelism over two worker processes, vLLM replicas as Ray actors) run in
# CI's matrix job, once per vLLM release (.ci/matrix), and so do the `release` test (the wheel installed
# into a fresh venv) and the `long` ones (the t=0.8 distribution runs of retrieval, hybrid with every
# source and pearl, the engine-start refusals, two servers sharing a datastore, vLLM's own ngram under the
# greedy check, recycle's warm start from its saved matrix, the last-step cache patch's two engines and a
# server started warm from `freespec responses build` and recycle's logits rows in mixed batches, which took
# about 6 minutes in the main run); run them
# here with: bash scripts/test.sh -m cluster (or -m release, -m long)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -m "not cluster and not release and not long" tests integration_tests "$@"
# The example plugin package (examples/phrase-proposer), installed as its users install it (a wheel, not
# editable; its one dependency is the freespec installed above), and its own tests, written only with
# freespec.testing: options, the circuit breaker, an offline replay, and one greedy-identity run on
# SmolLM2 (about 80 s on 2 cores); its sampling-distribution test (marked slow) is left out.
rm -rf examples/phrase-proposer/build
.venv/bin/pip install -q --no-build-isolation --no-deps --force-reinstall ./examples/phrase-proposer
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow" examples/phrase-proposer/tests
