"""The protocol cores: every replication, election and write-concern decision.

Pure code: no Ray, threads, clock, randomness or LMDB (a test walks the
imports). Storage comes in as an ``Engine``, time as ``now_ms`` arguments,
and decisions go out as return values the caller carries out. Two callers run
exactly this code: the Ray shells in ``raymx.actors`` (which own processes,
threads, sockets and timers) and the deterministic simulation in
``tests/sim.py`` (which owns a simulated network, clock and disk).
"""
