"""Series selectors naming a tier's path in the store, e.g. `kvscope_fs_read_bytes_total{mount="/gpfs"}`.

The PromQL subset: a catalogued metric name and optional `label="value"` equality matchers. Every
series of the metric whose labels match is summed as traffic on the path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SELECTOR = re.compile(r'^\s*([a-z_][a-z0-9_]*)\s*(?:\{(.*)\})?\s*$')
_MATCHER = re.compile(r'\s*([a-z_][a-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True, slots=True)
class PathSelector:
    name: str
    matchers: tuple[tuple[str, str], ...]

    def matches(self, label_names: tuple[str, ...], values: tuple[str, ...]) -> bool:
        labels = dict(zip(label_names, values, strict=False))
        return all(labels.get(k) == v for k, v in self.matchers)


def parse_selector(text: str) -> PathSelector:
    match = _SELECTOR.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a series selector like kvscope_fs_read_bytes_total{{mount=\"/gpfs\"}}")
    body, matchers = (match.group(2) or "").strip(), []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(f"{text!r}: expected label=\"value\" at {body[pos:]!r}")
        matchers.append((m.group(1), re.sub(r'\\(.)', r'\1', m.group(2))))
        pos = m.end()
    return PathSelector(match.group(1), tuple(matchers))
