"""Canonical JSON, action fingerprints and observation digests (DESIGN section 2).

- *action fingerprint*: sha256 of the canonical JSON of ``{"tool": name, "arguments": args}``
  after volatile fields are removed.
- *intent fingerprint* (write tools): the same, also without the idempotency key, so a
  fresh key per attempt is still the same intent.
- *retry key*: a looser fingerprint (strings case-folded, inner whitespace collapsed) so a
  retry with cosmetic argument changes after the same error still counts as a retry.
- *observation digest*: sha256 of the canonical, redacted tool result with volatile fields
  removed; an error observation digests its failure class, exception type and message.

Canonical form: keys sorted, volatile keys dropped at any depth (progress-bearing keys are
always kept), strings stripped, tuples and sets as lists (sets sorted), bytes as hex,
non-finite floats as strings, other objects by ``str``; a value whose conversion raises
(a hostile subclass or ``__str__``) by identity, never an exception. Hashing is constant
work per value: no run state is involved.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

__all__ = [
    "action_fingerprint",
    "canonical_json",
    "canonicalize",
    "digest",
    "fingerprint_with",
    "key_text",
    "object_token",
    "observation_digest",
    "observation_digest_with",
    "preview",
    "text_fingerprint",
    "tool_suffix",
]

_WS: Final = re.compile(r"\s+")
_sha256: Final = hashlib.sha256
# Canonical scalars no redaction rule can change (only strings and containers are scanned).
_UNSCRUBBED: Final = frozenset({int, bool, float})
_MAX_DEPTH: Final = 64
_MAX_INT_BITS: Final = 13_000
"""Larger ints are canonical as ``"int:0x..."``: Python refuses to turn an int of more
than 4,300 decimal digits (about 14,284 bits) into text (``sys.set_int_max_str_digits``),
so JSON of ``3**10000`` raised inside the agent's tool call. Hex has no such limit."""
_MAX_OBJECT_EXPANSIONS: Final = 256
"""Plain objects expanded into their fields per canonical value; past it (an object graph
with back references, a huge tree of objects) the rest are given by identity, which can
make equal states look different (a missed loop) but never different states look equal
(a false stop)."""


def _big_int(value: int) -> str:
    return f"int:{value:#x}"


def _safe_str(value: Any) -> str:
    """``str(value)``, or the type name when ``__str__`` raises."""
    try:
        return str(value)
    except Exception:  # a hostile __str__ must not break the agent
        return f"<{type(value).__name__}>"


def key_text(key: Any) -> str:
    """A mapping key as text, as canonical values spell it (never raises: a key whose
    ``__str__`` raises is its type name; an int too long for text is hex)."""
    if type(key) is str:
        return key
    if type(key) is int and key.bit_length() > _MAX_INT_BITS:
        return _big_int(key)
    return _safe_str(key)


def object_token(value: Any) -> str:
    """An object's identity as text, ``<module.Class #id>``: the same object gives the same
    token for its lifetime, another object (even an equal one) another token.

    How plain objects in action *arguments* are fingerprinted (a client, a session, a
    connection handle: the same handle is the same action whatever its counters say),
    and a method's ``self``/``cls``.
    """
    kind = value if isinstance(value, type) else type(value)
    return f"<{kind.__module__}.{kind.__qualname__} #{id(value):x}>"


class _Expansion(threading.local):
    identity = False  # plain objects by identity (arguments) rather than state (results)
    left = 0  # expansions left in the current top-level one
    active = 0  # nesting of object expansions in progress


_EXPANSION: Final = _Expansion()


def _plain_object_fields(value: Any) -> dict[str, Any] | None:
    """The fields of a plain object (default ``__repr__`` and ``__str__``) by name,
    ``__slots__`` included (private ones under their mangled names); None for other
    objects or when reading them raises."""
    kind = type(value)
    default = object.__dict__
    if getattr(kind, "__repr__", None) is not default["__repr__"]:
        return None
    if getattr(kind, "__str__", None) is not default["__str__"]:
        return None
    fields: dict[str, Any] = {}
    try:
        for klass in reversed(kind.__mro__):
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                if slot in ("__dict__", "__weakref__"):
                    continue
                name = slot
                if slot.startswith("__") and not slot.endswith("__"):
                    name = f"_{klass.__name__.lstrip('_')}{slot}"
                if hasattr(value, name):
                    fields[slot] = getattr(value, name)
        fields.update(getattr(value, "__dict__", None) or {})
    except Exception:  # a hostile __getattr__ or __dict__
        return None
    return fields


