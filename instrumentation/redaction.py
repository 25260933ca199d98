"""Redaction rules: the one place loopwatch decides what a secret looks like.

The agent side scrubs captured tool arguments and results with these rules before they
leave the process; the collector applies the same rules to every field of every span it
receives (DESIGN section 5). Standard library only: this module runs inside agents whose
only dependency is ``opentelemetry-api``.

Three kinds of rule, applied in this order of precedence:

1. **Canaries**: exact values planted on purpose (one per line in a canary file, or the
   path in ``LOOPWATCH_REDACTION_CANARIES``). Each canary is also matched in its
   JSON-escaped, URL-encoded and base64 forms (:func:`canary_forms`), also across line
   breaks and with any JSON ``\\uXXXX`` escapes read as characters. A canary hit is the
   signal that data leaked; it always wins over every allowlist.
2. **Secret patterns** (:data:`BUILTIN_SECRET_RULES`): provider API keys, bearer tokens,
   JWTs, AWS keys, PEM private key blocks, passwords in URLs, and ``name=value``
   assignments whose name is a sensitive key name. Only the secret part of a match is
   replaced (``Bearer [REDACTED:bearer]``).
3. **Key names**: in a mapping (span attributes, kvlists, JSON objects), a value under a
   sensitive key (``db.password``, ``http.request.header.authorization``, ``apiKey``) is
   replaced whole.

Placeholders are type-tagged: ``[REDACTED:<rule>]``, where ``<rule>`` is one of a closed
set of rule names (:attr:`Redactor.rule_names`), also the ``rule`` label of
``loopwatch_redactions_total``: ``canary``; the secret patterns ``private_key``,
``anthropic_key``, ``openai_key``, ``github_token``, ``slack_token``, ``google_api_key``,
``stripe_key``, ``jwt``, ``aws_access_key``, ``aws_secret_key``, ``bearer``,
``url_password``, ``cli_password``, ``cli_password_flag``, ``netrc_password``,
``assignment`` (plus any custom :class:`SecretRule`); ``sensitive_key`` (a value under
a sensitive key); ``depth`` (a container nested past
:attr:`RedactionRules.max_json_depth`, JSON text too deep to walk that holds an escape,
or text whose redaction did not settle, replaced whole: fail closed). JSON with duplicate
keys is re-serialized as parsed (the last value of each key). When matches overlap, the
union is replaced once and tagged with the first rule in that order. In HMAC mode the
placeholder carries the first 8 hex chars of HMAC-SHA256(key, value) so equal secrets
can be correlated without being revealed: ``[REDACTED:jwt:3f9a1c2b]``. Placeholders are
atomic (no rule matches inside one of the redactor's own rule names), so redacting
twice equals redacting once.

Pre-filter: a pattern runs only on text containing one of its literal triggers
(:attr:`SecretRule.triggers`): by default one ``in`` test per trigger; the collector plugs
in an Aho-Corasick matcher that finds all triggers in one pass. Lowercase alphanumeric
strings (hex digests, ids) and strings under 5 characters skip the patterns entirely, and
strings found clean are remembered in a bounded cache.

This is one line of defence, not a guarantee: a secret with no known shape under an
innocuous key name passes through. Plant canaries to measure what leaks.

Example:
    >>> redactor = Redactor(canaries=["lw-canary-7f3a9c21"])
    >>> redactor.redact_text("curl -H 'Authorization: Bearer abc123def456ghi789jk'")
    ("curl -H 'Authorization: Bearer [REDACTED:bearer]'", {'bearer': 1})
    >>> redactor.redact_value({"db.password": "hunter2", "q": "lw-canary-7f3a9c21"})
    {'db.password': '[REDACTED:sensitive_key]', 'q': '[REDACTED:canary]'}
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Final, Protocol
from urllib.parse import quote, quote_plus

from ._semconv import (
    ENV_CANARIES,
    ERROR_TYPE,
    GEN_AI_AGENT_FINISH_REASON,
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_SYSTEM,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    OPENINFERENCE_SPAN_KIND,
    OPENINFERENCE_TOOL_NAME,
)

__all__ = [
    "BUILTIN_SECRET_RULES",
    "DEFAULT_ALLOWED_KEY_NAMES",
    "DEFAULT_KEY_NAMES",
    "MIN_CANARY_CHARS",
    "PLACEHOLDER_PREFIX",
    "RULE_ASSIGNMENT",
    "RULE_CANARY",
    "RULE_DEPTH",
    "RULE_SENSITIVE_KEY",
    "STRUCTURAL_KEYS",
    "CanaryMatcher",
    "Hits",
    "RedactionRules",
    "Redactor",
    "RegexCanaryMatcher",
    "SecretRule",
    "canaries_from_env",
    "canary_forms",
    "default_redactor",
    "is_placeholder",
    "load_canaries",
    "placeholder",
]

_logger = logging.getLogger(__name__)

Hits = dict[str, int]
"""Redaction counts by rule name (never the values)."""

PLACEHOLDER_PREFIX: Final = "[REDACTED:"
RULE_CANARY: Final = "canary"
RULE_SENSITIVE_KEY: Final = "sensitive_key"
RULE_ASSIGNMENT: Final = "assignment"
RULE_DEPTH: Final = "depth"
RULE_CLI_PASSWORD_FLAG: Final = "cli_password_flag"
MIN_CANARY_CHARS: Final = 8
HMAC_TAG_HEX_CHARS: Final = 8

_RESERVED_RULE_NAMES: Final = frozenset({RULE_CANARY, RULE_SENSITIVE_KEY, RULE_DEPTH})
_RULE_NAME_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_KEY_NAME_RE: Final = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_PLACEHOLDER_RE: Final = re.compile(
    rf"\[REDACTED:([a-z][a-z0-9_]*)(?::[0-9a-f]{{{HMAC_TAG_HEX_CHARS}}})?\]"
)
_CAMEL_1: Final = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_2: Final = re.compile(r"([a-z0-9])([A-Z])")
_KEY_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_KEY_LOOKBACK_CHARS: Final = 128
# A percent escape, or one encoded once more ("%26", "%2526").
_PERCENT_ESCAPE_RE: Final = re.compile(r"%(?:25)?[0-9A-Fa-f]{2}")
_CLEAN_CACHE_MAX_ENTRIES: Final = 32768
_CLEAN_CACHE_MAX_CHARS: Final = 256
# JSON text that a parse and walk left unchanged, by the depth it was scrubbed at. Longer
# than the plain cache admits: the JSON a run span carries (its policy's limits, some
# 300-700 chars, naming max_tokens) is the same for every run of a policy, and parsing
# and walking it again cost about half of the collector's redaction time on
# `loopwatch demo` spans (10 of 19 us/span, measured here).
_JSON_CLEAN_CACHE_MAX_ENTRIES: Final = 4096
_JSON_CLEAN_CACHE_MAX_CHARS: Final = 4096
_KEY_CACHE_MAX_ENTRIES: Final = 8192
_FIXPOINT_PASSES: Final = 4
# What JavaScript's encodeURIComponent and encodeURI leave unescaped beyond what
# urllib.parse.quote always leaves (letters, digits, "_.-~").
_JS_URI_COMPONENT_SAFE: Final = "!'()*"
_JS_URI_SAFE: Final = ";,/?:@&=+$#!'()*"
# Shortest text any built-in rule can match: "pwd=x" (assignment) or "://:x@" (URL).
_MIN_SECRET_CHARS: Final = 5
# A line break (CR, LF, CRLF, or their JSON escapes) and the spaces and tabs after it:
# what MIME (RFC 2045 section 6.8: lines of at most 76 chars), PEM (RFC 7468: 64) and
# `base64` (76) insert into long base64 text, and what indented or folded text adds.
# Canary matching ignores them (see Redactor._find_canaries).
# A JSON escape of one BMP character (RFC 8259 section 7); canary matching also reads
# text with these decoded (see Redactor._find_canaries).
_U_ESCAPE_RE: Final = re.compile(r"\\u([0-9a-fA-F]{4})")
_LINE_BREAK_RE: Final = re.compile(r"(?:\r\n|\r|\n|\\r\\n|\\r|\\n)[ \t]*")
# Characters displays do not show (soft hyphen, zero-width space, non-joiner, joiner,
# word joiner, BOM); the dashboard also removes U+2060 from client text. Canary matching
# ignores them, and line breaks, inside a match (see Redactor._find_canaries).
_INVISIBLE_RE: Final = re.compile("[\u00ad\u200b-\u200d\u2060\ufeff]")
_FOLD_RE: Final = re.compile(
    r"(?:(?:\r\n|\r|\n|\\r\\n|\\r|\\n)[ \t]*|[\u00ad\u200b-\u200d\u2060\ufeff])+"
)


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

# Commands that take a password as the value of an option (rule cli_password_flag), each
# from the command's manual: (command, ((option, separator from its value), ...)). A
# separator may hold a group ``open``: a quote it opened, which the value then closes.
_SPACED: Final = r"(?:[ \t]+|=)"
# Between the elements of an argument list written as text: ["redis-cli", "-a", "pw"].
_LIST_SEP: Final = r"""["'][ \t]*+,[ \t]*+["']"""
_GLUED_OR_SPACED: Final = r"(?:[ \t]+|=)?"
_PASSWORD_OPTIONS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    # docker login and the registry clients that copy its options (global options of
    # docker, podman and nerdctl may come before "login").
    (
        r"(?:(?:docker|podman|nerdctl)(?:[ \t]++--?[a-zA-Z][\w\-]{0,31}+"
        r"(?:[ \t=]++[^\s;&|\-][^\s;&|]{0,255}+)?){0,6}+|buildah|skopeo|oras"
        rf"|helm[ \t]++registry|az(?:[ \t]++acr)?)(?:[ \t]++|{_LIST_SEP})login",
        (
            ("-p", _GLUED_OR_SPACED),
            ("--password", _SPACED),
            ("--creds", r"""(?:[ \t]+|=)(?P<open>["']?)[^\s:"']{1,256}+:"""),
        ),
    ),
    # sshpass: only its own options, before the command it runs (whose -p is a port).
    ("sshpass", (("-p", r"[ \t]*"),)),
    (
        r"mongo(?:sh|dump|restore|export|import|files|stat|top)?",
        (("-p", _GLUED_OR_SPACED), ("--password", _SPACED)),
    ),
    ("redis-cli", (("-a", r"[ \t]+"), ("--pass", _SPACED))),
    ("redis-server", (("--requirepass", _SPACED), ("--masterauth", _SPACED))),
    # Registry credentials user:password (skopeo(1) --src-creds / --dest-creds, podman
    # and buildah --creds): the password after the colon.
    (
        r"(?:skopeo|podman|buildah)",
        (("--(?:src-|dest-)?creds", r"""(?:[ \t]+|=)(?P<open>["']?)[^\s:"']{1,256}+:"""),),
    ),
    # Glued only: after a separate -p the MySQL client prompts, and the word is the
    # database. The same for 7-Zip's -p.
    (r"(?:mysql|mariadb)(?:[\w\-]{0,24}+)", (("-p", ""),)),
    (r"7z[arz]?", (("-p", ""),)),
    (r"(?:un)?zip", (("-P", r"[ \t]*"),)),
    ("ssh-keygen", (("-[NP]", r"[ \t]*"),)),  # new and old passphrase
    # OpenLDAP clients' bind password; ldappasswd's -s is the new password (elsewhere -s
    # is the search scope).
    ("ldappasswd", (("-w", r"[ \t]*"), ("-s", r"[ \t]*"))),
    (r"ldap[a-z]{0,12}+", (("-w", r"[ \t]*"),)),
    # -k password; -passin / -passout / -pass / -password with the "pass:" source
    # (openssl-passphrase-options(1)); env:, file: and fd: name where the secret is.
    ("openssl", (("-k", r"[ \t]+"), ("-pass(?:in|out|word)?", r"""[ \t]+(?P<open>["']?)pass:"""))),
    (
        r"(?:keytool|jarsigner)",
        (("-(?:src|dest|new)?(?:store|key)?pass", r"[ \t]+"), ("-new", r"[ \t]+")),
    ),
    (
        "smbclient",
        (("-(?:U|-user(?:name)?)", r"""(?:[ \t]*|=)(?P<open>["']?)[^\s%"']{1,256}+%"""),),
    ),
)
# The option's value after a command word, one pattern per command of _PASSWORD_OPTIONS:
# option, then its separator, or (an argument list: ["redis-cli", "-a", "pw"]) the
# option's closing quote, a comma and the value's opening quote.
# Every option starts with "-", which leads the pattern so that re searches for it quickly.
_OPTION_RES: Final = tuple(
    re.compile(
        r"-(?<![\w\-]-)(?:"
        + "|".join(
            (
                rf"(?:{name[1:]})(?:[\"'][ \t]*+,[ \t]*+(?P<lq{i}>[\"'])|{sep})"  # _LIST_SEP
                if sep
                else rf"(?:{name[1:]})"
            )
            for i, (name, sep) in enumerate(options)
        )
        + ")"
    )
    for _, options in _PASSWORD_OPTIONS
)
assert all(name.startswith("-") for _, options in _PASSWORD_OPTIONS for name, _ in options)
# sshpass's own options (sshpass(1)) before the command it runs, also as the elements of
# an argument list (['sshpass', '-p', 'pw', 'ssh', 'h']).
_SSHPASS_ARG: Final = rf"""(?:{_LIST_SEP}[^"'\n]*+|[ \t]*+(?:"[^"\n]*+"|'[^'\n]*+'|[^\s;&|"']++))"""
_SSHPASS_OPTIONS_RE: Final = re.compile(
    rf"""(?:(?:[ \t]++|{_LIST_SEP})(?:-[fdP]{_SSHPASS_ARG}|-[ehvV](?![\w\-])|-p{_SSHPASS_ARG}))*+"""
)
# The rest of a shell command: quoted strings whole (a ; & | in quotes is part of the
# command), backslash escapes (a continued line), and not ; & | a line break, a comment
# (# after a space) or a written \n or \r (text holding an escaped script:
# "cd /app\nmysql -pX").
_COMMAND_REST_RE: Final = re.compile(
    r"""(?:[^"'\\;&|\n \t]++|[ \t]++(?!#)|"(?:[^"\\\n]|\\(?![nr])[^\n])*+"|'[^'\n]*+'"""
    r"""|\\(?![nr])(?:\r\n|[^\r]|\r)|["'])*+"""
)
_COMMAND_START_CHARS: Final = (";", "&", "|", "(", "\n")
# A word: shell escapes (\$) are part of it; a backslash before a quote ends it (\" closes
# a JSON string around the command), as do a backtick and ")" (`cmd -p x`, $(cmd -p x)).
_UNQUOTED_VALUE_RE: Final = re.compile(
    r"(?:\\[^\s\"']|[^\s\"'`)\-;&|<>\\])(?:\\[^\s\"']|[^\s\"'`);&|<>\\])*+"
)
_QUOTE_RE: Final = re.compile(r"\\?[\"']")
# A command word right after one of these is not the command run: a container or host
# name (docker run --name mongo -p 27017:27017, ssh mongo -p 2222, find -name mysql -prune).
_NOT_A_COMMAND_AFTER: Final = frozenset(
    {"--name", "-name", "-iname", "--hostname", "--host", "-h", "--link", "--network", "-z"}
    | {"ssh", "scp", "sftp", "mosh", "nc", "ncat", "netcat", "telnet", "ping", "dig", "host"}
    | {"nslookup", "traceroute", "curl", "wget"}
    # docker and kubectl take a container, pod or resource name there.
    | {"exec", "logs", "rm", "stop", "start", "restart", "kill", "inspect", "attach", "cp"}
    | {"pod", "pods", "sts", "statefulset", "deploy", "deployment", "svc", "service"}
)
# The command words of _PASSWORD_OPTIONS (group c<i>), and echo / printf (group sudo).
_CLI_PASSWORD_PATTERN: Final = (
    # Word starts with a command's first letter only: the alternation is tried there alone.
    r"(?:\b|(?<=\\[nt]))(?=[abdehjklmnoprsuz7])"
    r"(?:(?<![\w\-.=:@])|(?<=\\[nt])|(?<=[ \t]@))(?:"
    + "|".join(
        rf"(?P<c{i}>{command})(?=[\s\"'`;&|)]|\\[nt]|$)"
        for i, (command, _) in enumerate(_PASSWORD_OPTIONS)
    )
    + r"|(?P<sudo>(?:echo|printf)\b))"
)
_SSHPASS: Final = next(i for i, (c, _) in enumerate(_PASSWORD_OPTIONS) if c == "sshpass")
_CLI_PASSWORD_RE: Final = re.compile(_CLI_PASSWORD_PATTERN)
_CLI_PASSWORD_TRIGGERS: Final = (
    *("login", "sshpass", "mongo", "redis-cli", "mysql", "mariadb", "zip", "7z"),
    *("ssh-keygen", "ldap", "openssl", "keytool", "jarsigner", "smbclient", "sudo"),
    *("creds", "redis-server"),
)
# An argument vector worth reading as a command line: an element holds a trigger.
_ARGV_HINT_RE: Final = re.compile("|".join(map(re.escape, _CLI_PASSWORD_TRIGGERS)))
# echo or printf into sudo -S (sudo(8), -S, --stdin: the password is read from stdin).
_SUDO_STDIN_RE: Final = re.compile(
    r"""(?:echo(?:[ \t]++-[neE]{1,3}+)?|printf(?:[ \t]++["']?%s(?:\\n)?["']?)?)[ \t]++"""
    r"""(?P<value>\\"[^"\n\\]{1,256}+\\"|"[^"\n\\]{1,256}+(?:\\n)?"|'[^'\n\\]{1,256}+(?:\\n)?'"""
    r"""|"[^"\n]{1,256}+"|'[^'\n]{1,256}+'|[^\s"'|;&\\]{1,256}+)"""
    r"""[ \t]*+\|[ \t]*+sudo\b[^\n;&|]{0,128}?[ \t](?:-[A-Za-z]*S|--stdin)(?![\w\-])"""
)


