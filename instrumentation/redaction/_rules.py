"""Redaction rules: what a secret looks like, and the rule table.

The secret patterns (:data:`BUILTIN_SECRET_RULES`, each with the source of its shape),
the sensitive key names (:data:`DEFAULT_KEY_NAMES`), the placeholder syntax, and
:class:`RedactionRules`, which validates a rule set and compiles every pattern once.

Placeholders are type-tagged: ``[REDACTED:<rule>]``, where ``<rule>`` is one of a closed
set (:attr:`RedactionRules.rule_names`, also the ``rule`` label of
``loopwatch_redactions_total``): ``canary``; the name of each secret pattern (custom
:class:`SecretRule` included); ``sensitive_key`` (a value under a sensitive key);
``depth`` (a container nested past :attr:`RedactionRules.max_json_depth`, JSON text too
deep to walk that holds an escape, or text whose redaction did not settle, replaced
whole: fail closed). When matches overlap, the union is replaced once and tagged with
the first rule in that order. In HMAC mode the placeholder carries the first 8 hex chars
of HMAC-SHA256(key, value), so equal secrets can be correlated without being revealed:
``[REDACTED:jwt:3f9a1c2b]``. Placeholders are atomic (no rule matches inside one of the
redactor's own rule names), so redacting twice equals redacting once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from .. import _semconv as sc
from ._command_line import CLI_PASSWORD_PATTERN, CLI_PASSWORD_TRIGGERS, cli_password_spans

Hits = dict[str, int]
"""Redaction counts by rule name (never the values)."""

PLACEHOLDER_PREFIX: Final = "[REDACTED:"
RULE_CANARY: Final = "canary"
RULE_SENSITIVE_KEY: Final = "sensitive_key"
RULE_ASSIGNMENT: Final = "assignment"
RULE_DEPTH: Final = "depth"
RULE_CLI_PASSWORD_FLAG: Final = "cli_password_flag"
HMAC_TAG_HEX_CHARS: Final = 8

_RESERVED_RULE_NAMES: Final = frozenset({RULE_CANARY, RULE_SENSITIVE_KEY, RULE_DEPTH})
_RULE_NAME_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_KEY_NAME_RE: Final = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
PLACEHOLDER_RE: Final = re.compile(
    rf"\[REDACTED:([a-z][a-z0-9_]*)(?::[0-9a-f]{{{HMAC_TAG_HEX_CHARS}}})?\]"
)
_CAMEL_1: Final = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_2: Final = re.compile(r"([a-z0-9])([A-Z])")


@dataclass(frozen=True, slots=True)
class SecretRule:
    """One secret pattern.

    Attributes:
        name: rule name: the placeholder tag and the ``rule`` metric label;
            ``[a-z][a-z0-9_]{0,39}``, unique, not ``canary``/``sensitive_key``/``depth``.
        pattern: Python regular expression. If it has a group named ``secret``, only that
            group is replaced; otherwise the whole match is.
        triggers: literal substrings, at least one of which occurs in *every* match. The
            pattern runs only on text containing a trigger (the cheap pre-filter), so a
            trigger set that misses some matches makes the rule miss them too.
        ignore_case: compile with ``re.IGNORECASE | re.ASCII`` and look for the triggers
            (which must then be lowercase) in the lowercased text.
        spans: for a rule whose secrets one pattern cannot delimit: called with the text
            and the compiled ``pattern``, returns the ``(start, end)`` of each secret
            (the built-in ``cli_password_flag``: the pattern finds commands, this reads
            their options). ``None``: the pattern's matches are the secrets.
    """

    name: str
    pattern: str
    triggers: tuple[str, ...]
    ignore_case: bool = False
    spans: Callable[[str, re.Pattern[str]], list[tuple[int, int]]] | None = None


_TOKEN = r"A-Za-z0-9_\-"
_Q = r"(?:\\?[\"'])?"  # optional quote, possibly JSON-escaped
_QU = r"(?:\\?[\"']|%(?:25)?2[27])?"  # the same, or URL-encoded (once or twice)

# Between .netrc tokens: white space, or its escapes in a printf or echo -e argument.
_NETRC_SEP: Final = r"(?:[ \t\r\n]|\\[nrt])++"
_NETRC_TOKEN: Final = r"(?:(?!\\[nrt])[^\s]){1,256}+"

BUILTIN_SECRET_RULES: Final[tuple[SecretRule, ...]] = (
    # PEM / OpenSSH / OpenPGP private key blocks: RFC 7468 section 2 encapsulation
    # boundaries, RFC 4880 section 6.2 armor. A truncated block (no END line) is still
    # redacted up to the first character that cannot occur in a block.
    SecretRule(
        "private_key",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?!-----END)[A-Za-z0-9+/=\s:,.()\\\-])*+"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
        ("PRIVATE KEY",),
    ),
    # Anthropic Console keys start "sk-ant-" (e.g. "sk-ant-api03-..."; docs.anthropic.com,
    # "API keys"). Listed before OpenAI so an Anthropic key gets its own tag.
    SecretRule(
        "anthropic_key",
        rf"sk-ant-(?<![{_TOKEN}]sk-ant-)[{_TOKEN}]{{20,}}+",
        ("sk-ant-",),
    ),
    # OpenAI secret keys start "sk-": legacy "sk-<48>", project "sk-proj-", service
    # account "sk-svcacct-", admin "sk-admin-" (platform.openai.com, "API keys").
    SecretRule("openai_key", rf"sk-(?<![{_TOKEN}]sk-)[{_TOKEN}]{{20,}}+", ("sk-",)),
    # GitHub tokens: ghp_ (classic PAT), gho_ (OAuth), ghu_ (user-to-server), ghs_
    # (server-to-server), ghr_ (refresh) + 36 base62 chars ("Behind GitHub's new
    # authentication token formats", github.blog 2021-04-05); fine-grained PATs start
    # "github_pat_" (docs.github.com, "Managing your personal access tokens").
    SecretRule(
        "github_token",
        r"(?:gh[pousr]_(?<![A-Za-z0-9]gh[pousr]_)[A-Za-z0-9]{30,}+"
        r"|github_pat_(?<![A-Za-z0-9]github_pat_)[A-Za-z0-9_]{22,}+)",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    # Slack tokens: xoxb- (bot), xoxp- (user), xoxa-/xoxr-/xoxs-, rotating "xoxe.xoxp-",
    # app-level "xapp-" (api.slack.com, "Token types").
    SecretRule(
        "slack_token",
        r"(?:xox[a-z](?<![A-Za-z0-9]xox[a-z])(?:\.xox[a-z])?-[A-Za-z0-9\-]{10,}+"
        r"|xapp-(?<![A-Za-z0-9]xapp-)[A-Za-z0-9\-]{10,}+)",
        ("xox", "xapp-"),
    ),
    # Google API keys: "AIza" + 35 chars [0-9A-Za-z_-] (the 39-char keys shown in Google
    # Cloud "Manage API keys"; the same shape GitHub secret scanning uses).
    SecretRule(
        "google_api_key",
        rf"AIza(?<![{_TOKEN}]AIza)[{_TOKEN}]{{35}}(?![{_TOKEN}])",
        ("AIza",),
    ),
    # Stripe secret and restricted keys: sk_live_, sk_test_, rk_live_, rk_test_
    # (docs.stripe.com, "API keys"; test keys are secrets too).
    SecretRule(
        "stripe_key",
        r"(?<![A-Za-z0-9])[sr]k_(?:live|test)_[A-Za-z0-9]{16,}+",
        ("k_live_", "k_test_"),
    ),
    # JWS/JWE compact serialization (RFC 7515 section 7.1, RFC 7519): base64url parts
    # joined by dots; the JOSE header is a JSON object, so it starts "eyJ" ('{"').
    SecretRule(
        "jwt",
        rf"eyJ(?<![{_TOKEN}]eyJ)[{_TOKEN}]{{10,}}+(?:\.[{_TOKEN}]*+){{2,4}}",
        ("eyJ",),
    ),
    # AWS access key ids: AKIA (long-term) and ASIA (STS temporary), 20 chars
    # (IAM User Guide, "Unique identifiers": ID prefixes).
    SecretRule(
        "aws_access_key",
        r"A[KS]IA(?<![A-Za-z0-9]A[KS]IA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        ("AKIA", "ASIA"),
    ),
    # AWS secret access keys are 40 chars of base64 with no fixed prefix, so only matched
    # next to their name (aws_secret_access_key=..., "SecretAccessKey": "...").
    SecretRule(
        "aws_secret_key",
        rf"secret[_\-]?(?:access[_\-]?)?key{_Q}(?:[ \t]{{0,5}}[:=][ \t]{{0,5}}|[ \t]+){_Q}"
        r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        ("secret",),
        ignore_case=True,
    ),
    # Bearer tokens (RFC 6750 section 2.1, b64token syntax). A digit is required so prose
    # ("bearer instruments") is left alone; "Authorization: Bearer <anything>" is caught
    # by the assignment rule.
    SecretRule(
        "bearer",
        r"bearer[ \t]{1,5}(?P<secret>(?=[A-Za-z0-9._~+/\-]*[0-9])[A-Za-z0-9._~+/\-]{16,}+=*)",
        ("bearer",),
        ignore_case=True,
    ),
    # Passwords in URL userinfo, scheme://user:password@host (RFC 3986 section 3.2.1).
    SecretRule(
        "url_password",
        r"://[^\s:/?#@\[\]\"'<>]{0,256}:(?P<secret>[^\s/?#@\"'<>]{1,256})@",
        ("://",),
    ),
    # user:password given to curl's -u / --user and -U / --proxy-user (curl(1), "-u,
    # --user <user:password>"), also written -uuser:pass or after other short options
    # (-su user:pass is -s -u user:pass); only the password is replaced.
    # The trigger is "curl", not the flag: it gates the rule to text that names curl, as
    # elsewhere -u / --user take user:group or uid:gid (docker, podman, sudo, pgrep) or a
    # time (at, date -u +%H:%M), which are not passwords.
    SecretRule(
        "cli_password",
        r"(?<![\w\-])(?:-[a-z]{0,8}u|--(?:proxy-)?user)(?:[ \t]+|=)?[\"']?"
        r"[^\s:\"'\-][^\s:\"']{0,255}:(?P<secret>[^\s\"']{1,256})",
        ("curl",),
        ignore_case=True,
    ),
    # A password given as the value of a command's own option, or echoed into sudo -S:
    # the pattern finds the command words, cli_password_spans reads their options.
    SecretRule(
        RULE_CLI_PASSWORD_FLAG,
        CLI_PASSWORD_PATTERN,
        CLI_PASSWORD_TRIGGERS,
        spans=cli_password_spans,
    ),
    # .netrc entries (curl, ftp, git and Python's netrc module read them): "machine HOST"
    # or "default", other tokens, then "password PASSWORD" (inetutils ftp(1), "The .netrc
    # file"); tokens are separated by spaces, tabs or line breaks (also written as \n, as
    # in printf 'machine h\nlogin u\npassword p' >> ~/.netrc); a token may be quoted
    # (Python's netrc module reads "a b" as one).
    SecretRule(
        "netrc_password",
        rf"(?:\bmachine{_NETRC_SEP}{_NETRC_TOKEN}"
        rf"(?:{_NETRC_SEP}(?:login|account|port){_NETRC_SEP}{_NETRC_TOKEN}){{0,3}}+"
        # "default" alone before "password" is prose ("change the default password").
        rf"|\bdefault(?:{_NETRC_SEP}(?:login|account|port){_NETRC_SEP}{_NETRC_TOKEN}){{1,3}}+)"
        rf"{_NETRC_SEP}password{_NETRC_SEP}"
        r"""(?P<secret>"[^"\n]{1,256}+"|(?:(?!\\[nrt])[^\s]){1,256})""",
        ("password",),
    ),
)
"""The built-in secret patterns, in priority order (an earlier rule tags an overlap)."""

