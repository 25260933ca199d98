"""Streamlit glue shared by the pages: the source, cached reads, errors, filters, links.

Pages hold no SQL and no HTTP (STYLE rule 15): they call the cached readers here, which
call a :class:`~loopwatch.dashboard.data.DataSource`. Caching is at this edge:
``st.cache_resource`` holds one source per configuration, ``st.cache_data`` keeps each
answer for :data:`TTL_SECONDS`.

The source comes from the environment of the Streamlit process (set by
:func:`loopwatch.dashboard.cli.run_dashboard`): ``LOOPWATCH_DASHBOARD_DB`` (a DuckDB file,
read-only) or ``LOOPWATCH_DASHBOARD_COLLECTOR`` (default ``http://127.0.0.1:9464``), and
``LOOPWATCH_DASHBOARD_TOKEN_FILE``.

Errors never reach the page as a traceback: :func:`call` shows
:class:`~loopwatch.dashboard.data.SourceError` messages with ``st.error`` and stops the
script run.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar
from urllib.parse import quote

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from . import frames
from .bidi import neutralise, neutralise_frame
from .config import SourceConfig, open_source
from .data import (
    DEFAULT_OTLP_URL,
    LOOPED_RUNS_LIMIT,
    RUN_TABLE_COLUMNS,
    DataSource,
    Overview,
    QueryFailed,
    RunData,
    RunFilter,
    RunsPage,
    SourceUnavailable,
    ToolsData,
    looped_runs,
)

__all__ = [
    "RANGES",
    "RUN_LINK_COLUMN",
    "RUN_VIEW_PAGE",
    "TTL_SECONDS",
    "TimeRange",
    "cached_looped_runs",
    "cached_overview",
    "cached_run",
    "cached_runs",
    "cached_tools",
    "call",
    "code_md",
    "dataframe",
    "empty_state",
    "escape_md",
    "footer",
    "query_choice",
    "run_id_column",
    "run_link",
    "run_url",
    "runs_table",
    "select_param",
    "setup_page",
    "short_run_ids",
    "source",
    "sync_query_params",
    "text_param",
    "time_range",
]

TTL_SECONDS: Final = 15
"""How long an answer is reused (short: the collector keeps receiving runs)."""

RUN_VIEW_PAGE: Final = Path(__file__).resolve().parent / "views" / "run_view.py"
RUN_VIEW_URL_PATH: Final = "run"
"""The run view's URL path in the app (``/run?run_id=...``)."""

T = TypeVar("T")


_PAGE_CSS: Final = (
    "<style>"
    # Less empty space above the title (6 rem by default, under the top navigation): at
    # 900 px high the run view's last steps must fit without scrolling.
    '[data-testid="stMainBlockContainer"]{padding:3.5rem 2.5rem 2rem 2.5rem}'
    # Figures at a size that fits "observed 95 = limit 95" in half a stop card.
    '[data-testid="stMetricValue"]{font-size:1.5rem}'
    "</style>"
)


def setup_page(title: str) -> None:
    """Page title, the wide layout (the pages are designed for 1280 px and up) and the
    page's style sheet (a style-only ``st.html``, which Streamlit applies without adding
    an element)."""
    st.set_page_config(page_title=f"{title} · loopwatch", layout="wide")
    st.html(_PAGE_CSS)


@st.cache_resource(show_spinner=False)
def _open_source(key: str, _config: SourceConfig) -> DataSource:
    del key
    return open_source(
        collector_url=_config.collector_url,
        db=_config.db,
        token_file=_config.token_file,
        lake=_config.lake,
        lake_data=_config.lake_data,
    )


def _fail(message: str, hint: str | None = None) -> NoReturn:
    st.error(message)
    if hint:
        st.caption(hint)
    st.stop()


def source() -> tuple[DataSource, str]:
    """The configured source and its cache key; shows the error and stops if unavailable."""
    config = SourceConfig.from_env(os.environ)
    try:
        return _open_source(config.key, config), config.key
    except SourceUnavailable as exc:
        _fail(exc.message)
    except ValueError as exc:
        _fail(f"The dashboard's source is misconfigured: {exc}.")


