"""The five peer workloads behind ``python -m benches.bench_peers``, in pieces.

:mod:`.harness` holds what every workload stands on (the sizes, the models, a ``mycelia
serve`` process, the clients and their live queries, the warm-up and measured runs); one
module per workload (:mod:`.w1` … :mod:`.w5`, as ``../shared/peers/README.md`` defines
them) returns its figures by run; :mod:`.table` runs the peer and builds the rows that
set both sides together. No module here starts with ``bench_``, so ``python -m benches``
runs them only through ``bench_peers``, never on their own.
"""
