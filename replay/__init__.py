"""Offline side of loopwatch: read recorded agent runs, replay them through the guard.

* :mod:`loopwatch.replay.trajectory`: the data model every importer yields
  (:class:`Trajectory` of :class:`Step` with :class:`ToolCall`).
* :mod:`loopwatch.replay.importers`: one reader per recorded format, detected per file.
* :mod:`loopwatch.replay.engine`: recorded steps through one or more policies with the
  real guard, no model calls (``loopwatch replay``).
* :mod:`loopwatch.replay.demo`: recorded steps through the real instrumentation into a
  running collector (``loopwatch demo``).

Depends on :mod:`loopwatch.instrumentation` only (stdlib otherwise), so the offline
tools run wherever the guard runs.
"""
