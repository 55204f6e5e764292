"""PostgreSQL target: ``target.PostgresTarget`` implements ``apply/targets/base.Target``.

One module per concern: ``catalog`` (names, describe/create, FKs, the slot lock), ``progress``
(watermark and rejects tables, reset), ``plan`` (the batch transaction's inputs), ``copy``
(unlogged staging tables filled by executor COPY, text from ``copytext``), ``frame`` (the
exactly-once batch transaction), ``setbased`` (the fast path) and ``ordered`` (the replay in
commit order when the fast path cannot match a native subscriber).

Kept free of imports: executors import ``copy`` for their COPY and need nothing else.
"""
