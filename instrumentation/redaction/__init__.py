"""Redaction: the one place loopwatch decides what a secret looks like, and removes it.

The agent side scrubs captured tool arguments and results before they leave the
process; the collector applies the same rules to every field of every span (DESIGN
section 5). Standard library only (agents depend on ``opentelemetry-api`` alone). One
line of defence, not a guarantee: a secret of no known shape under an innocuous key
passes through; plant canaries to measure what leaks. Rules, by precedence:

1. **Canaries** (``_canaries``): values planted on purpose, in every encoded form; a hit
   is the signal that data leaked and wins over every allowlist.
2. **Secret patterns** (``_rules``, command lines read by ``_command_line``): API keys,
   tokens, private keys, passwords in URLs and command lines, ``name=value`` with a
   sensitive name. Only the secret part is replaced (``Bearer [REDACTED:bearer]``).
3. **Key names** (``_rules``): a value under a sensitive key (``db.password``,
   ``apiKey``) in a mapping is replaced whole.

``_redactor`` applies them (:class:`Redactor`); this module re-exports the public names.

Example:
    >>> redactor = Redactor(canaries=["lw-canary-7f3a9c21"])
    >>> redactor.redact_text("curl -H 'Authorization: Bearer abc123def456ghi789jk'")
    ("curl -H 'Authorization: Bearer [REDACTED:bearer]'", {'bearer': 1})
    >>> redactor.redact_value({"db.password": "hunter2", "q": "lw-canary-7f3a9c21"})
    {'db.password': '[REDACTED:sensitive_key]', 'q': '[REDACTED:canary]'}
"""

from __future__ import annotations

from ._canaries import (
    MIN_CANARY_CHARS,
    CanaryMatcher,
    RegexCanaryMatcher,
    canaries_from_env,
    canary_forms,
    load_canaries,
)
from ._redactor import Redactor, default_redactor
from ._rules import (
    BUILTIN_SECRET_RULES,
    DEFAULT_ALLOWED_KEY_NAMES,
    DEFAULT_KEY_NAMES,
    PLACEHOLDER_PREFIX,
    RULE_ASSIGNMENT,
    RULE_CANARY,
    RULE_DEPTH,
    RULE_SENSITIVE_KEY,
    STRUCTURAL_KEYS,
    Hits,
    RedactionRules,
    SecretRule,
    is_placeholder,
    placeholder,
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
