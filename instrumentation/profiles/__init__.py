"""Policy profiles shipped with loopwatch (``seed.toml``: the four seed profiles)."""
