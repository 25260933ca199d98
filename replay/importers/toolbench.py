"""ToolBench DFSDT answer trees (``data_example/answer/G*_answer/*_DFS_woFilter_w2.json``).

One file is one user query: ``{win, tree: {tree: node}, forward_args,
answer_generation: {query, finish_type, ...}}``. A node is ``{node_type: Thought |
Action | Action Input, description, observation, observation_code, pruned, depth,
children: [...]}``; the root is an empty ``Action Input`` (the initial state). The
depth-first search with backtracking (Qin et al., 2023, "ToolLLM", DFSDT) explores
several attempts in one tree, so each **root-to-leaf path is one run**, numbered in
pre-order: ``run_id`` is ``<file stem>/path-<n>`` (1-based). Paths share prefixes.

Mapping of a path (rules from ``OpenBMB/ToolBench`` ``toolbench/inference/Algorithms/
DFS.py`` and the RapidAPI environment's status codes):

* ``Thought`` nodes are the text of the next agent step (consecutive thoughts joined
  by a blank line); a path ending on thoughts ends with a ``message`` step.
* An ``Action`` node and its ``Action Input`` child are one agent step with one tool
  call: name = the action's ``description``, arguments = the input's ``description``
  decoded as JSON (the raw string when it is not JSON), observation = the input's
  ``observation``. Error flag: the observation's ``"error"`` field is non-empty (read
  with a prefix match because observations longer than the environment's limit are
  cut and end in ``...``); when there is no readable error field, an
  ``observation_code`` of 1, 2 or 5-12 (no such API, bad input, timeout, 404,
  unsubscribed, unauthorised, rate limits, error message, send error).
* ``Finish`` is a pseudo-tool, not a tool call: ``return_type`` ``give_answer`` is the
  ``final`` decision (text: the final answer); ``give_up_and_restart`` is a
  ``refusal`` (the agent declines to answer on this branch and the search backtracks).
* ``recorded_stop``: the Finish ``return_type`` (``give_answer``,
  ``give_up_and_restart``; explicit); else ``single_chain_max_step`` (inferred: the
  leaf's depth reached ``forward_args.single_chain_max_step``, where DFS prunes);
  else ``pruned`` (explicit, the node's flag); else ``None``.
* ``recorded_outcome``: ``success`` for the path that ends in ``give_answer`` when the
  file's ``win`` is true (the search returned that answer); ``unknown`` for a
  ``give_answer`` path when ``win`` is missing; ``failure`` for every other path
  (pruned, given up, cut at the step cap, or in a query whose ``win`` is false).

Size bound: paths share prefixes, so a small file can hold a huge number of long paths
(a 400-node spine ending in 20,000 leaves is 1.3 MB and 8 million path nodes). A tree
yields at most :data:`MAX_PATHS` paths (1,000) and :data:`MAX_PATH_NODES` nodes over all
of its paths (100,000; a shared prefix counts once per path); past either, the rest of
the tree is dropped and one :class:`~loopwatch.replay.trajectory.ImportProblem` naming
``tree.tree`` says how many paths were read. The recorded corpus's largest tree has 38
paths of at most 9 nodes: DFSDT's search budget (200 API calls per query) stays far
below both caps.

Malformed input: a node that is not an object with a ``node_type`` and a ``children``
list is reported as an :class:`~loopwatch.replay.trajectory.ImportProblem` naming its
tree path (``tree.tree.children[0].children[1]``); the paths through it are dropped,
the others still read. A file without ``tree.tree`` raises :class:`ValueError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..trajectory import (
    AGENT,
    FAILURE,
    USER,
    DecisionKindName,
    ImportProblem,
    Step,
    StopKind,
    ToolCall,
    Trajectory,
)
from . import Document
from ._fields import int_or_none, outcome_of

__all__ = ["IMPORTER", "ToolBenchImporter"]

FINISH: Final = "Finish"
GIVE_ANSWER: Final = "give_answer"
_NODE_TYPES: Final = frozenset({"Thought", "Action", "Action Input"})
_FAILURE_CODES: Final = frozenset({1, 2, *range(5, 13)})
_ERROR_FIELD = re.compile(r'^\s*\{\s*"error"\s*:\s*"((?:[^"\\]|\\.)*)"')
_RETURN_TYPE = re.compile(r'"return_type"\s*:\s*"(\w+)"')

MAX_PATHS: Final = 1_000
"""Root-to-leaf paths read from one tree (a malformed node ends its path and counts); the
rest are dropped with a problem."""
MAX_PATH_NODES: Final = 100_000
"""Nodes over all paths read from one tree (a shared prefix counts once per path; a path
ending in a malformed node counts too)."""


class ToolBenchImporter:
    """Reads ToolBench DFSDT answer files; see the module docstring for the mapping."""

    name = "toolbench"

    def matches(self, doc: Document) -> bool:
        """A JSON object whose ``tree.tree`` is an object with a ``node_type``."""
        data = doc.json
        if not isinstance(data, dict):
            return False
        tree = data.get("tree")
        return (
            isinstance(tree, dict)
            and isinstance(tree.get("tree"), dict)
            and "node_type" in tree["tree"]
        )

    def read(self, doc: Document) -> Iterator[Trajectory | ImportProblem]:
        """One trajectory per root-to-leaf path, in pre-order.

        Raises:
            ValueError: the file is not a JSON object with ``tree.tree``.
        """
        source = str(doc.path)
        data = doc.json
        tree = data.get("tree") if isinstance(data, dict) else None
        root = tree.get("tree") if isinstance(tree, dict) else None
        if not isinstance(data, dict) or not isinstance(root, dict):
            raise ValueError("not a ToolBench answer file: no tree.tree object")
        generation = data.get("answer_generation")
        generation = generation if isinstance(generation, Mapping) else {}
        forward = data.get("forward_args")
        forward = forward if isinstance(forward, Mapping) else {}
        max_step = int_or_none(forward.get("single_chain_max_step"))
        win = data.get("win")
        common: dict[str, Any] = {
            "query": generation.get("query"),
            "finish_type": generation.get("finish_type"),
            "win": win,
        }
        count = ended = nodes = 0
        # Each entry links to its parent's entry: a node's path and tree location are
        # built only for the paths that end (bounded by the caps), never per node.
        stack: list[_Frame] = [_Frame(root, None, -1, 1)]
        while stack:
            frame = stack.pop()
            node = frame.node
            problem = _check_node(node)
            if problem is None and node["children"]:
                children = node["children"]
                for position in range(len(children) - 1, -1, -1):
                    stack.append(_Frame(children[position], frame, position, frame.length + 1))
                continue
            # A leaf, or a malformed node, which ends its path as a problem: both count
            # against the caps, or a tree of malformed leaves under a long chain would
            # make one problem (with a location the length of the chain) per leaf.
            if ended >= MAX_PATHS or nodes + frame.length > MAX_PATH_NODES:
                over = (
                    f"more than {MAX_PATHS:,} root-to-leaf paths"
                    if ended >= MAX_PATHS
                    else f"root-to-leaf paths of more than {MAX_PATH_NODES:,} nodes in all"
                )
                malformed = f" and {ended - count} malformed nodes" if ended > count else ""
                yield ImportProblem(
                    source,
                    "tree.tree",
                    f"{over}: read the first {count} paths{malformed}, dropped the rest (the"
                    " cap keeps a small file from expanding into millions of steps)",
                )
                return
            ended += 1
            nodes += frame.length
            if problem is not None:
                yield ImportProblem(source, frame.where(), problem)
                continue
            count += 1
            yield _trajectory(
                source,
                f"{doc.path.stem}/path-{count}",
                frame.path(),
                leaf_where=frame.where(),
                win=win,
                max_step=max_step,
                metadata=common,
            )


@dataclass(frozen=True, slots=True)
class _Frame:
    """A tree node on the walk: its parent's frame, its index there, and its path length
    (nodes from the root, itself included)."""

    node: Any
    parent: _Frame | None
    position: int
    length: int

    def path(self) -> tuple[Mapping[str, Any], ...]:
        """The nodes from the root to this one."""
        nodes: list[Mapping[str, Any]] = []
        frame: _Frame | None = self
        while frame is not None:
            nodes.append(frame.node)
            frame = frame.parent
        return tuple(reversed(nodes))

    def where(self) -> str:
        """This node's location in the file (``tree.tree.children[0].children[1]``)."""
        parts: list[str] = []
        frame: _Frame | None = self
        while frame is not None and frame.parent is not None:
            parts.append(f".children[{frame.position}]")
            frame = frame.parent
        return "tree.tree" + "".join(reversed(parts))


