"""The collector's pipeline: the one place that states the order of its stages.

::

    receive ─> decode ─> redact ─> map ─> detect ─> runs ─> sample ─> store ─> metrics
    receive_http    decode    redact    map    detect    runs    sample    store/    metrics
    receive_grpc   (workers)

Each stage is a module of its name (:data:`STAGES`). A request moves through them in
that order:

- ``receive`` (:mod:`.receive_http`, :mod:`.receive_grpc`, shared parts in
  :mod:`.receive`) reads and bounds the request on the event loop and answers only after
  the store resolved the batch's future (ack after commit);
- ``decode`` (:mod:`.decode`, optionally in worker processes, :mod:`.workers`) turns
  OTLP into typed :class:`~loopwatch.collector.records.SpanBatch` records, once;
- ``redact``, ``map`` and ``detect`` are transformers, ``process(batch) -> batch``, held
  in order by :class:`Pipeline` and run on one pipeline thread in arrival order;
- ``runs`` (:mod:`.runs`) and ``sample`` (:mod:`.sample`) are applied by the store's
  writer to each group commit, in request order, with the run rows already stored: the
  merge rules need the rows earlier requests committed, so they run where those rows are
  (DESIGN section 5 draws ``runs`` before ``detect``; detection works on the steps of
  one run as ``map`` assigns them, and needs nothing ``runs`` decides);
- ``store`` (:mod:`.store`) commits in groups and resolves each batch's future;
- ``metrics`` (:mod:`.metrics`) counts what the commit stored for the first time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = ["STAGES", "Pipeline", "Stage"]

STAGES: Final = (
    "receive",
    "decode",
    "redact",
    "map",
    "detect",
    "runs",
    "sample",
    "store",
    "metrics",
)
"""Every stage, in the order a request goes through them."""


class Stage(Protocol):
    """A transformer stage: one batch in, one batch out (STYLE rule 6)."""

    name: str
    """The stage's name in :data:`STAGES`."""

    def process(self, batch: Any) -> Any:
        """Transform ``batch`` and return it (or the next stage's input)."""
        ...


@dataclass(frozen=True)
class Pipeline:
    """The in-process transformer stages, held in :data:`STAGES` order.

    Args:
        stages: the stages, each with a ``name`` from :data:`STAGES`.

    Raises:
        ValueError: a stage's name is not in :data:`STAGES`, or the stages are out of
            order.

    Example:
        >>> pipeline = Pipeline((RedactStage(), MapStage(), DetectStage()))  # doctest: +SKIP
        >>> mapped = pipeline.process(span_batch)  # doctest: +SKIP
    """

    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        positions = []
        for stage in self.stages:
            if stage.name not in STAGES:
                raise ValueError(f"unknown stage {stage.name!r}; stages are {STAGES}")
            positions.append(STAGES.index(stage.name))
        if positions != sorted(set(positions)):
            raise ValueError(f"stages out of order: {[s.name for s in self.stages]}")

    @property
    def names(self) -> Sequence[str]:
        """The stages' names, in order."""
        return [stage.name for stage in self.stages]

    def process(self, batch: Any, *, after: str | None = None) -> Any:
        """Run ``batch`` through every stage, or through those after the stage ``after``
        (a batch a decode worker already redacted and mapped goes on from ``map``).

        Raises:
            ValueError: ``after`` names no stage of this pipeline.
        """
        stages = self.stages
        if after is not None:
            if after not in self.names:
                raise ValueError(f"no stage {after!r} in {self.names}")
            stages = stages[self.names.index(after) + 1 :]
        for stage in stages:
            batch = stage.process(batch)
        return batch
