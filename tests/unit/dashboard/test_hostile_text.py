"""Stored text reaches the dashboard inert: never Markdown, whatever a client sent.

Every string the dashboard shows comes from whoever can post OTLP. Streamlit renders
Markdown (with GFM, math, emoji, colour and icon extensions) in most elements: captions,
headers, info boxes, metric labels and values, expander and page-link labels. Rendered
so, a hostile tool name or stop message loaded an image from another host in the viewer's
browser, showed a phishing link or a fake heading in the stop card (twelve places, found
by a helper session's review; the Chromium side is ``tests/e2e/test_dashboard_hostile.py``).

Here a real collector stores runs whose every string field is :func:`hostile.payload`;
each page renders through ``AppTest`` and every Markdown body it produced is parsed with
markdown-it (CommonMark + GFM tables and strikethrough), which must find text only, and
the text must hold none of the patterns Streamlit's extensions act on after parsing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loopwatch.dashboard.data import DEFAULT_OTLP_URL
from loopwatch.dashboard.ui import code_md, escape_md
from streamlit.testing.v1 import AppTest

from tests.integration.services import start_collector

from . import hostile
from .hostile import MD as _MD
from .hostile import WJ as _WJ
from .hostile import markdown_tokens as _tokens
from .hostile import rendered
from .scenarios import PAGES, open_expanders

_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_BIDI = re.compile(r"[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")

# What Streamlit's extensions find in parsed text, where escapes are already undone:
# GFM autolink literals, emoji and icon shortcodes, colour directives.
_EXTENSION_PATTERNS = {
    "url": re.compile(r"(?i)\b(?:https?|ftp)://"),
    "mailto": re.compile(r"(?i)\b(?:mailto|xmpp):[\w.+-]+@[\w-]+\."),
    "www": re.compile(r"(?i)\bwww\."),
    "email": re.compile(r"[\w.+-]@[\w-]+\."),
    "shortcode": re.compile(r":(?!\d+:)[\w/+-]+:"),  # not a time of day
    "directive": re.compile(r":[a-z]+\["),
}
# Block and inline constructs stored text must never open (our own text uses **bold**
# labels and bullet lists; data-made emphasis is caught by its marker words).
_FORBIDDEN_TOKENS = {
    "image",
    "link_open",
    "html_inline",
    "html_block",
    "heading_open",
    "code_block",
    "fence",
    "table_open",
    "s_open",
    "blockquote_open",
    "hr",
}


def problems(source: str) -> list[str]:
    """What in ``source`` (a Markdown body) is not plain text made from stored data."""
    found = []
    if _BIDI.search(source):
        found.append("bidi control")
    for token in _tokens(source):
        if token.type in _FORBIDDEN_TOKENS:
            found.append(token.type)
        if token.type in ("text", "code_inline"):
            content = token.content.replace(DEFAULT_OTLP_URL, "")  # our own, in empty_state
            found += [name for name, rx in _EXTENSION_PATTERNS.items() if rx.search(content)]
    if _bare_dollar(source):
        found.append("math")  # remark-math reads the source: an unescaped $ opens it
    # Emphasis the data opened: its first text is the payload's BOLD-/EM- word (a label
    # the page itself sets in bold may hold data, escaped).
    previous = ""
    for token in _tokens(source):
        if previous in ("strong_open", "em_open") and token.content.startswith(("BOLD-", "EM-")):
            found.append("data-made emphasis")
        previous = token.type
    return found


def _bare_dollar(source: str) -> bool:
    """Whether ``source`` has a ``$`` outside backslash escapes and code spans (where
    remark-math, which reads the source, would open a formula)."""
    i = 0
    while i < len(source):
        c = source[i]
        if c == "\\":
            i += 2
        elif c == "`":
            run = len(source[i:]) - len(source[i:].lstrip("`"))
            end = source.find("`" * run, i + run)
            i = i + run if end < 0 else end + run  # unmatched backticks are text
        elif c == "$":
            return True
        else:
            i += 1
    return False


def bodies(at: AppTest) -> list[tuple[str, str]]:
    """``(element, Markdown source)`` of every element that renders Markdown."""
    out: list[tuple[str, str]] = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success"):
        out += [(kind, str(e.value)) for e in getattr(at, kind)]
    for kind in ("title", "header", "subheader"):
        out += [(kind, str(e.value)) for e in getattr(at, kind)]
    for metric in at.metric:
        out += [("metric label", str(metric.label)), ("metric value", str(metric.value))]
    out += [("expander label", str(e.label)) for e in at.expander]
    out += [("page link", str(e.proto.label)) for e in at.get("page_link")]
    return out


@pytest.fixture(scope="module")
def hostile_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("hostile")
    with start_collector(tmp) as collector:
        hostile.feed(f"{collector.otlp_url}", collector.http_url, "127.0.0.1:9")
        yield collector.http_url


def _render(api: str, monkeypatch: pytest.MonkeyPatch, name: str, **query: str) -> AppTest:
    for variable in ("DB", "TOKEN_FILE"):
        monkeypatch.delenv(f"LOOPWATCH_DASHBOARD_{variable}", raising=False)
    monkeypatch.setenv("LOOPWATCH_DASHBOARD_COLLECTOR", api)
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=30)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    # Every row's details and chart too (the run view sends them once opened).
    open_expanders(at)
    assert not at.exception, [e.value for e in at.exception]
    return at


PAYLOAD = hostile.payload("url", "127.0.0.1:9")
VIEWS = [
    ("overview", {"range": "all"}, ("agent", "agent2", "reason", "ev_tool")),
    ("overview", {"range": "all", "agent": PAYLOAD}, ("url",)),
    ("tools", {"range": "all"}, ("tool", "loop_tool")),
    ("stopped_runs", {"range": "all"}, ()),
    (
        "run_view",
        {"run_id": hostile.RUNS["main"], "all": "1"},
        (
            "agent",
            "reason",
            "message",
            "basis",
            "dimension",
            "policy_name",
            "policy_version",
            "mode",
            "ev_tool",
            "ev_detector",
            "detail_key",
            "detail_value",
            "observe_reason",
            "tool",
            "tool2",
            "outcome",
            "decision_type",
            "blocked_by",
            "error_type",
            "failure_class",
            "result",
        ),
    ),
    ("run_view", {"run_id": hostile.RUNS["loop"], "all": "1"}, ("loop_tool", "agent2")),
    ("run_view", {"run_id": hostile.RUNS["setext"]}, ()),
    ("run_view", {"run_id": PAYLOAD}, ("url",)),
]


@pytest.mark.parametrize(
    ("name", "query", "fields"), VIEWS, ids=[f"{v[0]}-{i}" for i, v in enumerate(VIEWS)]
)
def test_stored_text_renders_as_text(
    hostile_api: str,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    query: dict[str, str],
    fields: tuple[str, ...],
) -> None:
    at = _render(hostile_api, monkeypatch, name, **query)
    found = {
        f"{kind}: {source[:120]!r}": issues
        for kind, source in bodies(at)
        if hostile.MARK in source and (issues := problems(source))
    }
    assert not found, found
    # Not vacuous: each field the page shows is there, as text.
    text = "\n".join(rendered(source) for _, source in bodies(at))
    missing = [f for f in fields if f"{hostile.MARK}-{f}" not in text]
    assert not missing, missing


# A bidi control as a table, chart or option sends it: raw UTF-8 (Arrow data, option
# labels) or a JSON escape (a Vega-Lite spec).
_BIDI_CHARS = (
    "\u061c\u200e\u200f"
    + "".join(map(chr, range(0x202A, 0x202F)))
    + "".join(map(chr, range(0x2066, 0x206A)))
)
_BIDI_ESCAPED = re.compile(rb"(?i)\\u(?:061c|200[ef]|202[a-e]|206[6-9])")


def _shown_elements(at: AppTest) -> list[tuple[str, bytes]]:
    """``(kind, serialized element)`` of every table, chart, select box and code block of
    the page (code blocks show captured tool arguments and results)."""
    out = [("dataframe", e.proto.SerializeToString()) for e in at.dataframe]
    out += [("code", e.proto.SerializeToString()) for e in at.code]
    out += [("chart", e.proto.SerializeToString()) for e in at.get("vega_lite_chart")]
    out += [(f"selectbox {e.label}", e.proto.SerializeToString()) for e in at.selectbox]
    return out


@pytest.mark.parametrize(
    ("name", "query"),
    [(v[0], v[1]) for v in VIEWS] + [("run_view", {"run_id": hostile.RUNS["bidi_id"]})],
    ids=[f"{v[0]}-{i}" for i, v in enumerate(VIEWS)] + ["run_view-bidi-id"],
)
def test_tables_charts_and_options_show_bidi_controls_visibly(
    hostile_api: str, monkeypatch: pytest.MonkeyPatch, name: str, query: dict[str, str]
) -> None:
    """A U+202E in a name reversed the rest of its chart label or table cell (escape_md
    covered Markdown only): every value a table, chart or select box shows has its bidi
    controls as U+FFFD, as in Markdown."""
    at = _render(hostile_api, monkeypatch, name, **query)
    shown = _shown_elements(at)
    found = [
        kind
        for kind, raw in shown
        if _BIDI_ESCAPED.search(raw) or any(c.encode() in raw for c in _BIDI_CHARS)
    ]
    assert not found, found
    if query.get("run_id") != PAYLOAD:  # not vacuous: the hostile names are there
        assert any("\ufffd".encode() in raw for _, raw in shown), [k for k, _ in shown]


def test_a_run_id_with_a_bidi_control_still_opens_from_its_links(
    hostile_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs table shows the id with U+FFFD; its link and the "Open run view" picker
    carry the stored id, so they open the run."""
    stored = hostile.RUNS["bidi_id"]
    at = _render(hostile_api, monkeypatch, "stopped_runs", range="all")
    table = at.dataframe[0].value
    links = {
        unquote(url.split("run_id=", 1)[1]): shown
        for url, shown in zip(table["run"], table["run_id"], strict=True)
    }
    # Shown without the prefix the listed ids share, the control made visible.
    assert links[stored] and stored.replace("\u202e", "\ufffd").endswith(links[stored])
    assert "\u202e" not in links[stored]
    at.selectbox(key="runs_pick").set_value(stored).run()
    # Outside the router the link is a Markdown link to the run view's URL.
    opens = [
        m.group(1) for e in at.markdown if (m := re.search(r"\]\(run\?run_id=([^)&]*)", e.value))
    ]
    assert [unquote(o) for o in opens] == [stored]
    opened = _render(hostile_api, monkeypatch, "run_view", run_id=stored)
    assert any(s.value.startswith("Stop: ") for s in opened.subheader)


