"""The ``loopwatch`` command line (DESIGN section 7).

Commands are added by the component that implements them; each imports its component
lazily so ``loopwatch check-policy`` works with the agent-side install plus ``click``.
A missing extra prints the ``pip install`` line to run instead of a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

_HINT = "the loopwatch command needs click: pip install 'loopwatch[cli]'"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 usage or config error)."""
    try:
        from ._commands import cli
    except ImportError as exc:
        if getattr(exc, "name", "") == "click":
            print(_HINT, file=sys.stderr)
            return 2
        raise
    try:
        cli.main(args=argv, prog_name="loopwatch", standalone_mode=True)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