DEFAULT_KEY_NAMES: Final[tuple[str, ...]] = (
    *("password", "passwd", "pwd", "passphrase", "secret", "client_secret", "secret_key"),
    *("secret_access_key", "api_key", "apikey", "token", "access_token", "refresh_token"),
    *("id_token", "auth_token", "session_token", "authorization", "proxy_authorization"),
    *("cookie", "set_cookie", "private_key", "credential", "credentials"),
    # Well-known names with no separator before the sensitive word: libpq's password
    # variable (PostgreSQL manual, "Environment Variables") and sshpass's (sshpass(1), -e).
    *("pgpassword", "sshpass"),
)
"""Sensitive key names, normalized (see :meth:`RedactionRules.key_is_sensitive`)."""

DEFAULT_ALLOWED_KEY_NAMES: Final[tuple[str, ...]] = (
    *("page_token", "next_page_token", "continuation_token", "pagination_token"),
    *("sync_token", "token_type"),
)
"""Key names never treated as sensitive: pagination cursors are progress evidence."""

STRUCTURAL_KEYS: Final[frozenset[str]] = frozenset(
    {
        *(sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_AGENT_NAME, sc.GEN_AI_AGENT_ID),
        *(sc.GEN_AI_CONVERSATION_ID, sc.GEN_AI_TOOL_NAME, sc.GEN_AI_TOOL_CALL_ID),
        *(sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.ERROR_TYPE),
        *(sc.GEN_AI_AGENT_FINISH_REASON, sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_SYSTEM),
        *(sc.GEN_AI_PROVIDER_NAME, sc.OPENINFERENCE_SPAN_KIND, sc.OPENINFERENCE_TOOL_NAME),
    }
)
"""Attribute keys exempt from key-name rules (their values are still scanned)."""