def _check_node(node: Any) -> str | None:
    if not isinstance(node, Mapping):
        return f"node is {type(node).__name__}, not an object"
    kind = node.get("node_type")
    if not isinstance(kind, str) or kind not in _NODE_TYPES:
        return f"unknown node_type {kind!r}"
    if not isinstance(node.get("children"), list):
        return "children is not a list"
    if not isinstance(node.get("description", ""), str):
        return "description is not a string"
    return None


def _trajectory(
    source: str,
    run_id: str,
    path: tuple[Mapping[str, Any], ...],
    *,
    leaf_where: str,
    win: Any,
    max_step: int | None,
    metadata: Mapping[str, Any],
) -> Trajectory:
    steps: list[Step] = []
    query = metadata.get("query")
    if isinstance(query, str):
        steps.append(Step(index=0, actor=USER, decision="message", text=query))
    thoughts: list[str] = []
    finish: str | None = None
    nodes = path[1:]  # the root is the initial state, not a step
    position = 0
    while position < len(nodes):
        node = nodes[position]
        kind = node["node_type"]
        position += 1
        if kind == "Thought":
            thoughts.append(node.get("description", ""))
            continue
        if kind == "Action Input":
            # an input without its Action parent: keep what was observed
            steps.append(_tool_step(len(steps), thoughts, "", node))
            thoughts = []
            continue
        name = node.get("description", "")
        argument_node: Mapping[str, Any] | None = None
        if position < len(nodes) and nodes[position]["node_type"] == "Action Input":
            argument_node = nodes[position]
            position += 1
        if name == FINISH:
            finish = _return_type(argument_node)
            decision: DecisionKindName = "final" if finish == GIVE_ANSWER else "refusal"
            text = _final_text(argument_node)
            if thoughts and text is None:
                text = "\n\n".join(thoughts)
            steps.append(Step(index=len(steps), actor=AGENT, decision=decision, text=text))
        else:
            steps.append(_tool_step(len(steps), thoughts, name, argument_node))
        thoughts = []
    if thoughts:
        steps.append(
            Step(index=len(steps), actor=AGENT, decision="message", text="\n\n".join(thoughts))
        )
    leaf = path[-1]
    depth = int_or_none(leaf.get("depth"))
    stop: str | None
    stop_kind: StopKind = "explicit"
    if finish is not None:
        stop = finish
    elif max_step is not None and depth is not None and depth >= max_step:
        stop, stop_kind = "single_chain_max_step", "inferred"
    elif leaf.get("pruned") in (True, "True", "true"):
        stop = "pruned"
    else:
        stop, stop_kind = None, "inferred"
    verdict = win if finish == GIVE_ANSWER and isinstance(win, bool) else None
    return Trajectory(
        source=source,
        run_id=run_id,
        format=ToolBenchImporter.name,
        steps=tuple(steps),
        recorded_outcome=outcome_of(verdict) if finish == GIVE_ANSWER else FAILURE,
        recorded_stop=stop,
        recorded_stop_kind=stop_kind,
        agent="toolbench-dfsdt",
        metadata={**metadata, "leaf": leaf_where, "leaf_depth": depth},
    )


