"""The shipped example runs: :mod:`loopwatch.instrumentation.examples` recorded as
``loopwatch.trajectory/1`` files (:mod:`loopwatch.replay.importers.native`).

Each run carries the policy it was recorded under (``metadata.replay.policy``) and its
expected stop, so ``loopwatch demo`` replays it to that stop. Rewrite the files with
``python -m loopwatch.replay.shipped_examples record-examples [DIR]``.

Each file is named ``NN-<reason>-<slug>.json`` where ``<reason>`` is what ``loopwatch
replay replay/examples`` says under the default replay policy (the README's command):
the stop reason it stops the run with, or, when it does not stop it, how the recording
ends (``completed``, ``final_unverified``, ``refused``, ``cancelled``, ``error``). Three
examples are recorded a little differently from :mod:`loopwatch.instrumentation.examples`
so that the default policy agrees with their names (:data:`_RECORDING`):

* the poller's job goes ``queued``, ``running``, ``done``: the example's own tool answers
  ``pending`` twice with only a volatile ``checked_at`` changing, which the default policy
  (repeat limit 3, no per-tool limit) rightly calls ``repeated_action`` (the guard is
  right: a changing status is not a repeat, an unchanged one is);
* the wide fan-out calls 64 tools in its one turn, past the default 60 tool attempts;
* the hanging export is recorded hanging 900 s, past the default 600 s deadline.

The observe-mode example ends ``completed`` in its own (observe) mode, but the default
policy enforces, so its name says ``repeated_action``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, cast

from loopwatch.instrumentation import Run, ToolFailure
from loopwatch.instrumentation.testing import FakeClock, ScriptedModel

from .importers.native import write_trajectories
from .policy_choice import policy_table
from .trajectory import (
    AGENT,
    FAILURE,
    SUCCESS,
    UNKNOWN,
    USER,
    DecisionKindName,
    Step,
    ToolCall,
    Trajectory,
)

__all__ = ["EXAMPLES_DIR", "record_examples"]

EXAMPLES_DIR: Final = Path(__file__).resolve().parent / "examples"
"""The shipped example runs (package data)."""

_EPOCH: Final = 1_764_460_800.0  # 2025-11-30T00:00:00Z: recorded times start here
_HANG_SECONDS: Final = 900.0  # a timed-out call's recorded hang: past the default 600 s


class _JobStatusTool:
    """A job that advances: ``queued``, then ``running``, then ``done``."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, **_kwargs: Any) -> Any:
        self.calls += 1
        status = ("queued", "running", "done")[min(self.calls, 3) - 1]
        return {"status": status, **({"result": "ok"} if status == "done" else {})}


def _fan_out() -> list[Any]:
    from loopwatch.instrumentation import Decision
    from loopwatch.instrumentation import ToolCall as GuardCall

    urls = [GuardCall("fetch_page", {"url": f"https://example.org/{i}"}) for i in range(64)]
    return [Decision.tool(*urls, input_tokens=850, output_tokens=40, cost_usd=0.0012)]


# example name -> (file-name reason under the default policy, tools, script) overrides
_RECORDING: Final[dict[str, dict[str, Any]]] = {
    "polls a job until it is done (eventual tool)": {
        "tools": lambda: {"poll_job": _JobStatusTool()}
    },
    "calls many tools in one turn": {"script": _fan_out},
    "loops unnoticed in observe mode, then answers": {"reason": "repeated_action"},
}
_SLUG_CHARS: Final = re.compile(r"[^A-Za-z0-9._=:+-]+")


def record_examples(directory: str | Path = EXAMPLES_DIR) -> list[Path]:
    """Record :mod:`loopwatch.instrumentation.examples` as trajectory files (one per example).

    Each example's scripted model and adversarial tools run unguarded (``observe`` mode,
    fake clock), every decision, observation and error is recorded with its clock time,
    and the run is written with the example's policy and expected stop in
    ``metadata.replay``. A cancelled run and a crashing loop are added by hand. Returns
    the files written.
    """
    from loopwatch.instrumentation.examples import EXAMPLES

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    runs = [
        (
            f"{_RECORDING.get(ex.name, {}).get('reason', ex.expected)}-{_slug(ex.name)}",
            _record(ex, n),
        )
        for n, ex in enumerate(EXAMPLES, start=1)
    ]
    runs.extend(_hand_made(len(EXAMPLES) + 1))
    written = []
    for number, (name, trajectory) in enumerate(runs, start=1):
        path = out / f"{number:02d}-{name}.json"
        write_trajectories(path, [trajectory])
        written.append(path)
    return written