def test_a_line_break_in_a_name_cannot_make_a_heading(
    hostile_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _render(hostile_api, monkeypatch, "run_view", run_id=hostile.RUNS["setext"])
    sources = [source for _, source in bodies(at) if hostile.MARK in source]
    assert sources
    for source in sources:
        assert "\n" not in source.split(hostile.MARK, 1)[1][:80]
        assert not problems(source), source
    assert any("Stop reason: completed ===" in rendered(s) for s in sources)


# ---------------------------------------------------------------- the escapers


def _shown(text: str) -> str:
    """What a reader should see of stored ``text``: one line, bidi controls as U+FFFD."""
    return _BIDI.sub("\ufffd", _BREAKS.sub(" ", text)).replace(_WJ, "")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_escaped_text_parses_to_itself_on_one_line(text: str) -> None:
    blocks = _MD.parse(escape_md(text))
    assert [b.type for b in blocks] in (
        [],
        ["paragraph_open", "inline", "paragraph_close"],
    ), [b.type for b in blocks]
    inline = blocks[1].children if blocks else []
    assert all(t.type == "text" for t in inline or ()), [t.type for t in inline or ()]
    shown = "".join(t.content for t in inline or ()).replace(_WJ, "")
    assert shown == " ".join(_shown(text).split())


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1))
def test_code_span_holds_the_whole_value(text: str) -> None:
    tokens = _MD.parseInline(code_md(text))[0].children or []
    assert [t.type for t in tokens] == ["code_inline"], [t.type for t in tokens]
    shown = tokens[0].content.replace(_WJ, "")
    expected = _shown(text).replace("`", "'")
    # CommonMark strips one space from both ends of a span that has one on each side.
    assert shown in (expected, expected[1:-1])
    assert not any(rx.search(tokens[0].content) for rx in _EXTENSION_PATTERNS.values())


