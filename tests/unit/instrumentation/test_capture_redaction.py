"""Captured tool content (``instrumentation._content``): redaction before truncation.

Rule: ``capture_json`` scrubs a value before it cuts it to size, so a canary or key that
straddles the cut is redacted whole instead of exported in part, where neither the agent
nor the collector could recognise it (and the canary count would fall short).
"""

from __future__ import annotations

import json

import pytest
from loopwatch.instrumentation import _content
from loopwatch.instrumentation.redaction import Redactor

CANARY = "LWCANARY-7f3a9c21-Zq"
OPENAI = "sk-" + "T3BlbkFJ" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0"


@pytest.fixture
def redactor(monkeypatch: pytest.MonkeyPatch) -> Redactor:
    redactor = Redactor(canaries=[CANARY])
    monkeypatch.setattr(_content, "_redactor", lambda: redactor.redact_value)
    return redactor


@pytest.mark.parametrize("secret", [CANARY, OPENAI])
@pytest.mark.parametrize("cut", [4, 10, 17])
def test_a_secret_across_the_truncation_point_is_not_exported_in_part(
    redactor: Redactor, secret: str, cut: int
) -> None:
    text = "x" * (_content._MAX_STRING - cut - 1) + " " + secret + " tail" * 10
    for value in ({"q": text}, {text: 1}, [text]):
        out = _content.capture_json(value)
        assert secret[:cut] not in out, "no part of the secret survives the cut"
        assert "[RED" not in out.replace("[REDACTED:canary]", "").replace(
            "[REDACTED:openai_key]", ""
        ), "nor part of a placeholder"
        assert len(out) < len(text), "still truncated"
        json.loads(out)


def test_truncation_never_cuts_a_placeholder(redactor: Redactor) -> None:
    text = "x" * (_content._MAX_STRING - 5) + CANARY
    out = json.loads(_content.capture_json({"q": text}))["q"]
    assert "[REDACTED" not in out or out.count("[REDACTED:canary]") == 1
    assert out.startswith("x" * (_content._MAX_STRING - 5))


def test_the_preview_of_an_oversized_value_holds_no_secret(redactor: Redactor) -> None:
    value = {f"k{i}": f"{i} {CANARY} {OPENAI}" for i in range(2000)}
    out = _content.capture_json(value, max_chars=300)
    assert len(out) <= 300 + 40 and CANARY[:6] not in out and "T3Blbk" not in out


def test_the_placeholder_prefix_is_the_redactions() -> None:
    from loopwatch.instrumentation.redaction import PLACEHOLDER_PREFIX

    assert _content._PLACEHOLDER_PREFIX == PLACEHOLDER_PREFIX


def test_truncation_counts_stay_exact(redactor: Redactor) -> None:
    value = {"s": "a" * 100_000, "l": list(range(100)), "d": {f"k{i}": i for i in range(70)}}
    out = json.loads(_content.capture_json(value))
    assert out["s"] == "a" * _content._MAX_STRING + f"…[+{100_000 - _content._MAX_STRING} chars]"
    assert out["l"] == [*range(64), "…[+36 items]"]
    assert out["d"]["…"] == "[+6 keys]" and len(out["d"]) == 65