def _canon_object(value: Any, drop: frozenset[str], loose: bool, depth: int) -> Any:
    """A plain object: by identity in arguments (:func:`object_token`), by state in
    results, ``{"__type__": qualname, field: canonical value, ...}``.

    By state because such an object's ``str`` holds its address: the same unchanged
    result looked new on every call and no loop was ever seen. Fields are canonical
    values themselves (nested objects, volatile keys and key order as anywhere else), so
    two different states never digest equal; the expansion budget bounds the walk.
    """
    local = _EXPANSION
    if local.identity:
        return object_token(value)
    fields = _plain_object_fields(value)
    if fields is None:
        return _safe_str(value)
    if local.active == 0:
        local.left = _MAX_OBJECT_EXPANSIONS
    if local.left <= 0:
        return object_token(value)
    local.left -= 1
    local.active += 1
    try:
        state: dict[str, Any] = {"__type__": f"{type(value).__module__}.{type(value).__qualname__}"}
        for name, field_value in fields.items():
            if type(name) is str:
                state[name] = field_value
        return _canon(state, drop, loose, depth + 1)
    finally:
        local.active -= 1


def canonicalize(
    value: Any,
    volatile: frozenset[str] = frozenset(),
    keep: frozenset[str] = frozenset(),
    *,
    loose: bool = False,
    objects: str = "state",
) -> Any:
    """Return a JSON-ready canonical copy of ``value``.

    Args:
        value: any Python value (dicts, lists, scalars, dataclasses, bytes, sets).
        volatile: lowercase keys dropped at any depth (matched case-insensitively).
        keep: lowercase keys never dropped (progress-bearing fields), even if volatile.
        loose: also case-fold strings and collapse inner whitespace (retry keys).
        objects: plain objects (default ``repr``) by ``"state"`` (their fields, as for
            observations) or by ``"identity"`` (:func:`object_token`, as for arguments).

    Deeper than 64 levels, a value is replaced by its type name (hostile input cannot
    exhaust the stack).

    Raises:
        ValueError: ``objects`` is neither ``"state"`` nor ``"identity"``.
    """
    if objects not in ("state", "identity"):
        raise ValueError(f"objects must be 'state' or 'identity', got {objects!r}")
    drop = volatile - keep if keep else volatile
    if objects == "state":
        return _canon(value, drop, loose, 0)
    return _by_identity(_canon, value, drop, loose, 0)


def _by_identity(fn: Callable[..., Any], *args: Any) -> Any:
    local = _EXPANSION
    before = local.identity
    local.identity = True
    try:
        return fn(*args)
    finally:
        local.identity = before


def _canon(value: Any, drop: frozenset[str], loose: bool, depth: int) -> Any:
    kind = type(value)
    if kind is str:
        s = value.strip()
        return _WS.sub(" ", s).casefold() if loose else s
    if kind is int:
        return value if value.bit_length() <= _MAX_INT_BITS else _big_int(value)
    if kind is bool or value is None:
        return value
    if depth > _MAX_DEPTH:
        return f"<{kind.__name__}>"
    if kind is dict:
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = k if type(k) is str else key_text(k)
            if drop and key.lower() in drop:
                continue
            vkind = type(v)
            # Scalar leaves inline: most tool arguments are flat, and a call per leaf
            # costs a third of the guard's per-step time.
            if vkind is str and not loose:
                out[key] = v.strip()
            elif vkind is bool or v is None or (vkind is int and v.bit_length() <= _MAX_INT_BITS):
                out[key] = v
            else:
                out[key] = _canon(v, drop, loose, depth + 1)
        return out
    if kind is list or kind is tuple:
        items: list[Any] = []
        append = items.append
        for v in value:
            vkind = type(v)
            if vkind is str and not loose:
                append(v.strip())
            elif vkind is bool or v is None or (vkind is int and v.bit_length() <= _MAX_INT_BITS):
                append(v)
            else:
                append(_canon(v, drop, loose, depth + 1))
        return items
    if kind is float:
        return value if math.isfinite(value) else str(value)
    return _canon_other(value, drop, loose, depth)


