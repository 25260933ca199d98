"""Check the loopwatch Grafana folder against what a collector exports.

Reads every PromQL expression of the folder (dashboard panel targets, dashboard template
variables, recording and alerting rules), parses it with a real PromQL parser
(``promql-parser``, the Rust parser used by GreptimeDB, with Python bindings), and checks
that each metric name exists and each label it names (matchers, ``by``/``without``,
``on``/``ignoring``, ``group_left``/``group_right``, ``$labels.x`` in alert templates,
``label_values(..., x)``) is one the metric carries.

The catalog of exported metrics comes from a Prometheus text exposition: the collector's
live ``/metrics`` or the exposition of ``collector/metrics.py`` itself. Prometheus adds
the target labels ``job`` and ``instance`` to every scraped series and writes ``up``.

Usage::

    .venv/bin/python grafana/lint.py --metrics-url http://127.0.0.1:9464/metrics

Exit status 1 and one line per problem when something does not check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "DEFAULT_VARIABLES",
    "GRAFANA_DIR",
    "Catalog",
    "Query",
    "check_folder",
    "dashboard_queries",
    "label_values_query",
    "output_labels",
    "parse",
    "rule_queries",
    "substitute",
]

GRAFANA_DIR = Path(__file__).resolve().parent
TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus attaches to every scraped series (its target labels)."""
PROMETHEUS_METRICS: Mapping[str, frozenset[str]] = {"up": TARGET_LABELS}
"""Series Prometheus writes itself for each target."""

DEFAULT_VARIABLES: Mapping[str, str] = {
    "instance": ".*",
    "agent": ".*",
    "tool": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "datasource": "prometheus",
}
"""Values given to Grafana's template variables before a query is parsed or run:
``$agent``/``$tool`` as the *All* value (``.*``, the variables' ``allValue``), and
interval variables as Grafana would compute them for a short time range."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<selector>.+),\s*)?(?P<label>\w+)\s*\)\s*$")
_TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")


class PromQLError(ValueError):
    """An expression does not parse; the message names where it came from."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the folder.

    Attributes:
        source: where it is written, e.g. ``dashboards/loopwatch-tools.json: panel
            'Blocked calls by tool' target A``.
        expr: the expression as written (template variables not substituted).
        kind: ``panel``, ``variable``, ``record`` or ``alert``.
        instant: whether Grafana runs it as an instant query.
        labels_used: labels named outside the expression (``label_values`` label,
            ``$labels.x`` in alert annotations).
        name: the recording rule's or alert's name (``""`` for dashboard queries).
    """

    source: str
    expr: str
    kind: str
    instant: bool = False
    labels_used: frozenset[str] = frozenset()
    name: str = ""


@dataclass
class Catalog:
    """Exported series names and the labels each carries.

    Attributes:
        series: sample name (``loopwatch_agent_steps_bucket``, ``..._total``) -> labels
            (``le`` included for buckets, target labels included).
    """

    series: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_exposition(cls, text: str) -> Catalog:
        """Build from Prometheus text exposition (e.g. the body of ``/metrics``)."""
        series: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
        catalog = cls({name: frozenset(labels) | TARGET_LABELS for name, labels in series.items()})
        catalog.series.update(PROMETHEUS_METRICS)
        return catalog

    def labels(self, name: str) -> frozenset[str] | None:
        """Labels of series ``name``, None when it is not exported."""
        return self.series.get(name)


# ------------------------------------------------------------------ reading


def _load_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def dashboard_queries(path: Path) -> list[Query]:
    """Every panel target and query variable of one dashboard JSON file.

    Raises:
        ValueError: the file is not JSON (the message names the file).
    """
    try:
        model = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    out: list[Query] = []
    for panel in _panels(model.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" not in target:
                continue
            out.append(
                Query(
                    f"{path.name}: panel {panel.get('title')!r} target {target.get('refId')}",
                    target["expr"],
                    "panel",
                    instant=bool(target.get("instant")),
                )
            )
    for variable in model.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query)
        parsed = label_values_query(text)
        if parsed is None:
            out.append(Query(f"{path.name}: variable {variable['name']}", text, "variable"))
            continue
        selector, label = parsed
        out.append(
            Query(
                f"{path.name}: variable {variable['name']}",
                selector,
                "variable",
                instant=True,
                labels_used=frozenset({label}),
            )
        )
    return out


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def label_values_query(text: str) -> tuple[str, str] | None:
    """``label_values(selector, label)`` -> ``(selector, label)``; None for other text.

    ``label_values(label)`` (no selector) gives ``("", label)``.
    """
    match = _LABEL_VALUES.match(text)
    if match is None:
        return None
    return (match.group("selector") or "").strip(), match.group("label")


def rule_queries(path: Path) -> list[Query]:
    """Every recording and alerting rule of one Prometheus rules file, in file order."""
    document = _load_yaml(path)
    out: list[Query] = []
    for group in document.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("record") or rule.get("alert")
            kind = "record" if "record" in rule else "alert"
            templates = " ".join(
                str(v)
                for v in [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
            )
            out.append(
                Query(
                    f"{path.name}: group {group['name']} {kind} {name}",
                    str(rule["expr"]),
                    kind,
                    instant=True,
                    labels_used=frozenset(_TEMPLATE_LABEL.findall(templates)),
                    name=name,
                )
            )
    return out


def substitute(expr: str, values: Mapping[str, str] = DEFAULT_VARIABLES) -> str:
    """Replace Grafana template variables (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``).

    Raises:
        KeyError: a variable has no value in ``values``.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in values:
            raise KeyError(f"no value for template variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def parse(query: Query, values: Mapping[str, str] = DEFAULT_VARIABLES) -> Any:
    """Parse ``query`` (after :func:`substitute`); returns the parser's expression tree.

    Raises:
        PromQLError: the expression does not parse (source and message in the text).
    """
    text = substitute(query.expr, values) if query.kind in ("panel", "variable") else query.expr
    try:
        return promql_parser.parse(text)
    except ValueError as exc:
        raise PromQLError(f"{query.source}: {exc}: {text!r}") from None


# ------------------------------------------------------------------ checking


def _children(node: Any) -> list[Any]:
    kind = type(node).__name__
    if kind == "BinaryExpr":
        return [node.lhs, node.rhs]
    if kind == "Call":
        return list(node.args)
    if kind == "MatrixSelector":
        return [node.vector_selector]
    if kind in ("AggregateExpr", "ParenExpr", "SubqueryExpr", "UnaryExpr"):
        params = [node.param] if kind == "AggregateExpr" and node.param is not None else []
        return [*params, node.expr]
    return []


def _selectors(node: Any) -> Iterator[Any]:
    if type(node).__name__ == "VectorSelector":
        yield node
    for child in _children(node):
        yield from _selectors(child)


def _is_scalar(node: Any) -> bool:
    kind = type(node).__name__
    if kind in ("NumberLiteral", "StringLiteral"):
        return True
    if kind in ("ParenExpr", "UnaryExpr"):
        return _is_scalar(node.expr)
    if kind == "Call":
        return str(node.func.name) in ("scalar", "time", "pi")
    if kind == "BinaryExpr":
        return _is_scalar(node.lhs) and _is_scalar(node.rhs)
    return False


_NAME_LIST = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\|[a-zA-Z_:][a-zA-Z0-9_:]*)*$")


