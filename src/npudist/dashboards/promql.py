"""A small PromQL reader: which metric names a query uses, and whether its brackets and strings close.

Full parsing is left to ``promtool`` (the reference parser); this module only needs to be right about
names, so every dashboard query and rule can be checked against the metric catalogue without a server.
"""

from __future__ import annotations

import re

# Words that look like identifiers but are PromQL syntax (https://prometheus.io/docs/prometheus/latest/querying/operators/).
KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan", "atan2", "start", "end",
    # aggregation operators: followed by `by (...)` they are not directly before their parenthesis
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
})
# A parenthesised list after these words holds label names, not metric names.
_LABEL_LIST_WORDS = ("by", "without", "on", "ignoring", "group_left", "group_right")

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(" + "|".join(_LABEL_LIST_WORDS) + r")\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_NUMBER_WORD = re.compile(r"^(?:0x[0-9a-fA-F]+|[0-9].*)$")
_VARIABLE = re.compile(r"\$(?:\{\w+(?::\w+)?\}|\w+)")


class PromQLError(ValueError):
    """A query that cannot be PromQL: an unclosed bracket or string."""


def substitute(expr: str, values: dict[str, str] | None = None, default: str = ".*") -> str:
    """Replace Grafana variables (``$job``, ``${node}``, ``$__rate_interval``) so the text is plain PromQL.

    ``$__rate_interval`` and ``$__interval`` become ``1m`` unless given; other variables ``default``.
    """
    values = {"__rate_interval": "1m", "__interval": "1m", **(values or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(0).lstrip("$").strip("{}").split(":")[0]
        return values.get(name, default)

    return _VARIABLE.sub(repl, expr)


def check_balanced(expr: str) -> None:
    """Raise PromQLError naming the first unclosed string or bracket."""
    stripped = _STRING.sub('""', expr)
    if any(q in stripped.replace('""', "") for q in "\"'`"):
        raise PromQLError(f"unclosed string literal in {expr!r}")
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for i, ch in enumerate(stripped):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            raise PromQLError(f"unbalanced {ch!r} at offset {i} in {expr!r}")
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """Every metric name the query selects (``foo``, ``foo{...}``, ``foo[5m]``); functions and labels excluded."""
    check_balanced(expr)
    text = _STRING.sub('""', expr)
    named = set(re.findall(r'__name__\s*=\s*"([^"]+)"', _MATCHERS.sub(lambda m: m.group(0), expr)))
    text = _MATCHERS.sub("{}", text)
    text = _RANGE.sub("[]", text)
    text = _LABEL_LIST.sub(r"\1", text)  # one pass: a second would eat `by (metric)` left behind
    names = set(named)
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word in KEYWORDS or _NUMBER_WORD.match(word):
            continue
        names.add(word)
    return names
