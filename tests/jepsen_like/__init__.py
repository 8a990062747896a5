"""Fault-injection harness: real FutureQ clusters under a nemesis, checked from a history.

Modules: ``cluster`` (node processes), ``proxy`` (per-link TCP proxies), ``nemesis``
(faults by name), ``workload`` (producers and consumers through ``futureq.client``),
``history`` (JSON-lines event log), ``checker`` (verdicts), ``report`` (table and
timeline). Run it with ``python -m tests.jepsen_like run``; see ``docs/testing.md``.
"""