def _slug(name: str) -> str:
    return _SLUG_CHARS.sub("-", name.lower()).strip("-")[:28].rstrip("-")


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _record(example: Any, number: int) -> Trajectory:
    clock = FakeClock(start=0.0)
    override = _RECORDING.get(example.name, {})
    script = override.get("script", example.script)()
    model = ScriptedModel(script, tick=clock, seconds_per_call=example.clock_seconds_per_turn)
    tools = override.get("tools", example.tools)()
    # The task arrives at clock 0: the recorded timeline starts with the run.
    steps: list[Step] = [Step(0, USER, "message", example.name, (), _EPOCH)]
    policy = example.policy.with_env({})  # the example's stop, whatever the shell sets
    run = Run(example.agent, policy, mode="observe", tools=tools or None, clock=clock)
    with run:
        while model.calls < len(script):
            decision = run.decide(model)
            now = _EPOCH + clock()
            calls = []
            for call in decision.tool_calls:
                started = _EPOCH + clock()
                try:
                    result = run.call_tool(call.name, call.arguments, call_id=call.call_id)
                    observation, error = _json_text(result), False
                except (ToolFailure, TimeoutError) as exc:
                    observation, error = f"{type(exc).__name__}: {exc}", True
                    if isinstance(exc, TimeoutError):
                        clock.advance(_HANG_SECONDS)  # the call hung until given up
                calls.append(
                    ToolCall(
                        call.name,
                        dict(call.arguments),
                        observation,
                        error,
                        started_at=started,
                        ended_at=_EPOCH + clock(),
                    )
                )
            kind: DecisionKindName = cast(Any, decision.type.value)  # a DecisionType value
            text = decision.text if kind != "final" else str(decision.answer)
            steps.append(
                Step(
                    len(steps),
                    AGENT,
                    kind,
                    text,
                    tuple(calls),
                    now,
                    decision.input_tokens or None,
                    decision.output_tokens or None,
                    decision.cost_usd or None,
                )
            )
            if kind in ("final", "refusal"):
                break
    for tool in tools.values():
        release = getattr(tool, "release", None)
        if callable(release):
            release()
    ended_by_agent = steps and steps[-1].decision in ("final", "refusal")
    outcome: Literal["success", "failure", "unknown"] = UNKNOWN
    if example.goal is not None and steps and steps[-1].decision == "final":
        outcome = SUCCESS if example.goal(steps[-1].text) else FAILURE
    replay: dict[str, Any] = {
        "policy": policy_table(example.policy),
        "expected_stop": example.expected,
        "example": example.name,
    }
    if example.mode == "observe":
        replay["mode"] = "observe"
    return Trajectory(
        source="",
        run_id=f"example-{number:02d}",
        format="loopwatch",
        steps=tuple(steps),
        recorded_outcome=outcome,
        recorded_stop=None if ended_by_agent else "max_steps",
        recorded_stop_kind="explicit",
        agent=example.agent,
        model="scripted",
        metadata={"replay": replay},
    )


def _hand_made(first: int) -> list[tuple[str, Trajectory]]:
    """The cancelled run and the crashing loop of ``run_examples`` as trajectories."""
    search = ToolCall(
        "search_orders",
        {"query": "x"},
        '{"items":["x-0","x-1","x-2"],"next_cursor":null}',
        started_at=_EPOCH + 1,
        ended_at=_EPOCH + 1.2,
    )
    crash = {"type": "ConnectionResetError", "message": "vector store connection lost"}
    cases: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("cancelled", "cancelled by the caller", {}),
        ("error", "the loop itself crashes", {"crash": crash}),
    )
    out: list[tuple[str, Trajectory]] = []
    for offset, (stop, example, extra) in enumerate(cases):
        replay = {
            "policy": {"name": "default", "version": "builtin"},
            "expected_stop": stop,
            "example": example,
            **extra,
        }
        trajectory = Trajectory(
            source="",
            run_id=f"example-{first + offset:02d}",
            format="loopwatch",
            steps=(Step(0, AGENT, "tool", None, (search,), _EPOCH + 1, 850, 40, 0.0012),),
            recorded_stop=stop,
            recorded_stop_kind="explicit",
            agent="support",
            model="scripted",
            metadata={"replay": replay},
        )
        out.append((stop, trajectory))
    return out


def _examples_main(argv: Sequence[str]) -> int:
    """``python -m loopwatch.replay.shipped_examples record-examples [DIR]``: rewrite them."""
    if not argv or argv[0] != "record-examples":
        usage = "usage: python -m loopwatch.replay.shipped_examples record-examples [DIR]"
        print(usage, file=sys.stderr)
        return 2
    for path in record_examples(argv[1] if len(argv) > 1 else EXAMPLES_DIR):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_examples_main(sys.argv[1:]))