def _cli_password_spans(text: str, commands: re.Pattern[str]) -> list[tuple[int, int]]:
    """Spans of the passwords given to the commands of :data:`_PASSWORD_OPTIONS` in
    ``text`` (rule ``cli_password_flag``), and of values echoed into ``sudo -S``.

    For each command word found by ``commands`` in command position (see
    :func:`_in_command_position`), the rest of its shell command (:func:`_command_end`;
    4,096 characters at most, and on from there if the command goes on) is read for
    every one of the command's password options; a value in quotes (raw or
    JSON-escaped) runs to the same quote on its line, spaces included. A command's
    region is read once however many of its command words it holds, so the whole scan
    is linear in ``len(text)`` (for each of the commands at most).
    """
    spans: list[tuple[int, int]] = []
    # Per command: where its last region ended, and whether only the 4,096 bound ended it.
    scanned: dict[str, tuple[int, bool]] = {}
    for match in commands.finditer(text):
        family = match.lastgroup
        if family is None:
            continue
        if family == "sudo":
            echoed = _SUDO_STDIN_RE.match(text, match.start())
            if echoed is not None:
                start, end = echoed.span("value")
                if text[start] == "\\":
                    start, end = start + 2, end - 2
                elif text[start] in "\"'":
                    start, end = start + 1, end - 1
                spans.append((start, end))
            continue
        region_end, bounded = scanned.get(family, (0, False))
        if match.start() < region_end:
            if not bounded:
                continue
            position = region_end  # the same command, past the bound: read on
        else:
            if not _in_command_position(text, match.start()):
                continue
            position = match.end()
        index = int(family[1:])
        stop, bounded = _command_end(text, position)
        limit = stop
        if index == _SSHPASS and position == match.end():
            # Only sshpass's own options: the command it runs comes next (its -p is a port).
            own = _SSHPASS_OPTIONS_RE.match(text, position, stop)
            limit = own.end() if own is not None else position
        options = _OPTION_RES[index]
        while position < limit:
            option = options.search(text, position, limit)
            if option is None:
                break
            value = _option_value(text, option, limit)
            if value is None:
                position = option.end()
                continue
            spans.append(value)
            position = value[1]
            if position > stop:  # a quoted value ran past the command's end
                stop, bounded = _command_end(text, position)
                limit = position if index == _SSHPASS else stop
        # A bounded region is read on from a little before its end: an option cut by the
        # bound is read whole next time.
        scanned[family] = (max(stop - 256 if bounded else stop, match.end()), bounded)
    return spans