def _plain(  # noqa: PLR0917 - positional on purpose: recursive hot path
    value: Any,
    drop: frozenset[str],
    clean: Container[str] | None,
    keys: Mapping[str, bool] | None,
    limit: int,
    depth: int,
) -> bool:
    """True when ``value`` is already canonical (``_canon`` would return an equal copy:
    JSON types only, ``str`` keys none of them dropped, strings already stripped, finite
    floats, nesting under ``limit``) and, when ``clean`` is given, known clean (every
    string in ``clean``, every key False in ``keys``: redaction would return it as is).

    One read-only pass instead of a canonical copy plus a redaction walk; False only
    means "take the full path".
    """
    kind = type(value)
    if kind is dict or kind is list:
        if depth >= limit:
            return False
        if kind is dict:
            for k in value:
                if type(k) is not str or (drop and k.lower() in drop):
                    return False
                if keys is not None and keys.get(k) is not False:
                    return False
        for v in value.values() if kind is dict else value:
            vkind = type(v)
            if vkind is str:
                if v.strip() is not v or (clean is not None and v not in clean):
                    return False
            elif vkind is int or vkind is bool or v is None:
                continue
            elif vkind is float:
                if not math.isfinite(v):
                    return False
            elif not _plain(v, drop, clean, keys, limit, depth + 1):
                return False
        return True
    if kind is str:
        return value.strip() is value and (clean is None or value in clean)
    if kind is int or kind is bool or value is None:
        return True
    return kind is float and math.isfinite(value)


def _canon_other(value: Any, drop: frozenset[str], loose: bool, depth: int) -> Any:
    """Any value that is not an exact JSON type. A conversion that raises (a subclass
    whose ``__iter__``, ``__str__``, ``__float__`` or ``__bytes__`` raises, a mapping
    whose ``__getitem__`` raises, a dataclass field whose getter raises) gives the
    value by identity (:func:`object_token`): it was raised into the agent, before or
    after the tool ran. Identity can make equal values look different (a missed loop),
    never different values look equal (a false stop)."""
    try:
        return _convert_other(value, drop, loose, depth)
    except Exception:  # hostile input must not break the agent
        return object_token(value)


def _convert_other(value: Any, drop: frozenset[str], loose: bool, depth: int) -> Any:
    if isinstance(value, str):
        return _canon(str(value), drop, loose, depth)
    if isinstance(value, bool | int):
        return _canon(int(value), drop, loose, depth)
    if isinstance(value, float):
        return _canon(float(value), drop, loose, depth)
    if isinstance(value, Mapping):
        return _canon(dict(value), drop, loose, depth)
    if isinstance(value, list | tuple):
        return _canon(list(value), drop, loose, depth)
    if isinstance(value, set | frozenset):
        items = [_canon(v, drop, loose, depth + 1) for v in value]
        return sorted(items, key=canonical_json)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if is_dataclass(value) and not isinstance(value, type):
        # Field by field: ``asdict`` deep-copies, which fails on locks, files, sockets.
        fields_ = {f.name: getattr(value, f.name, None) for f in dataclass_fields(value)}
        return _canon(fields_, drop, loose, depth + 1)
    return _canon_object(value, drop, loose, depth)


_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)
# The C encoder built once: ``JSONEncoder.encode`` builds one (and a closure) per call,
# which is most of the cost of encoding a small value. Same arguments as ``_ENCODER``
# except the circular-reference markers: canonical values are trees.
_C_ENCODE: Final[Callable[[Any, int], Any] | None] = (
    c_make_encoder(None, str, encode_basestring, None, ":", ",", True, False, True)
    if c_make_encoder is not None
    else None
)


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys of an already canonical value.

    Raises:
        ValueError: a circular reference (not a canonical value).
        TypeError: keys that cannot be sorted together (not a canonical value).
    """
    if _C_ENCODE is not None:
        try:
            return "".join(_C_ENCODE(value, 0))
        except RecursionError:
            pass  # a cycle: the checked encoder below reports it as ValueError
    return _ENCODER.encode(value)


def digest(text: str) -> str:
    """sha256 hex digest (64 lowercase hex chars) of UTF-8 ``text``."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _keys(fields: Iterable[str]) -> frozenset[str]:
    return frozenset(f.lower() for f in fields)


def action_fingerprint(
    tool: str,
    arguments: Any,
    volatile: frozenset[str] = frozenset(),
    keep: frozenset[str] = frozenset(),
    *,
    loose: bool = False,
) -> str:
    """Fingerprint of calling ``tool`` with ``arguments``.

    Args:
        tool: tool name.
        arguments: the call's arguments (usually a dict).
        volatile: lowercase keys to drop (defaults plus the tool's own, plus the
            idempotency key for an intent fingerprint).
        keep: lowercase progress-bearing keys, never dropped.
        loose: the retry-key variant (case-folded, whitespace-collapsed strings).

    Returns:
        64 lowercase hex chars.
    """
    drop = volatile - keep if keep else volatile
    return fingerprint_with(tool_suffix(tool), arguments, drop, loose=loose)


