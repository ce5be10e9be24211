"""An engine page whose counters advance, as a live engine's do between two scrapes.

`advance(text, factor)` multiplies the counting samples of the page's counter, histogram and summary families
by `factor` (a counter; a histogram's buckets, `_sum` and `_count`; a summary's `_sum` and `_count`), so a
histogram stays consistent and a ratio of two counters stays what the page said, and leaves gauges, quantiles,
`_created` samples and info families as they are. A page served at a factor that grows with time reads to a
scraper as an engine serving at a steady rate.
"""

from __future__ import annotations

import re

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")
# the samples of each cumulative type that count (a summary's quantiles are not counts)
_COUNTING = {"counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def advance(text: str, factor: float) -> str:
    counting: set[str] = set()
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            match = _TYPE.match(line)
            if match and match.group(2) in _COUNTING:
                counting.update(match.group(1) + suffix for suffix in _COUNTING[match.group(2)])
            out.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line or name not in counting:
            out.append(line)
            continue
        start = line.rfind("}") + 1 if "{" in line else len(name)
        fields = line[start:].split()  # the value, then a timestamp where the page has one
        try:
            fields[0] = repr(float(fields[0]) * factor)
        except (IndexError, ValueError):
            out.append(line)  # a line no scraper takes: left for the parser under test
            continue
        out.append(line[:start] + " " + " ".join(fields))
    return "\n".join(out) + "\n"
