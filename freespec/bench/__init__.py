"""``freespec bench`` as a library: speculative-decoding configs against stock vLLM, one run.

One module per job: ``configs`` (the ``--configs`` entries), ``selection`` (which questions each load
level measures), ``server`` (a vLLM server subprocess, or one already running), ``client`` (streamed chat
requests, their latency figures), ``prometheus`` (vLLM's counters from ``/metrics``), ``memory`` (a
server's resident memory), ``stats`` (rows per config x load x category), ``report`` (results.md),
``plots`` (the charts), ``batch_table`` (vLLM's batch-size table of the ``ngram-table``/``suffix-table``
configs), ``serving`` (a config's server over a run, the run's state and results file, shared by both
runs), ``workloads`` (the multi-turn workload suite of ``--workload`` and its runner) and ``run``
(orchestration: servers one at a time, blocks, results files).
``freespec.cli.bench`` parses the command line and calls ``run.run``.
"""
