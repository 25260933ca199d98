"""The dashboard's entry file: it only routes (``streamlit run dashboard/app.py``).

Each page also runs on its own (``streamlit run dashboard/views/overview.py``). The source
is read from the environment (see :mod:`loopwatch.dashboard.ui`).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from loopwatch.dashboard.auth import require_login

# Not "pages/": while that folder exists, Streamlit runs the first session after start in
# its pages-directory mode, where a shared /runs or /run?run_id= link is "Page not found".
PAGES = Path(__file__).resolve().parent / "views"

require_login()  # a team's dashboard: no page runs for an anonymous session (auth.py)

# The default page is served at "/" only, yet reserves its own pathname, which is then
# "Page not found". So it takes another pathname, and a hidden page serves the overview at
# /overview (the name a user types, and the one the other pages suggest).
st.navigation(
    [
        st.Page(PAGES / "overview.py", title="Overview", url_path="home", default=True),
        st.Page(PAGES / "overview.py", title="Overview", url_path="overview", visibility="hidden"),
        st.Page(PAGES / "stopped_runs.py", title="Stopped runs", url_path="runs"),
        st.Page(PAGES / "run_view.py", title="Run view", url_path="run"),
        st.Page(PAGES / "tools.py", title="Tools", url_path="tools"),
        st.Page(PAGES / "policy_replay.py", title="Policy replay", url_path="replay"),
    ],
    # In a bar above the page, not a sidebar: the sidebar took 300 of 1440 px, and the
    # tables lost their right-hand columns (issue 28).
    position="top",
).run()