@pytest.mark.parametrize(
    "name", ["mcp:files/read", "agent@v2", "ns::lookup", "a/b:c", "db.query", "email@"]
)
def test_names_without_a_markdown_pattern_copy_as_stored(name: str) -> None:
    """The word joiner is copied with the text (and pasted into a filter, it matched
    nothing); it goes only where a shortcode, directive or autolink could start."""
    assert _WJ not in escape_md(name) and _WJ not in code_md(name)
    assert rendered(escape_md(name)) == name
    assert rendered(code_md(name)) == name


@pytest.mark.parametrize(
    "text",
    [
        hostile.payload("x", "127.0.0.1:9"),
        hostile.setext_agent(),
        "http://2130706433/login www.evil.example bob@evil.example mailto:a@b.c",
        ":warning: :material/verified: :red[x] :rainbow[y] $x^2$ $$y$$",
        "&copy; &#91; <b>x</b> <img src=x onerror=alert(1)>",
        "a\r\nb\u2028c\u0085d\te\x00f",
        "    four leading spaces make a code block",
        "support-bot\u202e reversed \u2066isolate\u2069 \u200fmark",
    ],
)
def test_escaped_text_opens_nothing(text: str) -> None:
    assert problems(escape_md(text)) == []
    assert problems(code_md(text)) == []
    assert problems(f"- **label**: {code_md(text)}") == []


