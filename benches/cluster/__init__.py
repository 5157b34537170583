"""The three cases behind ``python -m benches.bench_cluster``, in pieces.

:mod:`.harness` holds what they share (the models, the CPU and memory meters read from
/proc, the client worker processes and their line protocol); :mod:`.latency`,
:mod:`.w3` and :mod:`.scaling` each run one case on real ``mycelia serve --postgres``
processes and build its table. No module here starts with ``bench_``, so ``python -m
benches`` runs them only through ``bench_cluster``, never on their own.
"""