_RETRY_HINT: Final = "Narrow the time range or retry."
_QUERY_HINTS: Final = {
    # The source refused a value the page sent (a filter too long, a malformed id):
    # retrying or a shorter range sends the same value again.
    "bad_parameter": "The source refused a value of this page's filters or URL (too long, "
    "or not a value it accepts): shorten or clear the filter, or fix the URL's query "
    "parameters.",
}


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a reader; on a source error show it with ``st.error`` and stop the run."""
    try:
        return fn(*args, **kwargs)
    except SourceUnavailable as exc:
        _fail(exc.message)
    except QueryFailed as exc:
        _fail(f"The query failed: {exc.message}", _QUERY_HINTS.get(exc.code, _RETRY_HINT))


def footer(src: DataSource) -> None:
    """Where the data comes from."""
    st.caption(f"Data: {src.description}. Figures are refreshed every {TTL_SECONDS} s.")


def empty_state(what: str = "No runs yet.") -> None:
    """Say what to do when there is nothing to show.

    The dashboard reads the collector's read API or a file and cannot know where the
    collector receives OTLP (``--otlp-http``), so the hint names the default as such.
    """
    st.info(
        f"{what} Send spans to the collector: point an OTLP exporter at the collector's "
        f"OTLP endpoint, `/v1/traces` on its `--otlp-http` address ({DEFAULT_OTLP_URL} by "
        "default; for example `loopwatch.instrumentation.otlp.configure_otlp()` in the "
        "agent), then reload this page."
    )


def dataframe(frame: pd.DataFrame, **kwargs: Any) -> None:
    """``st.dataframe(frame, **kwargs)`` with bidi controls in text cells made visible
    (:func:`~loopwatch.dashboard.bidi.neutralise_frame`): a U+202E in a name would
    reverse the rest of its cell. Every table of the pages goes through here."""
    st.dataframe(neutralise_frame(frame), **kwargs)


# -------------------------------------------------------------- cached reads


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False, max_entries=256)
def cached_runs(
    key: str,
    _src: DataSource,
    filters: tuple[Any, ...],
    limit: int,
    offset: int,
) -> RunsPage:
    """:meth:`DataSource.runs`; ``filters`` is ``RunFilter`` fields as a tuple."""
    return _src.runs(RunFilter(*filters), limit=limit, offset=offset)


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False, max_entries=64)
def cached_run(key: str, _src: DataSource, run_id: str) -> RunData | None:
    """:meth:`DataSource.run`."""
    return _src.run(run_id)


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False, max_entries=64)
def cached_overview(
    key: str, _src: DataSource, since: int, until: int, bucket_seconds: int, agent: str | None
) -> Overview:
    """:meth:`DataSource.overview`."""
    return _src.overview(
        since_unix_nano=since, until_unix_nano=until, bucket_seconds=bucket_seconds, agent=agent
    )


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False, max_entries=64)
def cached_tools(key: str, _src: DataSource, since: int, until: int) -> ToolsData:
    """:meth:`DataSource.tools`."""
    return _src.tools(since_unix_nano=since, until_unix_nano=until)


@st.cache_data(ttl=TTL_SECONDS, show_spinner=False, max_entries=64)
def cached_looped_runs(
    key: str, _src: DataSource, tool: str, since: int, until: int
) -> pd.DataFrame:
    """:func:`~loopwatch.dashboard.data.looped_runs`, :data:`~.data.LOOPED_RUNS_LIMIT` rows."""
    return looped_runs(
        _src, tool, since_unix_nano=since, until_unix_nano=until, limit=LOOPED_RUNS_LIMIT
    )


# ----------------------------------------------------------- query params


def query_choice(name: str, allowed: Sequence[str], default: str) -> str:
    """The query parameter ``name`` if it is one of ``allowed``, else ``default``."""
    value = st.query_params.get(name)
    return value if value is not None and value in allowed else default


def select_param(
    label: str,
    options: Sequence[str],
    *,
    param: str,
    default: str,
    key: str,
    on_change: Callable[[], None] | None = None,
    format_func: Callable[[str], str] = neutralise,
) -> str:
    """A selectbox whose initial choice comes from the query parameter ``param``.

    ``key`` must be unique per page: a widget's state does not survive a page switch,
    the URL does. Options are shown through ``format_func`` (default: bidi controls made
    visible, as options are often stored names); the value returned is the option itself.
    """
    choices = list(options)
    initial = query_choice(param, choices, default)
    value = st.selectbox(
        label,
        choices,
        index=choices.index(initial) if initial in choices else 0,
        key=key,
        on_change=on_change,
        format_func=format_func,
    )
    return str(value)


def text_param(
    label: str,
    *,
    param: str,
    key: str,
    on_change: Callable[[], None] | None = None,
    help: str | None = None,
) -> str:
    """A text input whose initial value is the query parameter ``param``; stripped, and
    without word joiners (U+2060), which text copied from an escaped page can carry."""
    value = st.text_input(
        label, value=st.query_params.get(param, ""), key=key, on_change=on_change, help=help
    )
    return (value or "").replace(_WORD_JOINER, "").strip()


def sync_query_params(values: Mapping[str, str | None], defaults: Mapping[str, str]) -> None:
    """Write the page's filters to the URL (shareable), leaving defaults and blanks out."""
    for name, value in values.items():
        if value in (None, "") or value == defaults.get(name):
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != value:
            st.query_params[name] = value