def _command_end(text: str, position: int) -> tuple[int, bool]:
    """Where the shell command going on at ``position`` ends (``;``, ``&``, ``|``, a line
    break no backslash continues, or a written ``\n``; quoted strings are read whole),
    within 4,096 characters; and whether only that bound ended it."""
    bound = min(len(text), position + 4096)
    end = _COMMAND_REST_RE.match(text, position, bound)
    found = end.end() if end is not None else position
    return found, found >= bound and bound < len(text)


def _in_command_position(text: str, start: int) -> bool:
    """Whether the command word at ``start`` is the command run, not an argument of
    another: not inside a volume, URL or option value (``mysql-data:/var/lib/mysql``,
    ``--name=mongo``), not right after an option naming a container or host, nor after a
    command whose next word is a host or a container (``_NOT_A_COMMAND_AFTER``)."""
    chunk = text[max(0, start - 256) : start]
    cut = max(chunk.rfind(c) for c in _COMMAND_START_CHARS)
    escaped = chunk.rfind("\\n")
    if escaped >= 0 and escaped + 1 > cut:
        cut = escaped + 1
    words = chunk[cut + 1 :].split()
    if not words:
        return True
    if not chunk[-1].isspace():  # the last word is the start of the command word's own
        own = words[-1]
        own = own[max(own.rfind(c) for c in "\"'`([{,") + 1 :]  # {"cmd":"docker login
        if ":" in own or "=" in own:
            return False
        words.pop()
        if not words:
            return True
    return words[-1].strip("\"'`([{,").lower() not in _NOT_A_COMMAND_AFTER


def _option_value(text: str, option: re.Match[str], stop: int) -> tuple[int, int] | None:
    """The span of the value after ``option`` (a match of an :data:`_OPTION_RES`
    pattern), or ``None`` when there is none (the next option, the end of the command).
    A quoted value runs to the same quote, or to the end of its line when it never
    closes.
    """
    position = option.end()
    groups = option.groupdict()
    quote = groups.get("open") or next(
        (v for k, v in groups.items() if k.startswith("lq") and v), None
    )
    if not quote:
        opened = _QUOTE_RE.match(text, position)
        if opened is not None:
            if _quote_closes(text, position, opened.group(), opened.end()):
                return None  # os.system("mysql -uroot -p" + pw): the string ends there
            quote, position = opened.group(), opened.end()
    if quote:
        close = text.find(quote, position, position + 4096)
        if close < 0:  # rare: then a search to the end, and the value goes as far
            close = text.find(quote, position)
        line_end = text.find("\n", position, close if close >= 0 else len(text))
        if line_end >= 0:
            end = line_end - (text[line_end - 1 : line_end] == "\r")
        else:
            end = close if close >= 0 else len(text)
        return (position, end) if end > position else None
    value = _UNQUOTED_VALUE_RE.match(text, position, stop)
    return value.span() if value is not None else None


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
    # A password given as the value of a command's own option (each its manual; see
    # _PASSWORD_OPTIONS), or echoed into sudo -S. The pattern finds the command words;
    # _cli_password_spans (its ``spans``) then reads the rest of each shell command for
    # the command's password options, every one of them, with values quoted or not, so
    # that elsewhere -p stays a port (ssh -p 22, psql -p 5432, docker run -p 8080:80).
    SecretRule(
        RULE_CLI_PASSWORD_FLAG,
        _CLI_PASSWORD_PATTERN,
        _CLI_PASSWORD_TRIGGERS,
        spans=_cli_password_spans,
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
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "client_secret",
    "secret_key",
    "secret_access_key",
    "api_key",
    "apikey",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "private_key",
    "credential",
    "credentials",
    # Well-known names with no separator before the sensitive word: libpq's password
    # variable (PostgreSQL manual, "Environment Variables") and sshpass's (sshpass(1), -e).
    "pgpassword",
    "sshpass",
)
"""Sensitive key names, normalized (see :meth:`RedactionRules.key_is_sensitive`)."""