def _tool_step(index: int, thoughts: list[str], name: str, node: Mapping[str, Any] | None) -> Step:
    if node is None:
        call = ToolCall(name=name, arguments=None)
    else:
        raw = node.get("description", "")
        observation = node.get("observation")
        observation = observation if isinstance(observation, str) else None
        call = ToolCall(
            name=name,
            arguments=_decode_arguments(raw),
            observation=observation,
            error=_is_error(observation, int_or_none(node.get("observation_code"))),
        )
    return Step(
        index=index,
        actor=AGENT,
        decision="tool",
        text="\n\n".join(thoughts) if thoughts else None,
        tool_calls=(call,),
    )


def _decode_arguments(raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw, strict=False)
    except (ValueError, RecursionError):
        return raw


def _is_error(observation: str | None, code: int | None) -> bool:
    if observation is not None:
        match = _ERROR_FIELD.match(observation)
        if match is not None:
            return bool(match.group(1))
    return code in _FAILURE_CODES


def _return_type(node: Mapping[str, Any] | None) -> str:
    if node is None:
        return "unknown"
    raw = node.get("description", "")
    decoded = _decode_arguments(raw)
    if isinstance(decoded, Mapping) and isinstance(decoded.get("return_type"), str):
        return str(decoded["return_type"])
    match = _RETURN_TYPE.search(raw)
    return match.group(1) if match else "unknown"


def _final_text(node: Mapping[str, Any] | None) -> str | None:
    if node is None:
        return None
    decoded = _decode_arguments(node.get("description", ""))
    if isinstance(decoded, Mapping) and isinstance(decoded.get("final_answer"), str):
        return str(decoded["final_answer"])
    return None


IMPORTER: Final = ToolBenchImporter()
"""The ``toolbench`` importer instance the registry loads."""
