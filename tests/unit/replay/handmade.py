"""A hand-written tau-bench-style chat file (five invented airline runs, two malformed).

Written out by :func:`write_handmade_chat` for the importer tests; it is built here rather
than kept as a data file so nothing in the repository resembles a corpus file (tests that
read real recorded runs take them from ``../shared/corpus``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAME = "handmade-gpt-4o-airline.json"  # the chat importer reads model and domain from it

RUNS: list[dict[str, Any]] = [
    {
        "task_id": 3,
        "trial": 0,
        "reward": 1.0,
        "info": {"source": "user"},
        "traj": [
            {"role": "system", "content": "# Airline Agent Policy"},
            {"role": "user", "content": "Cancel my trip."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a1",
                        "type": "function",
                        "function": {
                            "name": "get_reservation_details",
                            "arguments": '{"reservation_id": "ABC123"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "a1",
                "name": "get_reservation_details",
                "content": '{"status": "booked"}',
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a2",
                        "type": "function",
                        "function": {
                            "name": "cancel_reservation",
                            "arguments": '{"reservation_id": "ABC123"',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "a2",
                "name": "cancel_reservation",
                "content": "Error: reservation ABC123 cannot be cancelled",
            },
            {"role": "assistant", "content": "It cannot be cancelled."},
            {"role": "user", "content": "OK, thanks. ###STOP###"},
        ],
    },
    {
        "task_id": 3,
        "trial": 1,
        "reward": 0.0,
        "info": {},
        "traj": [
            {"role": "system", "content": "# Airline Agent Policy"},
            {"role": "user", "content": "I want a human."},
            {"role": "assistant", "content": "One moment."},
            {"role": "user", "content": "Please."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "b1",
                        "type": "function",
                        "function": {
                            "name": "transfer_to_human_agents",
                            "arguments": '{"summary": "wants a human"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "b1",
                "name": "transfer_to_human_agents",
                "content": "Transferred to a human agent (hand-made fixture).",
            },
        ],
    },
    {
        "task_id": 4,
        "trial": 0,
        "reward": 0.0,
        "info": {},
        "traj": [
            {"role": "system", "content": "# Airline Agent Policy"},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Let me look."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "x1", "type": "function", "function": {"arguments": "{}"}}],
            },
        ],
    },
    {
        "task_id": 9,
        "trial": 3,
        "reward": 0.0,
        "info": {},
        "traj": [
            {"role": "system", "content": "# Airline Agent Policy"},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Could you clarify (0)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (1)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (2)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (3)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (4)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (5)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (6)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (7)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (8)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (9)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (10)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (11)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (12)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (13)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (14)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (15)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (16)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (17)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (18)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (19)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (20)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (21)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (22)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (23)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (24)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (25)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (26)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (27)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (28)?"},
            {"role": "user", "content": "I said hello."},
            {"role": "assistant", "content": "Could you clarify (29)?"},
            {"role": "user", "content": "I said hello."},
        ],
    },
    {
        "task_id": 5,
        "trial": 0,
        "reward": 1.0,
        "info": {},
        "traj": [
            {"role": "system", "content": "# Airline Agent Policy"},
            {"role": "user", "content": "Hi"},
            {"role": "tool", "tool_call_id": "nope", "name": "think", "content": ""},
        ],
    },
]


def write_handmade_chat(folder: Path) -> Path:
    """Write :data:`RUNS` as ``folder / NAME`` (JSON, indented) and return the path."""
    path = folder / NAME
    path.write_text(json.dumps(RUNS, indent=1))
    return path