DEFAULT_ALLOWED_KEY_NAMES: Final[tuple[str, ...]] = (
    "page_token",
    "next_page_token",
    "continuation_token",
    "pagination_token",
    "sync_token",
    "token_type",
)
"""Key names never treated as sensitive: pagination cursors are progress evidence."""

STRUCTURAL_KEYS: Final[frozenset[str]] = frozenset(
    {
        GEN_AI_OPERATION_NAME,
        GEN_AI_AGENT_NAME,
        GEN_AI_AGENT_ID,
        GEN_AI_CONVERSATION_ID,
        GEN_AI_TOOL_NAME,
        GEN_AI_TOOL_CALL_ID,
        GEN_AI_USAGE_INPUT_TOKENS,
        GEN_AI_USAGE_OUTPUT_TOKENS,
        GEN_AI_AGENT_FINISH_REASON,
        GEN_AI_REQUEST_MODEL,
        GEN_AI_SYSTEM,
        GEN_AI_PROVIDER_NAME,
        ERROR_TYPE,
        OPENINFERENCE_SPAN_KIND,
        OPENINFERENCE_TOOL_NAME,
    }
)
"""Attribute keys exempt from key-name rules (their values are still scanned)."""


def placeholder(rule: str, tag: str | None = None) -> str:
    """Return the placeholder for ``rule``: ``[REDACTED:<rule>]`` or ``[REDACTED:<rule>:<tag>]``."""
    return f"{PLACEHOLDER_PREFIX}{rule}]" if tag is None else f"{PLACEHOLDER_PREFIX}{rule}:{tag}]"


def is_placeholder(text: str) -> bool:
    """Return whether ``text`` is exactly one redaction placeholder."""
    return text.startswith(PLACEHOLDER_PREFIX) and _PLACEHOLDER_RE.fullmatch(text) is not None


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
    _cs_triggers: tuple[tuple[str, frozenset[int]], ...] = field(
        init=False, repr=False, compare=False
    )
    _ci_triggers: tuple[tuple[str, frozenset[int]], ...] = field(
        init=False, repr=False, compare=False
    )
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
        # string is not a value's (``print("password:", pw)``, ``"Invalid password: " +
        # name``: see _closes_a_string). A value is taken
        # whole, however long: a bound left the rest for the next pass, which redacted it
        # again, and so on.
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
        return _CompiledRule(
            rule.name,
            regex,
            group,
            rule.name == RULE_ASSIGNMENT,
            rule.spans,
        )

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


def _argument_list_spans(items: Sequence[str]) -> dict[int, list[tuple[int, int]]]:
    """Password spans in an argument vector (``["redis-cli", "-a", "pw"]``, OTel's
    ``process.command_args``), by element: the elements are read as one command line.
    """
    if len(items) < 2 or not any(_ARGV_HINT_RE.search(item) for item in items):
        return {}
    offsets: list[int] = []
    parts: list[str] = []
    position = 0
    for item in items:
        quoted = json.dumps(item)
        offsets.append(position + 1)
        parts.append(quoted)
        position += len(quoted) + 2
    line = ", ".join(parts)
    found: dict[int, list[tuple[int, int]]] = {}
    for start, end in _cli_password_spans(line, _CLI_PASSWORD_RE):
        index = bisect.bisect_right(offsets, start) - 1
        if index < 0:
            continue
        offset = offsets[index]
        item_end = offset + len(parts[index]) - 2
        if start < item_end and end <= item_end:
            raw = parts[index][1:-1]
            if raw == items[index]:  # no JSON escapes: offsets are the element's
                found.setdefault(index, []).append((start - offset, end - offset))
            else:
                found.setdefault(index, []).append((0, len(items[index])))
    return found


# After a quote that closes a string: a space, ", " "; " "+ ", or a closing bracket.
_AFTER_CLOSING_QUOTE_RE: Final = re.compile(r"\s|[,;+]|[)\]}](?:[\s,;.)\]}]|$)")


def _closes_a_string(text: str, match: re.Match[str]) -> bool:
    """Whether an assignment match's quote closes a string rather than opening a value:
    ``print("password:", pw)``, ``"Invalid password: " + name``.

    Both must hold: an odd number of the same quote before it on its line (the string it
    closes opened there; ``DB_PASSWORD=" x"`` has none, ``"password": " x"`` two), and
    what follows is what follows a closing quote in code (a space, ``,``, ``;``, ``+``,
    or a closing bracket before a separator).
    """
    quote = match.group("quote")
    if not quote:
        return False
    return _quote_closes(text, match.start("quote"), quote, match.start("secret"))


def _quote_closes(text: str, at: int, quote: str, after: int) -> bool:
    """Whether ``quote`` at ``at`` closes a string (see :func:`_closes_a_string`);
    ``after`` is where the text after it starts."""
    if _AFTER_CLOSING_QUOTE_RE.match(text, after) is None:
        return False
    begin = max(text.rfind("\n", max(0, at - 1024), at) + 1, at - 1024, 0)
    count = text.count(quote, begin, at)
    if not quote.startswith("\\"):
        count -= text.count("\\" + quote, begin, at)
    return count % 2 == 1


class CanaryMatcher(Protocol):
    """Finds canary occurrences; the collector plugs in an Aho-Corasick automaton."""

    def find_spans(self, text: str) -> list[tuple[int, int]]:
        """Return ``(start, end)`` of every occurrence of any canary form in ``text``.

        Spans may overlap; an empty list means no canary. Must be thread-safe.
        """
        ...


class RegexCanaryMatcher:
    """Stdlib canary matcher: one compiled alternation over every form of every canary.

    Finds overlapping occurrences (a zero-width lookahead at each position), so one form
    cannot hide another. Cost grows with the number of forms; the collector uses an
    Aho-Corasick automaton instead.

    Args:
        forms: every string to find (see :func:`canary_forms`); may be empty.
    """

    __slots__ = ("_regex",)

    def __init__(self, forms: Iterable[str]) -> None:
        ordered = sorted(set(forms), key=lambda f: (-len(f), f))
        alternation = "|".join(re.escape(f) for f in ordered)
        self._regex = re.compile(f"(?=({alternation}))") if ordered else None

    def find_spans(self, text: str) -> list[tuple[int, int]]:
        """See :meth:`CanaryMatcher.find_spans`."""
        if self._regex is None:
            return []
        return [(m.start(), m.start() + len(m.group(1))) for m in self._regex.finditer(text)]


def _base64_cores(data: bytes) -> set[str]:
    # In the base64 of any byte string holding `data` at an offset r (mod 3), the chars
    # whose 6 bits all come from `data` are fixed: chars ceil(8r/6) .. floor((8r+8n)/6)-1
    # of the encoding of r filler bytes + data. Matching those covers every alignment.
    forms: set[str] = set()
    n = len(data)
    for r in range(3):
        encoded = base64.b64encode(b"\0" * r + data + b"\0\0").decode("ascii")
        core = encoded[-(-8 * r // 6) : (8 * r + 8 * n) // 6]
        forms.add(core)
        forms.add(core.replace("+", "-").replace("/", "_"))
    for encoder in (base64.b64encode, base64.urlsafe_b64encode):
        full = encoder(data).decode("ascii")
        forms.add(full)
        forms.add(full.rstrip("="))
    return forms


def canary_forms(canary: str) -> frozenset[str]:
    """Return every form of ``canary`` that redaction looks for.

    The forms: the raw value; JSON-escaped (``ensure_ascii`` on and off, ``/`` escaped or
    not, and escaped twice for JSON inside a JSON string); URL-encoded (``quote`` with
    ``safe="/"`` and ``safe=""``, ``quote_plus``, JavaScript's ``encodeURIComponent`` and
    ``encodeURI``, WHATWG ``URLSearchParams``; upper- and lowercase hex); base64 and
    base64url of the UTF-8 bytes, padded and unpadded, plus the three alignment cores that
    occur when the canary sits inside a longer base64-encoded payload, the same for the
    JSON-escaped forms (base64 of a JSON document); and, for non-ASCII
    forms, the Latin-1 reading of their UTF-8 bytes (bytes values that are not UTF-8 are
    scanned as Latin-1).

    Args:
        canary: the exact canary value, at least :data:`MIN_CANARY_CHARS` characters.

    Returns:
        The forms; each at least 8 characters long.

    Raises:
        ValueError: the canary is too short, holds a line break, or could occur inside a
            placeholder. The message never contains the value.
    """
    if len(canary) < MIN_CANARY_CHARS:
        raise ValueError(f"a canary must be at least {MIN_CANARY_CHARS} characters long")
    if "\n" in canary or "\r" in canary:
        raise ValueError("a canary must not contain a line break")
    if PLACEHOLDER_PREFIX[1:-1] in canary.upper() or re.fullmatch(r"[0-9a-f]{1,8}", canary):
        raise ValueError("a canary must not be able to occur inside a placeholder")
    forms: set[str] = {canary}
    escaped = {json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1]}
    escaped |= {e.replace("/", "\\/") for e in escaped}
    escaped |= {json.dumps(e)[1:-1] for e in escaped}
    forms |= escaped
    encoded = {
        quote(canary),
        quote(canary, safe=""),
        quote_plus(canary),
        # JavaScript's encodeURIComponent and encodeURI (ECMA-262, "URI Handling
        # Functions") leave !'()* unescaped; WHATWG URLSearchParams (form-urlencoded)
        # leaves * and escapes ~.
        quote(canary, safe=_JS_URI_COMPONENT_SAFE),
        quote(canary, safe=_JS_URI_SAFE),
        quote_plus(canary, safe="*").replace("~", "%7E"),
    }
    encoded |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), e) for e in encoded}
    forms |= encoded
    forms |= _base64_cores(canary.encode("utf-8", "surrogatepass"))
    # Base64 of a JSON document holding the canary (a Kubernetes secret, a JWT claim set,
    # a data: URL) encodes its JSON-escaped form.
    for form in (json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1]):
        if form != canary:
            forms |= _base64_cores(form.encode("utf-8", "surrogatepass"))
    forms |= {
        f.encode("utf-8", "surrogatepass").decode("latin-1") for f in forms if not f.isascii()
    }
    return frozenset(forms)


