"""Infer a tool's risk from its name, for tools nothing else declares.

A policy file, code (:class:`~.policy.ToolPolicy`) or the framework
(:meth:`~.policy.Policy.with_tool_risks`: MCP ``destructiveHint``, framework flags) always
wins; this module only answers for a tool none of them names, and only ever says
``"write"`` or nothing. A wrong ``"write"`` is the costly error (the second identical
call is refused: a false stop), a missed one costs nothing new (the tool is judged as a
read, as before inference existed), so the rule is deliberately narrow.

The rule (:func:`infer_write_risk`), on the tool's *action segment*:

1. The action segment is the part after the last namespace separator (``.``, ``/``,
   ``:`` or ``__``): ``tickets.delete`` -> ``delete``, ``mcp__github__create_issue`` ->
   ``create_issue``. It is split into lower-case words at ``_``, ``-``, spaces, digits and
   camelCase boundaries (``sendEmail`` -> ``send email``, ``HTTPPost`` -> ``http post``).
2. The FIRST word must be a write verb (:data:`WRITE_VERBS`). Tool names are imperative
   (``verb_object``): a verb later in the name is almost always part of a noun phrase or
   a question (``get_created_at``, ``list_posts``, ``can_send_mms``, ``api_tracking_for_
   pack_send``), so it is never taken. ``ticket_delete`` (object first) is therefore not
   inferred: declare it.
3. No later word may be a read verb (:data:`READ_VERBS`): ``order_lookup``,
   ``book_search``, ``update_check`` read.
4. The word right after the verb must not mark the verb as a noun
   (:data:`NOUN_MARKERS`: ``post_id``, ``charge_at``, ``update_time``).
5. Words that are nouns as often as verbs (:data:`AMBIGUOUS_VERBS`: ``post``, ``order``,
   ``book``, ``charge``, ``pay``, ``return``, ``exchange`` ...) count only when an object
   follows that is not a field of that noun (:data:`NOUN_FIELDS`: ``order_status``,
   ``post_details``, ``exchange_rate``, ``book_info``, ``pay_period``); alone (``post``,
   ``orders.order``) they are not inferred.
6. A light verb (:data:`LIGHT_VERBS`: ``make``, ``place``, ``issue`` ...) counts when a
   transaction noun follows (:data:`TRANSACTION_NOUNS`): ``make_payment``,
   ``place_order``, ``issue_refund``; ``make_chart`` does not.

Source of the lists: the project's own judgment (no standard lists write verbs), made
from the issue's examples (create, send, book, delete, pay ...), the HTTP method names
that are not safe (POST, DELETE; RFC 9110 section 9.2.1) in their verb form, the tool names
of the recorded corpus (tau-bench, tau2-bench, ToolBench, ReAct, OpenHands: 107 names) and
common MCP servers. Left out on purpose: verbs whose repetition is harmless or expected,
so that a second identical call is no duplicate side effect: idempotent setters (``set``,
``put``, ``enable``, ``disable``, ``save``, ``mark``), toggles (``toggle_wifi`` twice is
on, then off), process verbs (``run``, ``execute``, ``reboot``, ``reset``, ``login``)
and ``add`` followed by numbers (arithmetic).
"""

from __future__ import annotations

import functools
import re
from typing import Final

__all__ = [
    "AMBIGUOUS_VERBS",
    "LIGHT_VERBS",
    "NOUN_FIELDS",
    "NOUN_MARKERS",
    "READ_VERBS",
    "TRANSACTION_NOUNS",
    "WRITE_VERBS",
    "infer_write_risk",
    "name_words",
]

WRITE_VERBS: Final[frozenset[str]] = frozenset(
    {
        # create
        "create",
        "add",
        "insert",
        "append",
        "register",
        "subscribe",
        "invite",
        # send and publish
        "send",
        "post",
        "publish",
        "notify",
        "tweet",
        "upload",
        "submit",
        "write",
        # commerce and money
        "book",
        "reserve",
        "order",
        "purchase",
        "buy",
        "pay",
        "charge",
        "refund",
        "transfer",
        "exchange",
        "return",
        "checkout",
        # change and delete
        "update",
        "modify",
        "edit",
        "delete",
        "remove",
        "cancel",
        "revoke",
        "unsubscribe",
        "destroy",
        "terminate",
        "archive",
        "deploy",
        "merge",
    }
)
"""Words that make a tool a likely write when its name starts with them (module docstring)."""

AMBIGUOUS_VERBS: Final[frozenset[str]] = frozenset(
    {
        "add",
        "post",
        "book",
        "order",
        "purchase",
        "buy",
        "pay",
        "charge",
        "refund",
        "transfer",
        "exchange",
        "return",
        "reserve",
        "archive",
        "checkout",
        "tweet",
        "merge",
        "write",
    }
)
"""Write verbs that are nouns as often (``post_id``, ``order_status``, ``archive_list``):
they need an object that is not one of :data:`NOUN_FIELDS`."""