def tool_suffix(tool: str) -> str:
    """The constant tail of a tool's fingerprint text (see :func:`fingerprint_with`)."""
    return ',"tool":' + canonical_json(tool) + "}"


def fingerprint_with(
    suffix: str, arguments: Any, drop: frozenset[str], *, loose: bool = False
) -> str:
    """:func:`action_fingerprint` with the per-tool parts precomputed (the guard's hot path).

    ``'{"arguments":' + canonical JSON + suffix`` is byte for byte the canonical JSON of
    ``{"tool": tool, "arguments": ...}`` (keys sorted: ``arguments`` < ``tool``).

    Args:
        suffix: :func:`tool_suffix` of the tool.
        arguments: the call's arguments.
        drop: lowercase keys dropped at any depth (``volatile - keep``).
        loose: the retry-key variant.
    """
    body = None
    if not loose and _plain(arguments, drop, None, None, _MAX_DEPTH, 0):
        body = _encode_plain(arguments)
    if body is None:
        canon = _by_identity(_canon, arguments, drop, loose, 0)
        body = "".join(_C_ENCODE(canon, 0)) if _C_ENCODE is not None else canonical_json(canon)
    text = '{"arguments":' + body + suffix
    return _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _encode_plain(value: Any) -> str | None:
    """Canonical JSON of a value :func:`_plain` accepted, or None when it holds an int
    too long for text (``_canon`` turns those into hex; :data:`_MAX_INT_BITS`): caught
    here rather than checked per int on the hot path."""
    try:
        return "".join(_C_ENCODE(value, 0)) if _C_ENCODE is not None else canonical_json(value)
    except ValueError:
        return None


def observation_digest(
    result: Any,
    volatile: frozenset[str] = frozenset(),
    keep: frozenset[str] = frozenset(),
    *,
    scrub: Callable[[Any], Any] | None = None,
) -> str:
    """Digest of a tool result (64 lowercase hex chars).

    Args:
        result: the tool's return value (for an error, pass a dict describing it).
        volatile / keep: as for :func:`action_fingerprint`.
        scrub: redaction applied to the canonical value before hashing, so a rotating
            secret in a result (a fresh session token) is not mistaken for a new
            observation.
    """
    drop = volatile - keep if keep else volatile
    return observation_digest_with(result, drop, scrub)


def observation_digest_with(
    result: Any, drop: frozenset[str], scrub: Callable[[Any], Any] | None = None
) -> str:
    """:func:`observation_digest` with ``drop = volatile - keep`` precomputed (hot path).

    A scrub that offers ``clean_caches()`` (see
    :meth:`~.redaction.Redactor.clean_caches`) lets a result that is already canonical
    and known clean skip both the canonical copy and the redaction walk.
    """
    caches = getattr(scrub, "clean_caches", None) if scrub is not None else None
    if scrub is None or caches is not None:
        clean, keys, limit = caches() if caches is not None else (None, None, _MAX_DEPTH)
        if _plain(result, drop, clean, keys, min(limit, _MAX_DEPTH), 0):
            plain = _encode_plain(result)
            if plain is not None:
                return _sha256(plain.encode("utf-8", "surrogatepass")).hexdigest()
    canon = _canon(result, drop, False, 0)
    if scrub is not None and not (canon is None or type(canon) in _UNSCRUBBED):
        canon = scrub(canon)
    text = "".join(_C_ENCODE(canon, 0)) if _C_ENCODE is not None else canonical_json(canon)
    return _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def text_fingerprint(text: str | None) -> str:
    """Fingerprint of a non-tool decision's text: case-folded, whitespace-collapsed.

    Empty or whitespace-only text yields the fingerprint of ``""``, so five empty
    messages are five identical decisions.
    """
    norm = _WS.sub(" ", (text or "").strip()).casefold()
    return digest(canonical_json({"decision": norm}))


def preview(tool: str, fingerprint: str) -> str:
    """A redacted preview of an action for evidence: tool name and fingerprint prefix."""
    return f"{tool}#{fingerprint[:12]}"


def fields_lower(fields: Iterable[str]) -> frozenset[str]:
    """Lowercase a set of field names (volatile and progress lists are case-insensitive)."""
    return _keys(fields)