def load_canaries(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Read a canary file: one value per line; blank lines and ``#`` lines are skipped.

    A line whose first non-blank character is ``#`` is a comment; a ``#`` elsewhere is part
    of the value. Surrounding whitespace is stripped. The file is UTF-8.

    Returns:
        The canaries, in file order, without duplicates.

    Raises:
        ValueError: the file cannot be read or a canary is invalid (:func:`canary_forms`);
            the message gives the path and line number, never the value.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"cannot read canary file {os.fspath(path)!r}: {type(exc).__name__}"
        ) from None
    canaries: dict[str, None] = {}
    for number, line in enumerate(lines, start=1):
        value = line.strip()
        if not value or value.startswith("#"):
            continue
        try:
            canary_forms(value)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}:{number}: {exc}") from None
        canaries[value] = None
    return tuple(canaries)


def canaries_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Load the canary file named by ``LOOPWATCH_REDACTION_CANARIES``, if set.

    Returns:
        The canaries, or ``()`` when the variable is unset or empty.

    Raises:
        ValueError: as :func:`load_canaries`.
    """
    path = (os.environ if environ is None else environ).get(ENV_CANARIES, "")
    return load_canaries(path) if path else ()


_DEFAULT: dict[str, Redactor] = {}


def default_redactor() -> Redactor:
    """The agent side's redactor: built-in rules plus the canaries named by the environment.

    Cached per value of ``LOOPWATCH_REDACTION_CANARIES``. Never raises (telemetry must not
    break the agent): an unreadable or invalid canary file is logged, without its content,
    and the redactor runs without canaries; the collector still checks them.
    """
    path = os.environ.get(ENV_CANARIES, "")
    redactor = _DEFAULT.get(path)
    if redactor is None:
        try:
            redactor = Redactor(canaries=load_canaries(path) if path else ())
        except ValueError as exc:
            _logger.warning("redaction canaries not loaded: %s", exc)
            redactor = Redactor()
        _DEFAULT[path] = redactor
    return redactor


class Redactor:
    """Applies :class:`RedactionRules` and canaries to text and JSON-like values.

    Thread-safe: configuration is immutable; the internal caches are plain ``set``/``dict``
    whose single operations are atomic. No input value makes it raise.

    Args:
        rules: the rules (default :class:`RedactionRules()`).
        canaries: exact canary values (see :func:`canary_forms`).
        canary_matcher: a faster matcher built from ``canary_forms`` of the same canaries;
            default :class:`RegexCanaryMatcher`.
        trigger_matcher: a multi-substring matcher over :attr:`RedactionRules.triggers`,
            run on the lowercased text, replacing the default pre-filter (one ``in`` test
            per trigger). It must find every occurrence of every trigger.
        hmac_key: turns on HMAC mode: placeholders carry the first 8 hex chars of
            HMAC-SHA256(hmac_key, value). At least 16 bytes.

    Raises:
        ValueError: an invalid canary or an HMAC key shorter than 16 bytes.

    Example:
        >>> text, hits = Redactor().redact_text("postgres://app:s3cret@db:5432/x")
        >>> text, hits
        ('postgres://app:[REDACTED:url_password]@db:5432/x', {'url_password': 1})
    """

    __slots__ = (
        "_argv",
        "_clean",
        "_clean_json",
        "_hmac_key",
        "_key_cache",
        "_matcher",
        "_n_canaries",
        "_placeholders",
        "_trigger_matcher",
        "rules",
    )

    def __init__(
        self,
        rules: RedactionRules | None = None,
        *,
        canaries: Iterable[str] = (),
        canary_matcher: CanaryMatcher | None = None,
        trigger_matcher: CanaryMatcher | None = None,
        hmac_key: bytes | None = None,
    ) -> None:
        self.rules = RedactionRules() if rules is None else rules
        forms: set[str] = set()
        values = tuple(dict.fromkeys(canaries))
        for value in values:
            forms |= canary_forms(value)
        if hmac_key is not None and len(hmac_key) < 16:
            raise ValueError("hmac_key must be at least 16 bytes")
        self._hmac_key = hmac_key
        self._n_canaries = len(values)
        if canary_matcher is None and forms:
            canary_matcher = RegexCanaryMatcher(forms)
        self._matcher = canary_matcher
        self._trigger_matcher = trigger_matcher
        self._placeholders = {name: placeholder(name) for name in self.rules.rule_names}
        # Argument vectors are read as command lines when the rule that reads those is on.
        self._argv = any(c.spans is _cli_password_spans for c in self.rules._compiled)
        self._clean: set[str] = set()
        self._clean_json: dict[str, int] = {}
        self._key_cache: dict[str, bool] = {}

    def __repr__(self) -> str:
        return (
            f"Redactor(rules={len(self.rules.rule_names)} rules, canaries={self._n_canaries}, "
            f"hmac={'on' if self._hmac_key else 'off'})"
        )

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Every rule name a hit can carry (the bounded ``rule`` label set)."""
        return self.rules.rule_names

    def clean_caches(self) -> tuple[Container[str], Mapping[str, bool], int]:
        """What this redactor already knows to be clean, for callers that can skip it.

        Returns:
            ``(strings, keys, max_depth)``: strings that :meth:`redact_value` leaves
            unchanged, key names mapped to False when a value under them is not masked
            and the key text itself is unchanged, and the container nesting bound. A
            JSON-like value (``dict`` with ``str`` keys, ``list``, ``str``, ``int``,
            ``float``, ``bool``, ``None``) whose every string is in ``strings``, every
            key maps to False in ``keys``, and whose containers nest less than
            ``max_depth`` deep is returned unchanged by :meth:`redact_value`. Both are
            live, bounded caches (read-only for the caller; a miss only means "unknown").
        """
        return self._clean, self._key_cache, self.rules.max_json_depth

    def redact_text(self, text: str) -> tuple[str, Hits]:
        """Redact one string (JSON inside it included). Never raises.

        Returns:
            ``(redacted, hits)``; ``redacted is text`` when nothing matched. If the
            caller's stack is too deep to finish, the whole text becomes
            ``[REDACTED:depth]`` (fail closed).
        """
        hits: Hits = {}
        try:
            return self.scrub_text(text, hits), hits
        except RecursionError:
            # No function call here: the stack may have no room left for one.
            return self._placeholders[RULE_DEPTH], {RULE_DEPTH: 1}

    def redact_value(self, value: Any) -> Any:
        """Redact a JSON-like value: ``dict``/``list``/``tuple``/``str``/``bytes``/scalars.

        Copy-on-write: the input is never mutated; an unchanged value is returned as is.
        Mapping values under sensitive keys are replaced whole; strings are scanned (JSON
        inside them included); ``bytes`` are scanned as UTF-8 (Latin-1 if invalid) and stay
        ``bytes``; numbers, booleans and ``None`` pass through, and so do objects of other
        types (serialize them first). Use :meth:`scrub_value` to also get the counts.

        Returns:
            The redacted value; ``[REDACTED:depth]`` if the caller's stack is too deep to
            finish (fail closed). Never raises.
        """
        try:
            return self._walk(value, {}, 0)
        except RecursionError:
            return self._placeholders[RULE_DEPTH]

    def scrub_text(self, text: str, hits: Hits) -> str:
        """Like :meth:`redact_text`, adding counts by rule to ``hits`` (hot path).

        Raises:
            RecursionError: only if the caller's stack is nearly exhausted; the caller
                decides how to fail closed.
        """
        return self._scrub_str(text, hits, 0)

    def scrub_value(self, value: Any, hits: Hits) -> Any:
        """Like :meth:`redact_value`, adding counts by rule to ``hits`` (hot path).

        Raises:
            RecursionError: as :meth:`scrub_text`.
        """
        return self._walk(value, hits, 0)

    def _placeholder(self, rule: str, secret: str) -> str:
        if self._hmac_key is None:
            return self._placeholders[rule]
        digest = hmac.new(self._hmac_key, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return placeholder(rule, digest.hexdigest()[:HMAC_TAG_HEX_CHARS])

    def _own_placeholder(self, text: str) -> bool:
        # A placeholder this redactor writes: the syntax, and one of its rule names.
        match = _PLACEHOLDER_RE.fullmatch(text)
        return match is not None and match.group(1) in self._placeholders

    def _key_sensitive(self, key: str, *, remember: bool = True) -> bool:
        # The cache doubles as "this key text is clean": only keys that redaction left
        # unchanged are remembered, so a cached key skips the scan as well.
        cached = self._key_cache.get(key)
        if cached is None:
            cached = self.rules.key_is_sensitive(key)
            if remember:
                if len(self._key_cache) >= _KEY_CACHE_MAX_ENTRIES:
                    self._key_cache.clear()
                self._key_cache[key] = cached
        return cached

    def _scrub_str(self, text: str, hits: Hits, depth: int) -> str:
        if text in self._clean or self._clean_json.get(text, -1) == depth:
            return text
        out = self._scrub_once(text, hits, depth)
        if out is text:
            return text
        # A replacement can change a neighbour's boundary; iterate to a fixed point so that
        # redacting twice equals redacting once.
        for _ in range(_FIXPOINT_PASSES):
            again = self._scrub_once(out, hits, depth)
            if again == out:
                return out
            out = again
        hits[RULE_DEPTH] = hits.get(RULE_DEPTH, 0) + 1
        return self._placeholder(RULE_DEPTH, text)

    def _gate(self, text: str) -> set[int] | None:
        if self._trigger_matcher is not None:
            lowered = text.lower()
            found = self._trigger_matcher.find_spans(lowered)
            if not found:
                return None
            index = self.rules._trigger_index
            return set().union(*(index[lowered[a:b]] for a, b in found))
        fired: set[int] | None = None
        for trigger, indices in self.rules._cs_triggers:
            if trigger in text:
                fired = set(indices) if fired is None else fired | indices
        if self.rules._ci_triggers:
            lowered = text.lower()
            for trigger, indices in self.rules._ci_triggers:
                if trigger in lowered:
                    fired = set(indices) if fired is None else fired | indices
        return fired

    def _scrub_once(self, text: str, hits: Hits, depth: int) -> str:
        rules = self.rules
        json_like = rules.parse_json_strings and _looks_like_json(text)
        # JSON text that the walk will decode needs no decoded view of its \u escapes.
        canary = (
            self._find_canaries(text, escapes=not json_like) if self._matcher is not None else []
        )
        fired: set[int] | None = None
        if not (
            rules._alnum_lower_safe
            and (
                len(text) < _MIN_SECRET_CHARS
                or (text.isalnum() and (text.islower() or text.isdigit()))
            )
        ):
            fired = self._gate(text)
        # JSON escapes (\u0070assword, \/) can hide a trigger from the raw-text gate.
        escaped = json_like and "\\" in text
        if not canary and fired is None and not escaped:
            self._remember_clean(text)
            return text
        if json_like and depth < rules.max_json_depth:
            dropped: list[Any] = []
            parsed = _parse_json(text, dropped)
            if parsed is _TOO_DEEP:
                if escaped:
                    # Too deep for the parser, and escapes (\u0061) can hide a canary or
                    # a secret from the raw-text scan: fail closed.
                    return self._depth_placeholder(text, hits)
            elif parsed is not None:
                local: Hits = {}
                new = self._walk(parsed, local, depth + 1)
                if dropped:
                    # Duplicate keys: the parse kept the last value of each, so the walk
                    # never saw the others. Re-serialize (what a last-wins reader sees),
                    # and let a canary among the dropped values still raise the signal.
                    out = _dump_json(new)
                    found = sum(self._count_canaries(v, depth + 1) for v in dropped)
                    if found:
                        local[RULE_CANARY] = local.get(RULE_CANARY, 0) + found
                else:
                    out = text if new is parsed else _dump_json(new)
                if out is text and not local and not canary:
                    self._remember_clean_json(text, depth)
                for rule, count in local.items():
                    hits[rule] = hits.get(rule, 0) + count
                if canary and self._matcher is not None:
                    # A canary written across JSON structure survives the walk.
                    rest = self._find_canaries(out)
                    if rest:
                        out = self._replace(out, rest, None, hits)
                return out
        elif escaped:
            # JSON text at the depth bound is a container past it (fail closed, as
            # _too_deep): its escapes could hide a canary or secret from the text scan.
            return self._depth_placeholder(text, hits)
        if json_like and self._matcher is not None and "\\u" in text:
            # Not JSON after all (or too deep to parse): read its escapes as text does.
            canary = _unescaped_canary_spans(self._matcher, text, canary)
        out = self._replace(text, canary, fired, hits)
        if out is text and not json_like:
            self._remember_clean(text)
        return out

    def _find_canaries(self, text: str, *, escapes: bool = True) -> list[tuple[int, int]]:
        """Canary spans in ``text``, also those broken by line breaks (``_FOLD_RE``).

        Rule: a canary form split by line breaks (and the indentation after them) or by
        invisible characters (``_INVISIBLE_RE``) is still that form, so MIME-wrapped
        base64 of a canary, a canary in a folded header or in a wrapped log line is found.
        The span reported covers the breaks inside it. With ``escapes``, a canary written
        with JSON ``\\uXXXX`` escapes is found as well (``_unescaped_canary_spans``).
        """
        assert self._matcher is not None
        found = self._matcher.find_spans(text)
        if (
            "\n" in text
            or "\r" in text
            or "\\n" in text
            or "\\r" in text
            or (not text.isascii() and _INVISIBLE_RE.search(text) is not None)
        ):
            found = _wrapped_canary_spans(self._matcher, text, found)
        if escapes and "\\u" in text:
            found = _unescaped_canary_spans(self._matcher, text, found)
        return found

    def _remember_clean(self, text: str) -> None:
        if len(text) <= _CLEAN_CACHE_MAX_CHARS:
            if len(self._clean) >= _CLEAN_CACHE_MAX_ENTRIES:
                self._clean.clear()
            self._clean.add(text)

    def _remember_clean_json(self, text: str, depth: int) -> None:
        # Keyed by depth, and only that depth is trusted: the walk of the same text from
        # another depth meets the depth limit elsewhere and can take the raw-text path
        # for nested JSON, so its result may differ.
        if len(text) <= _JSON_CLEAN_CACHE_MAX_CHARS:
            if len(self._clean_json) >= _JSON_CLEAN_CACHE_MAX_ENTRIES:
                self._clean_json.clear()
            self._clean_json[text] = depth

    def _replace(
        self, text: str, canary: list[tuple[int, int]], fired: set[int] | None, hits: Hits
    ) -> str:
        spans: list[tuple[int, int, int]] = [(a, b, -1) for a, b in canary]
        rules = self.rules
        if fired:
            for index in sorted(fired):
                if index == rules._key_index:
                    continue
                crule = rules._compiled[index]
                if crule.spans is not None:
                    found: Iterable[tuple[int, int]] = crule.spans(text, crule.regex)
                elif crule.is_assignment:
                    found = [
                        match.span(crule.secret_group)
                        for match in crule.regex.finditer(text)
                        if self._assignment_key_sensitive(text, match)
                        and not _closes_a_string(text, match)
                    ]
                else:
                    group = crule.secret_group
                    found = [match.span(group) for match in crule.regex.finditer(text)]
                for start, end in found:
                    if start < 0 or end <= start or not self._redactable(text[start:end]):
                        continue
                    spans.append((start, end, index))
        if spans and PLACEHOLDER_PREFIX in text:
            spans = _outside_placeholders(text, spans, self._placeholders)
        if not spans:
            return text
        spans.sort()
        pieces: list[str] = []
        position = 0
        cur_start, cur_end, cur_rule = spans[0]
        for start, end, rule in spans[1:]:
            if start < cur_end:
                cur_end = max(cur_end, end)
                cur_rule = min(cur_rule, rule)
                continue
            position = self._emit(text, pieces, position, (cur_start, cur_end, cur_rule), hits)
            cur_start, cur_end, cur_rule = start, end, rule
        position = self._emit(text, pieces, position, (cur_start, cur_end, cur_rule), hits)
        pieces.append(text[position:])
        return "".join(pieces)

    def _redactable(self, secret: str) -> bool:
        """Whether a rule's match is replaced: not a placeholder of ours (redacting twice
        equals once), nor an allowed value."""
        if secret.startswith(PLACEHOLDER_PREFIX) and self._own_placeholder(secret):
            return False
        allowed = self.rules._allowed
        return not (allowed and any(p.fullmatch(secret) for p in allowed))

    def _emit(
        self, text: str, pieces: list[str], position: int, span: tuple[int, int, int], hits: Hits
    ) -> int:
        start, end, rule_index = span
        name = RULE_CANARY if rule_index < 0 else self.rules._compiled[rule_index].name
        hits[name] = hits.get(name, 0) + 1
        pieces.append(text[position:start])
        pieces.append(self._placeholder(name, text[start:end]))
        return end

    def _assignment_key_sensitive(self, text: str, match: re.Match[str]) -> bool:
        # The regex anchors on the sensitive word; the whole key ("db_password",
        # "next_page_token") decides, with the same semantics as the key-name rule.
        start = match.start()
        floor = max(0, start - _KEY_LOOKBACK_CHARS)
        while start > floor and text[start - 1] in _KEY_CHARS:
            # "%26password", "%2526password": a URL-encoded separator ends the key. The
            # cheap test first: this walk runs on every assignment match.
            if "%" in text[max(0, start - 5) : start] and (
                _PERCENT_ESCAPE_RE.fullmatch(text, max(0, start - 3), start)
                or _PERCENT_ESCAPE_RE.fullmatch(text, max(0, start - 5), start)
            ):
                break
            start -= 1
        if start >= 1 and text[start - 1] == "\\" and text[start] in "nrt":
            start += 1  # "DEBUG=1\npassword=x" written with escapes: the key is "password"
        end = match.start()
        while end < len(text) and text[end] in _KEY_CHARS:
            end += 1
        # A flag's dashes are not part of its name: "--page-token" is "page_token".
        return self._key_sensitive(text[start:end].lstrip("-"), remember=False)

    def _walk(self, value: Any, hits: Hits, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return self._scrub_str(value, hits, depth)
        if kind is dict:
            if depth >= self.rules.max_json_depth:
                return self._too_deep(value, hits)
            return self._walk_dict(value, hits, depth)
        if kind is list or kind is tuple:
            if depth >= self.rules.max_json_depth:
                return self._too_deep(value, hits)
            return self._walk_sequence(value, hits, depth)
        if kind is bytes:
            return self._scrub_bytes(value, hits, depth)
        if kind is int or kind is float or kind is bool or value is None:
            return value
        # Subclasses and look-alikes: handled rather than passed through unscanned.
        if isinstance(value, str):
            return self._scrub_str(str(value), hits, depth)
        if isinstance(value, Mapping):
            return self._walk(dict(value), hits, depth)
        if isinstance(value, (list, tuple)):
            return self._walk(list(value), hits, depth)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._scrub_bytes(bytes(value), hits, depth)
        return value

    def _walk_sequence(self, value: list[Any] | tuple[Any, ...], hits: Hits, depth: int) -> Any:
        new: list[Any] | None = None
        for index, item in enumerate(value):
            scrubbed = self._walk(item, hits, depth + 1)
            if new is None and scrubbed is not item:
                new = list(value[:index])
            if new is not None:
                new.append(scrubbed)
        if self._argv and len(value) >= 2 and all(type(item) is str for item in value):
            argv = self._scrub_argv(new if new is not None else value, hits)
            if argv is not None:
                new = argv
        if new is None:
            return value
        return new if type(value) is list else tuple(new)

    def _scrub_argv(self, items: Sequence[str], hits: Hits) -> list[str] | None:
        """``items`` with the passwords of an argument vector replaced (rule
        ``cli_password_flag``: ``["redis-cli", "-a", "pw"]``), or ``None`` if none."""
        found = _argument_list_spans(items)
        if not found:
            return None
        out = list(items)
        changed = False
        for index, spans in found.items():
            item = out[index]
            pieces: list[str] = []
            position = 0
            for start, end in sorted(spans):
                secret = item[start:end]
                if start < position or not self._redactable(secret):
                    continue
                pieces += (item[position:start], self._placeholder(RULE_CLI_PASSWORD_FLAG, secret))
                position = end
                hits[RULE_CLI_PASSWORD_FLAG] = hits.get(RULE_CLI_PASSWORD_FLAG, 0) + 1
            if pieces:
                pieces.append(item[position:])
                out[index] = "".join(pieces)
                changed = True
        return out if changed else None

    def _walk_dict(self, value: dict[Any, Any], hits: Hits, depth: int) -> Any:
        # Hot path of the collector: one cache lookup per key and per string value.
        clean = self._clean
        known_keys = self._key_cache
        new: dict[Any, Any] | None = None
        for index, (key, item) in enumerate(value.items()):
            new_key = key
            sensitive = known_keys.get(key)
            if sensitive is None:
                if type(key) is str:
                    new_key = self._scrub_str(key, hits, depth)
                    sensitive = self._key_sensitive(key, remember=new_key is key)
                else:
                    sensitive = False
            if sensitive:
                scrubbed = self._mask(item, hits, depth)
            else:
                kind = type(item)
                if kind is str:
                    scrubbed = item if item in clean else self._scrub_str(item, hits, depth + 1)
                elif kind is int or kind is bool or kind is float:
                    scrubbed = item
                else:
                    scrubbed = self._walk(item, hits, depth + 1)
            if new is None and (scrubbed is not item or new_key is not key):
                new = dict(islice(value.items(), index))
            if new is not None:
                new[new_key] = scrubbed
        return value if new is None else new

    def _too_deep(self, value: Any, hits: Hits) -> str:
        if self._matcher is not None:
            self._count_cut_canaries(value, hits)
        hits[RULE_DEPTH] = hits.get(RULE_DEPTH, 0) + 1
        return self._placeholder(RULE_DEPTH, _canonical(value) if self._hmac_key else "")

    def _depth_placeholder(self, text: str, hits: Hits) -> str:
        if self._matcher is not None:
            self._count_cut_canaries(text, hits)
        hits[RULE_DEPTH] = hits.get(RULE_DEPTH, 0) + 1
        return self._placeholder(RULE_DEPTH, text)

    def _count_cut_canaries(self, value: Any, hits: Hits) -> None:
        # What a depth placeholder replaces is not walked, but a canary in it must still
        # raise the signal: count the canaries in its strings, keys and bytes, without
        # recursion (it is deep by definition).
        found = 0
        stack = [value]
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind is str or kind is bytes:
                text = item if kind is str else item.decode("latin-1")
                if len(text) >= MIN_CANARY_CHARS:
                    found += _merged_count(self._find_canaries(text))
            elif kind is dict:
                stack.extend(item.keys())
                stack.extend(item.values())
            elif kind is list or kind is tuple:
                stack.extend(item)
        if found:
            hits[RULE_CANARY] = hits.get(RULE_CANARY, 0) + found

    def _scrub_bytes(self, value: bytes, hits: Hits, depth: int) -> bytes:
        try:
            text, encoding = value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            # Latin-1 maps bytes 1:1 to code points, so canary forms (which include the
            # Latin-1 reading of their UTF-8 bytes) and ASCII patterns still match.
            text, encoding = value.decode("latin-1"), "latin-1"
        scrubbed = self._scrub_str(text, hits, depth)
        return value if scrubbed is text else scrubbed.encode(encoding, "surrogatepass")

    def _mask(self, value: Any, hits: Hits, depth: int) -> Any:
        if value is None or value is True or value is False:
            return value
        if isinstance(value, (str, bytes)) and not value:
            return value
        if (
            type(value) is str
            and value.startswith(PLACEHOLDER_PREFIX)
            and self._own_placeholder(value)
        ):
            return value
        if (
            type(value) is bytes
            and value.startswith(PLACEHOLDER_PREFIX.encode())
            and self._own_placeholder(value.decode("ascii", "replace"))
        ):
            return value
        # A canary under a sensitive key must still raise the canary signal.
        found = self._count_canaries(value, depth) if self._matcher is not None else 0
        if found:
            hits[RULE_CANARY] = hits.get(RULE_CANARY, 0) + found
            rule = RULE_CANARY
        else:
            allowed = self.rules._allowed
            if allowed and type(value) is str and any(p.fullmatch(value) for p in allowed):
                return value
            hits[RULE_SENSITIVE_KEY] = hits.get(RULE_SENSITIVE_KEY, 0) + 1
            rule = RULE_SENSITIVE_KEY
        masked = self._placeholder(rule, _canonical(value) if self._hmac_key else "")
        return masked.encode("ascii") if type(value) is bytes else masked

    def _count_canaries(self, value: Any, depth: int) -> int:
        kind = type(value)
        if kind is str:
            local: Hits = {}
            self._scrub_str(value, local, depth)
            return local.get(RULE_CANARY, 0)
        if kind is bytes:
            local = {}
            self._scrub_bytes(value, local, depth)
            return local.get(RULE_CANARY, 0)
        if depth >= self.rules.max_json_depth:
            local = {}
            self._count_cut_canaries(value, local)
            return local.get(RULE_CANARY, 0)
        if kind is dict:
            return sum(
                self._count_canaries(k, depth) + self._count_canaries(v, depth + 1)
                for k, v in value.items()
            )
        if kind is list or kind is tuple:
            return sum(self._count_canaries(v, depth + 1) for v in value)
        return 0


def _wrapped_canary_spans(
    matcher: CanaryMatcher, text: str, found: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Add to ``found`` the canary spans that straddle a line break of ``text``.

    ``text`` is folded (every ``_FOLD_RE`` match removed) and scanned once more;
    a match that crosses a removed break is mapped back onto ``text``. Cost: one regex
    pass, one join and one extra scan, only for text holding a line break.
    """
    parts: list[str] = []
    breaks: list[int] = []  # folded index at which each removed break sat
    removed: list[int] = []  # chars removed up to and including that break
    position = total = 0
    for match in _FOLD_RE.finditer(text):
        start, end = match.span()
        parts.append(text[position:start])
        breaks.append(start - total)
        total += end - start
        removed.append(total)
        position = end
    if not breaks:
        return found
    parts.append(text[position:])
    extra = set(found)
    for start, end in matcher.find_spans("".join(parts)):
        first = bisect.bisect_right(breaks, start)
        last = bisect.bisect_right(breaks, end - 1)
        if first == last:
            continue  # no break inside: already found in the text itself
        original_start = start + (removed[first - 1] if first else 0)
        original_end = end + removed[last - 1]
        extra.add((original_start, original_end))
    return sorted(extra)


def _unescaped_canary_spans(
    matcher: CanaryMatcher, text: str, found: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Add to ``found`` the canary spans written with JSON ``\\uXXXX`` escapes in ``text``.

    Rule: a canary is a canary whatever characters of it a JSON writer escapes (Go's and
    .NET's HTML-safe ``\\u003c``, uppercase hex, escaped letters), also in text that is
    not parsed as JSON. ``text`` is read once more with every BMP escape decoded and
    scanned; a match that covers a decoded escape is mapped back onto ``text``.
    """
    parts: list[str] = []
    marks: list[int] = []  # decoded index of each escaped char
    position = 0
    for match in _U_ESCAPE_RE.finditer(text):
        start = match.start()
        parts.append(text[position:start])
        marks.append(start - 5 * len(marks))
        parts.append(chr(int(match.group(1), 16)))
        position = match.end()
    if not marks:
        return found
    parts.append(text[position:])
    extra = set(found)
    for start, end in matcher.find_spans("".join(parts)):
        first = bisect.bisect_left(marks, start)  # escapes before the match
        last = bisect.bisect_left(marks, end)  # escapes before its end
        if first == last:
            continue  # no escape inside: already found in the text itself
        extra.add((start + 5 * first, end + 5 * last))
    return sorted(extra)


def _merged_count(spans: list[tuple[int, int]]) -> int:
    """How many placeholders ``spans`` would make: overlapping spans count once."""
    count = 0
    reach = -1
    for start, end in sorted(spans):
        if start >= reach:
            count += 1
        reach = max(reach, end)
    return count


def _outside_placeholders(
    text: str, spans: list[tuple[int, int, int]], rule_names: Container[str]
) -> list[tuple[int, int, int]]:
    # Placeholders are atomic: a match that starts or ends inside one is ignored (rule
    # names such as "aws_secret_key" inside a placeholder must not match again). Only
    # placeholders of a rule the redactor has: "[REDACTED:<canary>]" is not one.
    inside = [m.span() for m in _PLACEHOLDER_RE.finditer(text) if m.group(1) in rule_names]
    if not inside:
        return spans
    # Placeholders do not overlap and come sorted: a binary search per match keeps this
    # O((matches + placeholders) log placeholders) on hostile input.
    starts = [p for p, _ in inside]

    def within(pos: int) -> bool:
        i = bisect.bisect_left(starts, pos) - 1
        return i >= 0 and inside[i][0] < pos < inside[i][1]

    return [(a, b, rule) for a, b, rule in spans if not (within(a) or within(b))]


def _looks_like_json(text: str) -> bool:
    if len(text) < 2:
        return False
    first, last = text[0], text[-1]
    if first in " \t\r\n" or last in " \t\r\n":
        stripped = text.strip()
        if len(stripped) < 2:
            return False
        first, last = stripped[0], stripped[-1]
    return (first == "{" and last == "}") or (first == "[" and last == "]")


_TOO_DEEP: Final = object()
"""What :func:`_parse_json` returns for JSON nested deeper than the parser goes."""


class _DuplicateKeys(Exception):
    pass


def _unique_pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(items)
    if len(obj) != len(items):
        raise _DuplicateKeys
    return obj


# One decoder for every parse (json.loads with a hook would build one per call); a
# document with duplicate keys, rare, is parsed again to collect what they shadow.
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def _parse_json(text: str, dropped: list[Any]) -> Any:
    """Parse a JSON object or array; ``None`` if it is not one, :data:`_TOO_DEEP` if the
    parser ran out of stack. The values that duplicate keys shadow (all but the last of
    each key, as ``json.loads`` keeps) are appended to ``dropped``."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            last = {key: index for index, (key, _) in enumerate(items)}
            dropped.extend(v for index, (k, v) in enumerate(items) if last[k] != index)
        return obj

    try:
        try:
            parsed = _DECODER.decode(text)
        except _DuplicateKeys:
            parsed = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        return _TOO_DEEP
    except ValueError:
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def _dump_json(value: Any) -> str:
    try:
        out = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        out.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (legal as \\ud800 escapes in JSON) cannot be UTF-8 encoded
        # downstream; keep them escaped.
        out = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return out


def _canonical(value: Any) -> str:
    if type(value) is str:
        return value
    if type(value) is bytes:
        return value.decode("latin-1")
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    except (ValueError, TypeError, RecursionError):
        return type(value).__name__