@dataclass(frozen=True, slots=True)
class TimeRange:
    """A time window ``[since, until)`` in ns, its bucket width and its label."""

    key: str
    label: str
    since_unix_nano: int
    until_unix_nano: int
    bucket_seconds: int


RANGES: Final[dict[str, tuple[str, int | None, int]]] = {
    "1h": ("Last hour", 3_600, 60),
    "6h": ("Last 6 hours", 6 * 3_600, 300),
    "24h": ("Last 24 hours", 86_400, 1_800),
    "7d": ("Last 7 days", 7 * 86_400, 6 * 3_600),
    "30d": ("Last 30 days", 30 * 86_400, 86_400),
    "all": ("All time", None, 86_400),
}
"""Range key -> (label, span in seconds or ``None`` for all, bucket seconds)."""

_NS: Final = 1_000_000_000
_ROUND_SECONDS: Final = 10


def time_range(
    *,
    key: str,
    default: str = "24h",
    on_change: Callable[[], None] | None = None,
    now_ns: int | None = None,
) -> TimeRange:
    """A time-range select bound to the ``range`` query parameter.

    ``until`` is rounded up to 10 s so that reruns within those seconds hit the cache.
    """
    choice = select_param(
        "Time range",
        list(RANGES),
        param="range",
        default=default,
        key=key,
        on_change=on_change,
        format_func=lambda k: RANGES[k][0],
    )
    label, span, bucket = RANGES[choice]
    now = time.time_ns() if now_ns is None else now_ns
    step = _ROUND_SECONDS * _NS
    until = math.ceil(now / step) * step
    since = 0 if span is None else until - span * _NS
    return TimeRange(choice, label, since, until, bucket)


# ------------------------------------------------------------------ links


def run_url(run_id: str) -> str:
    """The run view's relative URL for ``run_id`` (works from any page of the app)."""
    return f"{RUN_VIEW_URL_PATH}?run_id={quote(run_id, safe='')}"


def run_link(run_id: str, *, label: str | None = None) -> None:
    """A link to the run view of ``run_id``: in-app when the app routes, else a URL."""
    text = label or f"Open run view: {run_id}"
    try:
        st.page_link(str(RUN_VIEW_PAGE), label=escape_md(text), query_params={"run_id": run_id})
    except StreamlitAPIException:
        st.markdown(f"[{escape_md(text)}]({run_url(run_id)})")


