"""One colour per stop reason, the same in Streamlit and in Grafana.

The colours are Paul Tol's colour-blind-safe "muted" qualitative scheme, with its pale
grey for ``cancelled`` and one colour of his "vibrant" scheme (orange) for ``error``
(P. Tol, "Colour Schemes", SRON/EPS/TN/09-002, https://personal.sron.nl/~pault/). The
pairs a reviewer must tell apart most, the loop reasons ``repeated_action``,
``action_cycle``, ``repeated_decision`` and ``no_progress``, get rose, purple, teal and
wine: distinct in hue and lightness under deuteranopia, protanopia and tritanopia.

``grafana/generate.py`` writes these into the dashboards' series overrides, and the
dashboard's charts use them through :data:`REASON_COLORS`; no other module spells a stop
reason's colour. Importing this module imports neither Streamlit nor Altair.
"""

from __future__ import annotations

from typing import Final

from loopwatch.instrumentation.outcomes import StopReason

__all__ = ["OTHER_COLOR", "REASON_COLORS"]

REASON_COLORS: Final[dict[str, str]] = {
    StopReason.COMPLETED.value: "#117733",  # green
    StopReason.FINAL_UNVERIFIED.value: "#999933",  # olive
    StopReason.REFUSED.value: "#DDCC77",  # sand
    StopReason.BUDGET_EXHAUSTED.value: "#332288",  # indigo
    StopReason.DEADLINE_EXCEEDED.value: "#88CCEE",  # cyan
    StopReason.REPEATED_ACTION.value: "#CC6677",  # rose
    StopReason.ACTION_CYCLE.value: "#AA4499",  # purple
    StopReason.REPEATED_DECISION.value: "#44AA99",  # teal
    StopReason.NO_PROGRESS.value: "#882255",  # wine
    StopReason.CANCELLED.value: "#BBBBBB",  # grey
    StopReason.ERROR.value: "#EE7733",  # orange (Tol vibrant)
}
"""Stop reason → hex colour, for every member of DESIGN section 2's closed set."""

OTHER_COLOR: Final = "#DDDDDD"
"""A value outside the closed set (an older or newer collector's reason)."""
