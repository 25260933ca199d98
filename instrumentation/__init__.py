"""loopwatch.instrumentation: guard an agent loop and say why it stopped.

The agent side of loopwatch. It depends on ``opentelemetry-api`` only: with no SDK
installed the spans are no-ops and the guard still works. Entry points:

- :func:`agent`, :func:`decision`, :func:`tool`: decorators for the loop, the model call
  and each tool (sync and async).
- :class:`Run`: the same as an explicit context manager.
- :class:`Guard`: the pure stop logic, for custom integrations and offline replay.
- The closed sets, defined once: :class:`StopReason`, :class:`LoopDetector`,
  :class:`ToolOutcome`, :class:`DecisionType` (and :class:`Dimension`).
- :class:`Policy`, :func:`load_policy`, :func:`builtin_profiles`: limits from TOML or code.
- :mod:`loopwatch.instrumentation.testing`: scripted model, fake clock, adversarial tools
  and trace-invariant assertions for your own tests.
- :mod:`loopwatch.instrumentation.otlp`: wires the OpenTelemetry SDK and OTLP/HTTP
  exporter (``pip install 'loopwatch[otlp]'``).
"""

from __future__ import annotations

from .decorators import agent, decision, tool
from .errors import LoopwatchError, PolicyError, PolicyProblem, RunStateError, StopRun
from .failures import FailureClass, ToolFailure, ToolNudged, classify_exception
from .guard import Guard
from .outcomes import (
    Decision,
    DecisionType,
    Dimension,
    Evidence,
    LoopDetector,
    Nudge,
    NudgeText,
    Outcome,
    Stop,
    StopReason,
    ToolCall,
    ToolOutcome,
    ToolRecord,
    ToolTicket,
    Usage,
    Verdict,
)
from .policy import (
    Policy,
    ToolPolicy,
    builtin_profiles,
    check_policy_file,
    load_policies,
    load_policy,
)
from .runs import Run, current_run

__version__ = "0.1.0"

__all__ = [
    "Decision",
    "DecisionType",
    "Dimension",
    "Evidence",
    "FailureClass",
    "Guard",
    "LoopDetector",
    "LoopwatchError",
    "Nudge",
    "NudgeText",
    "Outcome",
    "Policy",
    "PolicyError",
    "PolicyProblem",
    "Run",
    "RunStateError",
    "Stop",
    "StopReason",
    "StopRun",
    "ToolCall",
    "ToolFailure",
    "ToolNudged",
    "ToolOutcome",
    "ToolPolicy",
    "ToolRecord",
    "ToolTicket",
    "Usage",
    "Verdict",
    "__version__",
    "agent",
    "builtin_profiles",
    "check_policy_file",
    "classify_exception",
    "current_run",
    "decision",
    "load_policies",
    "load_policy",
    "tool",
]