LIGHT_VERBS: Final[frozenset[str]] = frozenset({"make", "place", "issue", "initiate", "process"})
"""Verbs that write only with a transaction noun (:data:`TRANSACTION_NOUNS`)."""

TRANSACTION_NOUNS: Final[frozenset[str]] = frozenset(
    {
        "payment",
        "payments",
        "order",
        "booking",
        "reservation",
        "purchase",
        "transfer",
        "refund",
        "transaction",
        "deposit",
        "withdrawal",
        "donation",
        "call",
    }
)
"""Objects that make a light verb a write (``make_payment``, ``place_order``)."""

READ_VERBS: Final[frozenset[str]] = frozenset(
    {
        "get",
        "list",
        "search",
        "find",
        "fetch",
        "read",
        "query",
        "lookup",
        "look",
        "check",
        "show",
        "describe",
        "view",
        "count",
        "calculate",
        "compute",
        "estimate",
        "preview",
        "validate",
        "verify",
        "retrieve",
        "browse",
        "inspect",
        "explain",
        "summarize",
        "analyze",
        "compare",
        "track",
        "is",
        "has",
        "can",
    }
)
"""A read word after the first word makes the first a noun or a question
(``order_lookup``, ``update_check``)."""

NOUN_MARKERS: Final[frozenset[str]] = frozenset(
    {
        "id",
        "ids",
        "uuid",
        "at",
        "on",
        "by",
        "date",
        "dates",
        "time",
        "times",
        "timestamp",
        "count",
        "counts",
        "number",
        "num",
        "no",
        "url",
        "uri",
    }
)
"""Words that, right after a write verb, show it is a noun or an attribute
(``post_id``, ``charge_at``, ``update_time``)."""

NOUN_FIELDS: Final[frozenset[str]] = frozenset(
    {
        "status",
        "state",
        "details",
        "detail",
        "info",
        "information",
        "history",
        "summary",
        "list",
        "lists",
        "log",
        "logs",
        "type",
        "types",
        "data",
        "item",
        "items",
        "line",
        "lines",
        "total",
        "totals",
        "amount",
        "rate",
        "rates",
        "policy",
        "policies",
        "method",
        "methods",
        "option",
        "options",
        "settings",
        "period",
        "stub",
        "slip",
        "title",
        "titles",
        "content",
        "body",
        "author",
        "authors",
        "comments",
        "likes",
        "stats",
        "statistics",
        "report",
        "reports",
        "tracking",
        "price",
        "prices",
        "value",
        "values",
        "code",
        "codes",
        "address",
        "book",
        "books",
        "review",
        "reviews",
        "cover",
        "chapter",
        "chapters",
        "office",
        "link",
        "fee",
        "fees",
        "label",
        "numbers",
        "two",
        "integers",
        "ints",
        "floats",
        "vectors",
        "matrices",
        "for",
        "of",
        "from",
        "in",
    }
)
"""Words that, after an ambiguous verb, are a field of that noun (``order_status``,
``exchange_rate``, ``post_comments``) or an argument of arithmetic (``add_numbers``)."""

_NAMESPACE = re.compile(r"__|[./:]")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")
_WORDS_CACHE: Final = 2048


def name_words(name: str) -> tuple[str, ...]:
    """The lower-case words of ``name``'s action segment (rule 1 of the module docstring).

    Example::

        name_words("mcp__tickets__createTicket")  # ("create", "ticket")
    """
    segments = [s for s in _NAMESPACE.split(name) if s.strip("_- ")]
    if not segments:
        return ()
    return tuple(w.lower() for w in _CAMEL.findall(segments[-1]))


@functools.lru_cache(maxsize=_WORDS_CACHE)
def infer_write_risk(name: str) -> bool:
    """Whether tool ``name`` is a likely write by its name alone (the module docstring's
    rule, its source and its limits).

    Args:
        name: the tool name as the agent calls it.

    Returns:
        True for ``create_ticket``, ``sendEmail``, ``tickets.delete``, ``make_payment``;
        False for ``get_created_at``, ``list_posts``, ``order_status``, ``post_id``,
        ``toggle_data``, and for any name that is not a ``str``.
    """
    if not isinstance(name, str):
        return False
    words = name_words(name)
    if not words:
        return False
    first, rest = words[0], words[1:]
    if any(w in READ_VERBS for w in rest):
        return False
    following = rest[0] if rest else None
    if first in LIGHT_VERBS:
        return following in TRANSACTION_NOUNS
    if first not in WRITE_VERBS or following in NOUN_MARKERS:
        return False
    if first in AMBIGUOUS_VERBS:
        return following is not None and following not in NOUN_FIELDS
    return True