# Every ASCII punctuation character, backslash-escaped: CommonMark allows it for each, and
# each can open a construct (emphasis, links, images, HTML, entities, autolinks, GFM
# tables and strikethrough, remark-math's $...$, remark-directive's :name[...]).
_MD_ESCAPES: Final = str.maketrans({c: "\\" + c for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"})
# Line and paragraph breaks end a paragraph or start a block (setext headings, lists,
# indented code): the text is folded to one line. Other C0/C1 controls go too.
_MD_BREAKS: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_WORD_JOINER: Final = "\u2060"
# Shortcodes (``:warning:``, ``:material/icon:``), colour directives (``:red[``) and GFM
# autolink literals (``http://``, ``www.``, ``user@host.tld``, ``mailto:``) are found in
# the parsed text, where backslash escapes are already undone: a word joiner (U+2060,
# invisible) breaks each where it could start, and nowhere else, since it is copied
# with the text.
_MD_JOIN: Final = re.compile(
    r"(?i):(?=//|[\w/+-]+[:\[])"  # scheme://, :shortcode:, :directive[
    r"|@(?=[\w-]+\.)"  # user@host.tld
    r"|\bwww(?=\.)"  # www.host
)


def _plain(text: object, *, spaces: bool) -> str:
    """``text`` on one line, bidi controls shown as U+FFFD, U+2060 removed (it is ours to
    place); with ``spaces``, runs of white space as one space and no leading or trailing
    space (a label starting with four spaces is a code block)."""
    # Bidi controls reorder the text after them (a name ending in U+202E would reverse the
    # rest of a caption, figures included).
    one_line = neutralise(_MD_BREAKS.sub(" ", str(text))).replace(_WORD_JOINER, "")
    return " ".join(one_line.split()) if spaces else one_line


def escape_md(text: object) -> str:
    """Client text made inert for any element that renders Markdown; ``str -> str``.

    Streamlit renders Markdown, with its GFM, math, emoji, colour and icon extensions,
    in ``st.markdown``/``write``/``caption``/``subheader``/``info``..., in metric values
    and labels, expander and page-link labels. Every name, reason, message or id read
    from the store is client-controlled (whoever can post OTLP), and rendered as
    Markdown it could load a remote image in the viewer's browser, show a phishing link
    or a fake heading inside the stop card. Here:

    - every ASCII punctuation character is backslash-escaped (CommonMark section 2.4);
    - line breaks and control characters fold to a space, white space runs to one
      space, and the ends are stripped, so the text renders as itself on one line;
    - bidirectional controls (U+202A..U+202E, U+2066..U+2069, marks) become U+FFFD;
    - shortcodes, colour directives and autolink literals, which Streamlit finds in the
      parsed text where escapes are already undone, get a word joiner (U+2060,
      invisible) where they would start: after ``:`` before ``//``, ``name:`` or
      ``name[``, after ``@`` before ``host.``, and in ``www.``. Text without such a
      pattern is copied from the page as it was stored.

    ``None`` renders as ``""``. Checked in Chromium against Streamlit 1.67
    (``tests/e2e/test_dashboard_hostile.py``): no image, link, heading, code block,
    emphasis, table, KaTeX, icon, emoji or colour comes from escaped text.
    """
    if text is None:
        return ""
    return _MD_JOIN.sub(_joined, _plain(text, spaces=True)).translate(_MD_ESCAPES)


def _joined(match: re.Match[str]) -> str:
    return match.group() + _WORD_JOINER


def code_md(value: object) -> str:
    """``value`` as inline Markdown code (``?`` for ``None``), inert as :func:`escape_md`.

    One line, and a backtick in it cannot end the span: backslash escapes do not work
    inside code spans, so backticks become ``'``, and line breaks, which would end the
    paragraph and with it the span, fold to a space. Bidi controls and the patterns
    Streamlit rewrites in parsed text are handled as in :func:`escape_md` (its icon pass
    rewrote ``:material/...:`` inside code too).
    """
    text = _plain("?" if value is None else value, spaces=False).replace("`", "'")
    if not text:
        return '`""`'  # an empty span is two backticks, which pair with the next span
    return "`" + _MD_JOIN.sub(_joined, text) + "`"


RUN_LINK_COLUMN: Final = st.column_config.LinkColumn(
    "run", help="Open the run view", display_text=":material/open_in_new:", width=45
)
"""The column of run view URLs (:func:`run_url`), shown as an icon. The run id is shown in a
column of its own, through :func:`dataframe`: as link text it would be taken from the URL
and shown decoded, bidi controls included."""

_ROW_PX: Final = 35  # st.dataframe's row height at the default font size


def table_height(rows: int, *, max_rows: int = 25, row_px: int = _ROW_PX) -> int:
    """Pixels for a table showing up to ``max_rows`` rows and its header, no empty space.

    Streamlit's default shows about 10 rows in a scroll box, however long the page.
    ``row_px``: the table's ``row_height`` (the header keeps its own height).
    """
    return _ROW_PX + row_px * min(max(rows, 1), max_rows) + 3


def short_run_ids(run_ids: Sequence[str]) -> tuple[str, list[str]]:
    """The prefix the listed run ids share, and each id without it (its distinguishing
    part; :func:`~.frames.id_prefix`). The links keep the full ids."""
    ids = [str(r) for r in run_ids]
    prefix = frames.id_prefix(ids)
    return prefix, [r[len(prefix) :] for r in ids]


def run_id_column(prefix: str, *, label: str = "run id") -> Any:
    """The text column of :func:`short_run_ids`' parts; its help names the prefix."""
    shared = f"; every id here starts with {prefix!r}, left out" if prefix else ""
    return st.column_config.TextColumn(
        label,
        help=f"The run id's distinguishing part{shared}. The link on the left and the "
        "picker below hold the full id.",
        width=RUN_ID_WIDTH,
    )


RUN_ID_WIDTH: Final = 215
"""Pixels of the run column: room for a run id's distinguishing part."""

RUNS_TABLE_COLUMNS: Final[dict[str, Any]] = {
    "time": st.column_config.DatetimeColumn("time (UTC)", format="YYYY-MM-DD HH:mm:ss", width=140),
    "agent": st.column_config.TextColumn("agent", width=120),
    "stop_reason": st.column_config.TextColumn("stop reason", width=130),
    "top_tool": st.column_config.TextColumn("tool", help="The tool the run called most", width=200),
    "steps": st.column_config.NumberColumn("steps", width=50),
    "steps_since_progress": st.column_config.NumberColumn(
        "no progress", help="Steps since the last progress evidence, at the stop", width=85
    ),
    "tool_calls": st.column_config.NumberColumn(
        "calls",
        help="Tool results stored for the run, calls the guard blocked included",
        width=50,
    ),
    "tool_errors": st.column_config.NumberColumn("errors", width=52),
    "tool_blocked": st.column_config.NumberColumn("blocked", width=62),
    "canary_detected": st.column_config.CheckboxColumn(
        "canary", help="A registered canary value was found (and redacted)", width=55
    ),
    "sampled": st.column_config.CheckboxColumn(
        "sampled", help="Steps kept by the collector's sampling", width=62
    ),
}
"""Column settings of the runs tables: widths that fit every column at 1440 px."""


def runs_table(runs: pd.DataFrame, *, key: str) -> None:
    """The runs as a sortable table with a link per run, then an "open a run" picker.

    The run column shows each id's distinguishing part (:func:`run_id_column`); the full
    ids are in the links and in the picker below the table.

    Args:
        runs: rows with :data:`~loopwatch.dashboard.data.RUN_TABLE_COLUMNS`.
        key: widget key prefix (unique per page section).
    """
    prefix, parts = short_run_ids(runs["run_id"].astype(str).tolist())
    frame = runs.assign(run=[run_url(r) for r in runs["run_id"]], run_id=parts)
    dataframe(
        frame,
        hide_index=True,
        height=table_height(len(frame)),
        column_order=("run", *RUN_TABLE_COLUMNS),
        column_config={
            "run": RUN_LINK_COLUMN,
            "run_id": run_id_column(prefix),
            **RUNS_TABLE_COLUMNS,
        },
        placeholder="",
    )
    if prefix:
        st.caption(f"Run ids shown without their shared prefix {code_md(prefix)}.")
    ids = runs["run_id"].astype(str).tolist()
    if not ids:
        return
    left, right = st.columns([2, 3], vertical_alignment="bottom")
    with left:
        chosen = st.selectbox("Run", ids, key=f"{key}_pick", format_func=neutralise)
    with right:
        run_link(str(chosen), label="Open run view")
