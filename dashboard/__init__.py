"""loopwatch dashboard: a Streamlit app over the collector's read API (DESIGN section 6)."""
