"""What every framework adapter shares: the missing-extra error, the price of a model
turn, and the model turn as a loopwatch :class:`~loopwatch.instrumentation.Decision`.

Nothing here imports a framework.
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from ..errors import RunStateError
from ..outcomes import Decision, DecisionType, Outcome, ToolCall
from ..runs import Run

__all__ = [
    "Invocations",
    "Price",
    "ended_outcome",
    "import_framework",
    "mcp_risk",
    "price_of",
    "turn_decision",
]


def import_framework(module: str, extra: str) -> ModuleType:
    """Import a framework module, or say which extra installs it.

    Raises:
        ImportError: the framework is not installed; the message names
            ``pip install 'loopwatch[<extra>]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"loopwatch's {extra} adapter needs {module.split('.', maxsplit=1)[0]}: "
            f"pip install 'loopwatch[{extra}]'"
        ) from exc


@dataclass(frozen=True, slots=True)
class Price:
    """The cost of one model turn.

    Attributes:
        cost_usd: US dollars (0.0 when the model is not in the table).
        source: where the price came from, for the stop's evidence:
            ``"genai-prices <version>: <provider>/<model>"``, ``"framework"`` when the
            framework reported the cost itself, or None when it is unknown.
    """

    cost_usd: float
    source: str | None


_UNPRICED: set[tuple[str, str | None]] = set()
_MAX_UNPRICED = 256
"""Models genai-prices does not know (a scripted or local model) are looked up once: a
lookup that misses costs about as much as the guard's whole step (0.6-1 ms)."""


def _lookup(model: str, provider: str | None, usage: Any) -> Price | None:
    import genai_prices

    try:
        calc = genai_prices.calc_price(usage, model, provider_id=provider)
    except LookupError:
        return None
    return Price(
        float(calc.total_price),
        f"genai-prices {genai_prices.__version__}: {calc.provider.id}/{calc.model.id}",
    )


def price_of(
    model: str | None,
    input_tokens: int,
    output_tokens: int,
    *,
    provider: str | None = None,
    reported_cost_usd: float | None = None,
) -> Price:
    """Price one model turn.

    A cost the framework reported wins. Otherwise the cost comes from the genai-prices
    table (pydantic/genai-prices, a maintained snapshot of providers' published prices),
    never from a constant of ours. The lookup tries, in order: the model with the given
    provider; a provider written into the name (``openai:gpt-4o``, LiteLLM's
    ``openai/gpt-4o``); the model name alone (a framework's provider name, such as
    LangChain's ``ls_provider``, is not always a genai-prices provider id).

    Args:
        model: the model name the framework used (``gpt-4o``, ``openai:gpt-4o``).
        input_tokens / output_tokens: counts for this turn.
        provider: provider id when the framework knows it (``openai``, ``anthropic``).
        reported_cost_usd: the cost the framework reported, if any.

    Returns:
        The :class:`Price`; ``Price(0.0, None)`` when genai-prices is not installed or
        does not know the model (a scripted test model, a local model).
    """
    if reported_cost_usd is not None:
        return Price(float(reported_cost_usd), "framework")
    if not model or (input_tokens <= 0 and output_tokens <= 0) or (model, provider) in _UNPRICED:
        return Price(0.0, None)
    try:
        import genai_prices
    except ImportError:
        return Price(0.0, None)
    usage = genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens)
    tries: list[tuple[str, str | None]] = [(model, provider)] if provider else []
    for sep in (":", "/"):
        if sep in model:
            named, _, ref = model.partition(sep)
            tries.append((ref, named))
    tries.append((model, None))
    for ref, prov in tries:
        price = _lookup(ref, prov, usage)
        if price is not None:
            return price
    if len(_UNPRICED) < _MAX_UNPRICED:
        _UNPRICED.add((model, provider))
    return Price(0.0, None)


