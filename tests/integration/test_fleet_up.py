"""``loopwatch up --fleet 2 --demo``: PostgreSQL, two collectors shipping to one lake, the
dashboard and the demo start; the demo's runs reach the lake; SIGINT stops every child
process, and the temporary folder goes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from loopwatch.collector.lake.connect import LakeTarget, connect_lake

from .services import _child_env, free_port, loopwatch_command, poll_until


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (by /proc's parent ids)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_up_fleet_runs_ships_and_stops_everything(tmp_path: Path) -> None:
    out_path = tmp_path / "up.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [*loopwatch_command(), "up", "--fleet", "2", "--demo", "--limit", "3",
             "--dashboard-port", str(free_port())],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            start_new_session=True,
        )  # fmt: skip
    try:

        def announced() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"up --fleet exited: {out_path.read_text()}")
            return "Ctrl-C stops the fleet." in out_path.read_text()

        poll_until(
            announced,
            timeout_seconds=240,
            what="the fleet's URLs",
        )
        text = out_path.read_text()
        catalog = re.search(r"^Lake catalog:\s+ducklake:(.+)$", text, re.M)
        data = re.search(r"^Lake data:\s+(\S+)$", text, re.M)
        assert catalog and data, text
        assert text.count("spans exported") == 2, text
        assert re.search(r"^Dashboard:\s+http://127\.0\.0\.1:\d+", text, re.M), text
        target = LakeTarget(catalog.group(1), data.group(1))

        def shipped() -> set[str]:
            con = connect_lake(target, read_only=True)
            try:
                rows = con.execute("SELECT DISTINCT collector_id FROM lake.runs").fetchall()
            finally:
                con.close()
            return {str(r[0]) for r in rows}

        poll_until(
            lambda: shipped() == {"fleet-1", "fleet-2"},
            timeout_seconds=90,
            what="both collectors' demo runs in the lake",
        )
        children = _descendants(proc.pid)
        assert len(children) >= 4, children  # PostgreSQL, two collectors, the dashboard
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0, out_path.read_text()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if _alive(pid)], out_path.read_text()
        assert not Path(data.group(1)).exists(), "the temporary folder is removed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