def selector_names(node: Any) -> list[str]:
    """The series a vector selector reads: its name, or the names a ``__name__=~"a|b"``
    matcher lists (a plain alternation of names; ``[""]`` for anything else)."""
    if node.name:
        return [node.name]
    for matcher in node.matchers.matchers:
        regex = matcher.name == "__name__" and str(matcher.op) == "MatchOp.Re"
        if regex and _NAME_LIST.match(matcher.value):
            return str(matcher.value).split("|")
    return [""]


def output_labels(node: Any, known: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """Labels the result of ``node`` can carry (``__name__`` aside).

    ``known`` maps every series name (exported metrics and recording rules) to its
    labels; an unknown name contributes no labels (it is reported elsewhere).
    """
    kind = type(node).__name__
    if kind == "VectorSelector":
        # Several series: the labels every one of them carries.
        sets = [known.get(name, frozenset()) for name in selector_names(node)]
        return frozenset.intersection(*sets)
    if kind in ("MatrixSelector", "ParenExpr", "SubqueryExpr", "UnaryExpr"):
        return output_labels(_children(node)[-1], known)
    if kind in ("NumberLiteral", "StringLiteral"):
        return frozenset()
    if kind == "AggregateExpr":
        inner = output_labels(node.expr, known)
        op = str(node.op)
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return inner
        extra = frozenset({node.param.val}) if op == "count_values" else frozenset()
        modifier = node.modifier
        if modifier is None:
            return extra
        labels = frozenset(modifier.labels)
        if modifier.type == promql_parser.AggModifierType.Without:
            return (inner - labels) | extra
        return labels | extra
    if kind == "Call":
        name = str(node.func.name)
        args = list(node.args)
        if name == "histogram_quantile":
            return output_labels(args[1], known) - {"le"}
        if name in ("absent", "absent_over_time"):
            selector = next(_selectors(args[0]), None)
            if selector is None:
                return frozenset()
            return frozenset(
                m.name for m in selector.matchers.matchers if m.op == promql_parser.MatchOp.Equal
            )
        if name == "label_replace":
            return output_labels(args[0], known) | {args[1].val}
        if name == "label_join":
            return output_labels(args[0], known) | {args[1].val}
        for arg in args:
            if not _is_scalar(arg):
                return output_labels(arg, known)
        return frozenset()
    if kind == "BinaryExpr":
        if _is_scalar(node.lhs):
            return output_labels(node.rhs, known)
        if _is_scalar(node.rhs):
            return output_labels(node.lhs, known)
        lhs, rhs = output_labels(node.lhs, known), output_labels(node.rhs, known)
        op = str(node.op)
        if op == "or":
            return lhs | rhs
        modifier = node.modifier
        group = frozenset(modifier.group_labels or []) if modifier is not None else frozenset()
        if modifier is not None and modifier.card == promql_parser.VectorMatchCardinality.OneToMany:
            return rhs | group
        return lhs | group
    return frozenset()


def _check_node(node: Any, known: Mapping[str, frozenset[str]], problems: list[str]) -> None:
    kind = type(node).__name__
    if kind == "VectorSelector":
        for name in selector_names(node):
            if name not in known:
                problems.append(f"unknown series {name!r}")
                continue
            for matcher in node.matchers.matchers:
                if matcher.name != "__name__" and matcher.name not in known[name]:
                    problems.append(f"label {matcher.name!r} is not a label of {name}")
    elif kind == "AggregateExpr" and node.modifier is not None:
        inner = output_labels(node.expr, known)
        for label in node.modifier.labels:
            if label not in inner:
                problems.append(f"{node.op} by/without {label!r}: not a label of its input")
    elif kind == "BinaryExpr" and node.modifier is not None:
        lhs, rhs = output_labels(node.lhs, known), output_labels(node.rhs, known)
        matching = node.modifier.matching
        include = matching is not None and matching.type == promql_parser.LabelModifierType.Include
        for label in (matching.labels or []) if matching is not None else []:
            if include and (label not in lhs or label not in rhs):
                problems.append(f"on {label!r}: not a label of both sides of {node.op}")
            elif not include and label not in lhs and label not in rhs:
                problems.append(f"ignoring {label!r}: not a label of either side of {node.op}")
        many_to_one = node.modifier.card == promql_parser.VectorMatchCardinality.ManyToOne
        one_side = rhs if many_to_one else lhs
        for label in node.modifier.group_labels or []:
            if label not in one_side:
                problems.append(f"group_left/right {label!r}: not a label of the 'one' side")
    for child in _children(node):
        _check_node(child, known, problems)


def check_queries(queries: list[Query], catalog: Catalog) -> list[str]:
    """Problems of ``queries`` against ``catalog``; ``[]`` when everything checks.

    Recording rules are read in order, so a rule (or a panel) may use the series of any
    recording rule in ``queries``; their labels are the labels their expression yields.
    """
    known: dict[str, frozenset[str]] = dict(catalog.series)
    for query in queries:
        if query.kind == "record":
            known[query.name] = output_labels(parse(query), known)
    problems: list[str] = []
    for query in queries:
        try:
            tree = parse(query)
        except (PromQLError, KeyError) as exc:
            problems.append(str(exc))
            continue
        found: list[str] = []
        _check_node(tree, known, found)
        available = output_labels(tree, known)
        for label in sorted(query.labels_used):
            if label not in available:
                found.append(
                    f"label {label!r} is used but the expression yields {sorted(available)}"
                )
        problems.extend(f"{query.source}: {p}" for p in found)
    return problems


def folder_queries(folder: Path = GRAFANA_DIR) -> list[Query]:
    """Every query of the folder: rules first (recording rules define series), then
    dashboards, each sorted by file name."""
    queries: list[Query] = []
    for path in sorted((folder / "alerts").glob("*.yml")):
        queries.extend(rule_queries(path))
    for path in sorted((folder / "dashboards").glob("*.json")):
        queries.extend(dashboard_queries(path))
    return queries


def check_folder(catalog: Catalog, folder: Path = GRAFANA_DIR) -> list[str]:
    """:func:`check_queries` over :func:`folder_queries`."""
    return check_queries(folder_queries(folder), catalog)


def main(argv: list[str] | None = None) -> int:
    """``python grafana/lint.py --metrics-url URL``: exit 1 and print each problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-url", required=True, help="the collector's /metrics URL")
    args = parser.parse_args(argv)
    with urllib.request.urlopen(args.metrics_url, timeout=10) as response:
        catalog = Catalog.from_exposition(response.read().decode("utf-8"))
    problems = check_folder(catalog)
    for problem in problems:
        print(problem)
    print(f"{len(folder_queries())} queries checked, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