def placeholder(rule: str, tag: str | None = None) -> str:
    """Return the placeholder for ``rule``: ``[REDACTED:<rule>]`` or ``[REDACTED:<rule>:<tag>]``."""
    return f"{PLACEHOLDER_PREFIX}{rule}]" if tag is None else f"{PLACEHOLDER_PREFIX}{rule}:{tag}]"


def is_placeholder(text: str) -> bool:
    """Return whether ``text`` is exactly one redaction placeholder."""
    return text.startswith(PLACEHOLDER_PREFIX) and PLACEHOLDER_RE.fullmatch(text) is not None


def _normalize_key(segment: str) -> str:
    snake = _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", segment))
    return snake.lower().replace("-", "_").replace(" ", "_")


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    name: str
    regex: re.Pattern[str]
    secret_group: int
    is_assignment: bool
    spans: Callable[[str, re.Pattern[str]], list[tuple[int, int]]] | None = None


_TriggerTable = tuple[tuple[str, frozenset[int]], ...]


@dataclass(frozen=True)
class RedactionRules:
    """Immutable redaction configuration; every pattern is compiled once, here.

    Attributes:
        secret_rules: secret patterns, in priority order (default
            :data:`BUILTIN_SECRET_RULES`).
        key_names: sensitive key names, normalized (lowercase ``snake_case``). A key is
            sensitive when its last dot-separated segment, normalized (camelCase and
            ``-`` become ``_``, lowercased), equals a name, ends with ``_<name>``, or equals
            a name once underscores are dropped (``accessToken``, ``X-Api-Key``,
            ``db.password``).
        allowed_key_names: normalized names never sensitive; an allowed name wins over a
            sensitive one (``next_page_token``).
        exempt_keys: exact attribute keys never redacted by key name (structural ids and
            names; their values are still scanned by patterns and canaries).
        exempt_key_prefixes: key prefixes exempt like ``exempt_keys`` (``loopwatch.``).
        allowed_values: regexes; a pattern or key-name match whose whole value matches one
            is kept (documentation examples such as ``AKIAIOSFODNN7EXAMPLE``). Canaries are
            never allowed. Empty (the default) allows nothing.
        text_assignments: also redact ``name=value`` / ``name: value`` in free text when
            ``name`` is a sensitive key name (rule ``assignment``).
        max_json_depth: container nesting bound, counted across JSON nested inside
            strings; a deeper container is replaced whole by ``[REDACTED:depth]``. 1-256.
        parse_json_strings: parse strings that hold a JSON object or array, redact the
            structure, and re-serialize it compactly if anything changed.

    Raises:
        ValueError: at construction, for an invalid rule name, a duplicate or reserved
            name, a pattern that does not compile or matches the empty string, a rule
            without triggers, an uppercase trigger on an
            ``ignore_case`` rule, a key name that is not normalized, or a depth out of range.
    """

    secret_rules: tuple[SecretRule, ...] = BUILTIN_SECRET_RULES
    key_names: tuple[str, ...] = DEFAULT_KEY_NAMES
    allowed_key_names: tuple[str, ...] = DEFAULT_ALLOWED_KEY_NAMES
    exempt_keys: frozenset[str] = STRUCTURAL_KEYS
    exempt_key_prefixes: tuple[str, ...] = ("loopwatch.",)
    allowed_values: tuple[str, ...] = ()
    text_assignments: bool = True
    max_json_depth: int = 64
    parse_json_strings: bool = True

    _compiled: tuple[_CompiledRule, ...] = field(init=False, repr=False, compare=False)
    _allowed: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    # Triggers and the indices of the rules they gate: case-sensitive, case-insensitive.
    _cs_triggers: _TriggerTable = field(init=False, repr=False, compare=False)
    _ci_triggers: _TriggerTable = field(init=False, repr=False, compare=False)
    _key_index: int = field(init=False, repr=False, compare=False)
    _trigger_index: Mapping[str, frozenset[int]] = field(init=False, repr=False, compare=False)
    _names_exact: frozenset[str] = field(init=False, repr=False, compare=False)
    _names_suffix: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _names_nosep: frozenset[str] = field(init=False, repr=False, compare=False)
    _alnum_lower_safe: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_json_depth <= 256:
            raise ValueError(f"max_json_depth must be within 1..256, got {self.max_json_depth}")
        for name in (*self.key_names, *self.allowed_key_names):
            if not _KEY_NAME_RE.fullmatch(name):
                raise ValueError(f"key name {name!r} is not normalized (lowercase snake_case)")
        if self.text_assignments and not self.key_names:
            raise ValueError("text_assignments needs at least one key name")
        rules = list(self.secret_rules)
        if self.text_assignments:
            rules.append(self._assignment_rule())
        seen: set[str] = set()
        compiled: list[_CompiledRule] = []
        for rule in rules:
            if not _RULE_NAME_RE.fullmatch(rule.name):
                raise ValueError(f"rule name {rule.name!r} must match [a-z][a-z0-9_]{{0,39}}")
            if rule.name in seen or rule.name in _RESERVED_RULE_NAMES:
                raise ValueError(f"rule name {rule.name!r} is duplicated or reserved")
            seen.add(rule.name)
            compiled.append(self._compile(rule))
        allowed: list[re.Pattern[str]] = []
        for pattern in self.allowed_values:
            try:
                allowed.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(
                    f"allowed value pattern {pattern!r} does not compile: {exc}"
                ) from None
        cs: dict[str, set[int]] = {}
        ci: dict[str, set[int]] = {}
        for index, rule in enumerate(rules):
            for trigger in rule.triggers:
                (ci if rule.ignore_case else cs).setdefault(trigger, set()).add(index)
        key_index = len(compiled)
        for trigger in _key_triggers(self.key_names):
            ci.setdefault(trigger, set()).add(key_index)
        builtin = set(BUILTIN_SECRET_RULES)
        setattr_ = object.__setattr__
        setattr_(self, "_compiled", tuple(compiled))
        setattr_(self, "_allowed", tuple(allowed))
        setattr_(self, "_cs_triggers", tuple((t, frozenset(i)) for t, i in cs.items()))
        setattr_(self, "_ci_triggers", tuple((t, frozenset(i)) for t, i in ci.items()))
        setattr_(self, "_key_index", key_index)
        lowered: dict[str, set[int]] = {}
        for trigger, indices in (*cs.items(), *ci.items()):
            lowered.setdefault(trigger.lower(), set()).update(indices)
        setattr_(self, "_trigger_index", {t: frozenset(i) for t, i in lowered.items()})
        setattr_(self, "_names_exact", frozenset(self.key_names))
        setattr_(self, "_names_suffix", tuple("_" + n for n in self.key_names))
        setattr_(self, "_names_nosep", frozenset(n.replace("_", "") for n in self.key_names))
        # Every built-in rule needs an uppercase letter, punctuation or whitespace, so
        # lowercase alphanumeric strings (hex digests, ids) can skip the pattern pass.
        setattr_(self, "_alnum_lower_safe", all(r in builtin for r in self.secret_rules))

    def _assignment_rule(self) -> SecretRule:
        # A sensitive name, then its value: after ``=``, ``:`` or ``=>`` (Ruby, PHP, Perl
        # hashes), the same URL-encoded (``%3D``, ``%3A``: a form or query string encoded
        # once more; ``%253D``: twice, a query in a URL in a query), or a space after a
        # command-line flag (``--password x``, ``--db-password x``, ``--db_password x``;
        # an unquoted word after the flag that starts with ``-`` is the next option or
        # stdin, as after psql's --no-password).
        # Over-redaction is the safe side: a URL-encoded value runs on to the next raw
        # separator. A value in quotes (raw or JSON-escaped) runs on to its closing quote,
        # spaces included (``DB_PASSWORD="correct horse battery"``, ``--password 'a b'``),
        # or to the end of the line when the quote is never closed; a quote that closes a
        # string is not a value's (``print("password:", pw)``: the redactor checks
        # :func:`quote_closes`). A value is taken whole, however long, so that one pass
        # redacts it and a second finds nothing.
        names = sorted(self.key_names, key=len, reverse=True)
        alternation = "|".join(re.escape(n).replace("_", "[_-]?") for n in names)
        return SecretRule(
            RULE_ASSIGNMENT,
            rf"(?:(?:{alternation}){_QU}[ \t]{{0,5}}(?:=>|[:=]|%(?:25)?3[ad])[ \t]{{0,5}}"
            r"(?:%(?:25)?2[27])?"
            rf"|(?<![\w\-])--(?:[a-z0-9]+[_.-]){{0,3}}(?:{alternation})[ \t]+(?!-))"
            r"(?P<quote>\\?[\"'])?"
            r"(?:(?:bearer|basic|token|digest)[ \t]+)?"
            r"(?P<secret>(?(quote)(?:(?!(?P=quote))(?:\\[^\"'\r\n]|[^\r\n\\]))++"
            r"|[^\s\"'&,;<>\\]++))",
            _key_triggers(self.key_names),
            ignore_case=True,
        )

    @staticmethod
    def _compile(rule: SecretRule) -> _CompiledRule:
        if not rule.triggers or not all(rule.triggers):
            raise ValueError(f"rule {rule.name!r} needs at least one non-empty trigger")
        if rule.ignore_case and any(t != t.lower() for t in rule.triggers):
            raise ValueError(f"rule {rule.name!r} ignores case: its triggers must be lowercase")
        flags = re.IGNORECASE | re.ASCII if rule.ignore_case else 0
        try:
            regex = re.compile(rule.pattern, flags)
        except re.error as exc:
            raise ValueError(f"rule {rule.name!r}: pattern does not compile: {exc}") from None
        if regex.fullmatch(""):
            raise ValueError(f"rule {rule.name!r}: pattern matches the empty string")
        group = regex.groupindex.get("secret", 0)
        return _CompiledRule(rule.name, regex, group, rule.name == RULE_ASSIGNMENT, rule.spans)

    def key_is_sensitive(self, key: str) -> bool:
        """Return whether a value under ``key`` is replaced whole (key-name rule)."""
        if key in self.exempt_keys or key.startswith(self.exempt_key_prefixes):
            return False
        norm = _normalize_key(key.rsplit(".", 1)[-1])
        if norm in self.allowed_key_names:
            return False
        return (
            norm in self._names_exact
            or norm.endswith(self._names_suffix)
            or norm.replace("_", "") in self._names_nosep
        )

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Every rule name a placeholder or hit can carry (a bounded metric label set)."""
        return (RULE_CANARY, *(r.name for r in self._compiled), RULE_SENSITIVE_KEY, RULE_DEPTH)

    @property
    def triggers(self) -> frozenset[str]:
        """Every pre-filter trigger, lowercased: what a ``trigger_matcher`` must find.

        Searching these in lowercased text is a sound superset of the exact gate (a
        case-sensitive trigger that occurs also occurs lowercased in the lowered text).
        """
        return frozenset(self._trigger_index)


def _key_triggers(names: Iterable[str]) -> tuple[str, ...]:
    # A normalized key keeps each underscore-separated part of the raw key contiguous
    # (only case and separators change), so one part per name is a sound trigger.
    chosen: list[str] = []
    for name in sorted(names, key=lambda n: n.count("_")):
        parts = name.split("_")
        if any(any(c in p for c in chosen) for p in parts):
            continue
        chosen.append(max(parts, key=len))
    return tuple(t for t in chosen if not any(o != t and o in t for o in chosen))
