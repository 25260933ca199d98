"""Offline side of loopwatch: read recorded agent runs, replay them through the guard.

* :mod:`~loopwatch.replay.trajectory`: the data model every importer yields
  (:class:`Trajectory` of :class:`Step` with :class:`ToolCall`).
* :mod:`~loopwatch.replay.importers`: one reader per recorded format, detected per file
  (and :mod:`~loopwatch.replay.importers.stored` for runs the collector stored).
* :mod:`~loopwatch.replay.engine`: recorded steps through policies with the real guard,
  no model calls (``loopwatch replay``); it labels loops with
  :mod:`~loopwatch.replay.loops`, chooses policies with
  :mod:`~loopwatch.replay.policy_choice` and reports :mod:`~loopwatch.replay.results`.
* :mod:`~loopwatch.replay.demo`: recorded steps through the real instrumentation into a
  running collector (``loopwatch demo``), sent by :mod:`~loopwatch.replay.export`.
* :mod:`~loopwatch.replay.recorded`: recorded values read as guard input, for both.

Depends on :mod:`loopwatch.instrumentation` only (stdlib otherwise), so the offline
tools run wherever the guard runs.
"""