def test_problems_finds_what_unescaped_text_opens() -> None:
    """The checker itself: each construct of the payload is caught when not escaped."""
    found = set(problems(hostile.payload("x", "127.0.0.1:9")))
    assert {"image", "link_open", "heading_open", "data-made emphasis"} <= found
    assert {"url", "www", "email", "shortcode", "directive", "math"} <= found
    assert "mailto" in problems("write to mailto:bob@evil.example")
    assert "data-made emphasis" in problems("a **BOLD-x** b")
    assert "data-made emphasis" not in problems(f"**label {escape_md('**BOLD-x**')}**")
    assert "heading_open" in problems(hostile.setext_agent())
    assert "code_block" in problems(hostile.setext_agent())


def test_a_run_id_pasted_with_word_joiners_still_opens(
    hostile_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text copied from an escaped page can carry U+2060; the run id box drops it."""
    pasted = hostile.RUNS["main"].replace("-", "-" + _WJ)
    at = _render(hostile_api, monkeypatch, "run_view", run_id=pasted)
    assert not at.warning or all("No run with id" not in w.value for w in at.warning)
    assert any(s.value.startswith("Stop: ") for s in at.subheader)


def test_an_empty_value_is_its_own_code_span() -> None:
    """Two backticks are not an empty span: they paired with the next span and swallowed
    the text between (an empty policy name ate "version" in the run header)."""
    line = f"policy {code_md('')} version {code_md('')} mode {code_md(None)}"
    tokens = _MD.parseInline(line)[0].children or []
    assert [t.content for t in tokens if t.type == "code_inline"] == ['""', '""', "?"]
    assert rendered(line) == 'policy "" version "" mode ?'
