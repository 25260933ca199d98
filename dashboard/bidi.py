"""Bidirectional control characters in stored text, made visible and inert.

A right-to-left override (U+202E) or isolate in an agent name, tool name or run id
reorders the text after it wherever it is shown: a Markdown caption, an Altair axis label,
a ``st.dataframe`` cell, a select box option. Every client string is client-controlled
(whoever can post OTLP), so each value the dashboard shows goes through one mapping:
each bidi control becomes U+FFFD, visibly (and so does each lone surrogate, which
Streamlit cannot send at all). :func:`loopwatch.dashboard.ui.escape_md` uses
it for Markdown; charts and tables use :func:`neutralise_frame`.

Only what is shown is mapped: a run id used to open a run (a link's URL, a page link's
query parameter) keeps its stored value, or the link would open nothing.

No Streamlit import (charts use it too).

Example:
    >>> neutralise("tool\\u202elanigiro")
    'tool\\ufffdlanigiro'
"""

from __future__ import annotations

import re
from typing import Final

import pandas as pd

__all__ = ["BIDI_CONTROLS", "REPLACEMENT", "neutralise", "neutralise_frame"]

_BIDI_CLASS: Final = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
BIDI_CONTROLS: Final = re.compile(f"[{_BIDI_CLASS}]")
"""Arabic letter mark, LRM/RLM, embeddings and overrides (U+202A..U+202E), isolates
(U+2066..U+2069)."""

REPLACEMENT: Final = "\ufffd"
"""What each bidi control (and each lone surrogate) becomes."""

_SHOWN_AS_REPLACEMENT: Final = re.compile(f"[{_BIDI_CLASS}\\ud800-\\udfff]")  # and lone surrogates


def neutralise(text: str) -> str:
    """``text`` with every bidi control replaced by U+FFFD, and every lone surrogate.

    A lone surrogate is no Unicode text: Streamlit cannot encode it, so one in a shown
    value (an escaped ``\\udcff`` in a stored JSON argument, which a JSON round trip
    makes a real one) raised ``UnicodeEncodeError`` and cut the rest of the page.
    """
    return _SHOWN_AS_REPLACEMENT.sub(REPLACEMENT, text)


def _cell(value: object) -> object:
    return neutralise(value) if isinstance(value, str) else value


def neutralise_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells (and text column names) are :func:`neutralise`-d.

    Columns that cannot hold text (numbers, booleans, datetimes) are kept as they are;
    non-text values in a text column too.
    """
    out = frame.copy()
    for column in out.columns:
        series = out[column]
        if pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series):
            out[column] = series.map(_cell, na_action="ignore")
    out.columns = [neutralise(c) if isinstance(c, str) else c for c in out.columns]
    return out