def turn_decision(
    tool_calls: Iterable[tuple[str, Any, str | None]],
    *,
    final: Any = None,
    text: str | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    cost_usd: float = 0.0,
    model: str | None = None,
    price_source: str | None = None,
) -> Decision:
    """The :class:`Decision` of one model turn as a framework reports it.

    Args:
        tool_calls: ``(tool name, arguments, call id)`` per call the model asked for;
            arguments that are not a mapping are recorded as ``{"input": value}``.
        final: the final answer when the turn asked for no tool.
        text: the turn's message text when it is neither a call nor a final answer.
        input_tokens / output_tokens / cost_usd: the turn's usage.
        model / price_source: the model that answered and where the cost came from
            (:attr:`Price.source`).

    Returns:
        A ``tool`` decision when there are calls, else ``final`` when ``final`` is given,
        else ``message``.
    """
    calls = tuple(
        ToolCall(name, dict(args) if isinstance(args, dict) else {"input": args}, call_id)
        for name, args, call_id in tool_calls
    )
    kind = DecisionType.TOOL if calls else DecisionType.MESSAGE
    if not calls and final is not None:
        kind = DecisionType.FINAL
    return Decision(
        kind,
        tool_calls=calls,
        text=text if kind is DecisionType.MESSAGE else None,
        answer=final if kind is DecisionType.FINAL else None,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost_usd,
        model=model,
        price_source=price_source,
    )


class Invocations:
    """The runs of the invocations in progress, shared by every wrapper of one guarded
    agent.

    Each invocation's run is found through a context variable: the framework's step or
    handler tasks are started inside the adapter's ``run``, so they inherit it, and two
    concurrent invocations of the same agent each see their own run (one shared field
    charged one invocation's calls to the other). A call made where the context was not
    carried over (a thread or runtime the framework started by itself) falls back to the
    one invocation in progress, and is passed through unguarded when there are several:
    which one it belongs to is unknown.
    """

    __slots__ = ("_active", "_current")

    def __init__(self, name: str) -> None:
        self._current: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
            name, default=None
        )
        self._active: list[Run] = []

    @property
    def run(self) -> Run | None:
        """The run of the invocation this call belongs to, or None outside one."""
        run = self._current.get()
        if run is not None and run in self._active:
            return run
        return self._active[0] if len(self._active) == 1 else None

    def enter(self, run: Run) -> contextvars.Token[Run | None]:
        """Make ``run`` the current invocation's run (in this context and its tasks)."""
        self._active.append(run)
        return self._current.set(run)

    def leave(self, run: Run, token: contextvars.Token[Run | None]) -> None:
        """The invocation of ``run`` has ended."""
        self._active.remove(run)
        try:
            self._current.reset(token)
        except ValueError:  # reset from another context: nothing of ours is left there
            self._current.set(None)


def ended_outcome(run: Run) -> Outcome | None:
    """The run's outcome once it has ended (the one its stop span carries), else None."""
    try:
        return run.outcome
    except RunStateError:
        return None


def _hint(annotations: Any, camel: str) -> Any:
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    if isinstance(annotations, Mapping):
        return annotations.get(camel, annotations.get(snake))
    value = getattr(annotations, camel, None)
    return value if value is not None else getattr(annotations, snake, None)


def mcp_risk(annotations: Any) -> Literal["read", "write"] | None:
    """The risk an MCP tool's annotations declare.

    MCP specification (2025-06-18, ``ToolAnnotations``): ``readOnlyHint`` true means the
    tool does not modify its environment; ``destructiveHint`` is meaningful only when it
    is not read-only. So ``readOnlyHint: true`` is a read, and an explicit
    ``readOnlyHint: false`` or ``destructiveHint: true`` is a write (an additive write such
    as "create" is still a write: calling it twice makes two). Hints are hints: the policy
    file still wins (:meth:`Policy.with_tool_risks`).

    Args:
        annotations: a mapping or an object (camelCase or snake_case fields), or None.

    Returns:
        ``"read"``, ``"write"``, or None when nothing is declared.
    """
    if annotations is None:
        return None
    read_only = _hint(annotations, "readOnlyHint")
    if read_only is True:
        return "read"
    if read_only is False or _hint(annotations, "destructiveHint") is True:
        return "write"
    return None
