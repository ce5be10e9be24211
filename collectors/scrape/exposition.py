"""A fast scanner of the Prometheus text format (0.0.4) as prometheus_client writes it.

It reads only the sample lines whose name starts with one of the given prefixes (`vllm:` for the
vLLM collector) and, optionally, only the exact sample names asked for; comments, blank lines and
every other family (`http_*`, `process_*`, ...) cost one `startswith` each. `_created` samples are
dropped (they are creation timestamps, not values). Pure: text in, samples out, no I/O.

Why not prometheus_client's parser: on a 2-engine vLLM page (~1,200 lines) it takes ~25-40 ms per
parse on the build VM (perf-baselines §2a), i.e. 3-4 % of a core at one scrape per second, mostly
spent on families we never read. bench/bench_vllm_parse.py measures both on the same page.

Format points handled (the spec and prometheus_client's writer):
- `name value [timestamp]` and `name{l="v",...} value [timestamp]`, tokens separated by spaces or
  tabs, `\\r\\n` line ends tolerated, an optional trailing comma inside the braces;
- labels in any order; values with the escapes `\\\\`, `\\"` and `\\n` (any other escape, an
  unescaped quote, a duplicate or invalid label name makes the line malformed);
- values as Python floats read them, including exponent forms, `+Inf`, `-Inf` and `NaN`
  (digit-group underscores, which Python would accept, are rejected as the format has none);
- a text that does not end in a newline may have been cut off: its last line is dropped and reported
  (`truncated`), unless the caller knows the text is whole (`complete`: HTTP's Content-Length was met),
  in which case the last line is read like any other (many pages in the wild lack the final newline).

Malformed lines are counted, the first one is described (for a log line), and the scan goes on.
Label sets are read once per distinct label text and kept in a bounded per-scanner cache: a
scraped page repeats its label texts from one scrape to the next, so steady-state scans only look
them up. The returned label mappings are shared with that cache and must not be modified. The first
scan (an empty cache) is kept cheap too: a histogram bucket's labels are its series' labels (the text
with `le=""`, parsed once) plus its `le`, and a label text that differs from the last one read only
inside the value that varies (`le`, or the last label) is not parsed again; both only for texts
without backslashes, where every quote is a delimiter and the shortcut is exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Labels = Mapping[str, str]
SampleList = list[tuple[Labels, float]]

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_NO_LABELS: Labels = {}
_BAD = object()  # cache marker for a label text that does not parse
_SKIP = "\x00skip"  # decision for a sample name we do not read (a distinct, non-empty marker)


@dataclass(slots=True)
class ScanResult:
    """Samples by exposed sample name (e.g. `vllm:prefix_cache_hits_total`, `..._bucket`)."""

    samples: dict[str, SampleList] = field(default_factory=dict)
    malformed: int = 0  # sample lines of a selected family that could not be read
    truncated: bool = False  # the text did not end in a newline and was not known whole; last line dropped
    first_problem: str = ""  # the first malformed line, described for a log message


def _parse_labels_slow(body: str) -> dict[str, str] | None:
    """Character scanner for label texts with escapes or unusual spacing; None if malformed."""
    labels: dict[str, str] = {}
    i, n = 0, len(body)
    while True:
        while i < n and body[i] in " \t":
            i += 1
        if i == n:
            return labels
        eq = body.find("=", i)
        if eq < 0:
            return None
        name = body[i:eq].strip(" \t")
        i = eq + 1
        while i < n and body[i] in " \t":
            i += 1
        if i == n or body[i] != '"' or not _LABEL_NAME.fullmatch(name) or name in labels:
            return None
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                return None  # unterminated value
            c = body[i]
            if c == '"':
                break
            if c == "\\":
                if i + 1 >= n or body[i + 1] not in _ESCAPES:
                    return None
                chars.append(_ESCAPES[body[i + 1]])
                i += 2
                continue
            chars.append(c)
            i += 1
        labels[name] = "".join(chars)
        i += 1
        while i < n and body[i] in " \t":
            i += 1
        if i == n:
            return labels
        if body[i] != ",":
            return None
        i += 1


def parse_labels(body: str) -> dict[str, str] | None:
    """The labels between `{` and `}`; None when malformed.

    Fast path: without a backslash every `"` is a delimiter, so splitting on `",` is exact; the
    quote count proves it (two per label). Anything else goes to the character scanner.
    """
    if not body:
        return {}
    if "\\" in body or " " in body or "\t" in body:
        return _parse_labels_slow(body)
    if body[-1] == ",":
        body = body[:-1]
    parts = body.split('",')
    if body[-1:] != '"' or body.count('"') != 2 * len(parts):
        return _parse_labels_slow(body)
    parts[-1] = parts[-1][:-1]
    labels: dict[str, str] = {}
    for part in parts:
        name, sep, value = part.partition('="')
        # for ASCII text, isidentifier() is exactly [a-zA-Z_][a-zA-Z0-9_]*, and cheaper than a regex
        if not sep or not (name.isidentifier() and name.isascii()) or name in labels:
            return None
        labels[name] = value
    return labels


def _value(text: str) -> float:
    if "_" in text:
        raise ValueError(text)
    return float(text)


class ExpositionScanner:
    """Scans pages for the sample lines of selected families; one instance per scraped target."""

    def __init__(
        self,
        prefixes: Iterable[str],
        names: Iterable[str] | None = None,
        cache_size: int = 50_000,
    ) -> None:
        self._prefixes = tuple(prefixes)
        if not self._prefixes:
            raise ValueError("at least one name prefix is required")
        joined = "".join(self._prefixes)
        if "{" in joined or " " in joined or "\t" in joined or "\n" in joined:
            raise ValueError("a name prefix cannot hold '{', a blank or a newline")
        self._names = None if names is None else frozenset(names)
        self._cache_size = cache_size
        self._labels: dict[str, object] = {}  # label text -> parsed labels, or _BAD
        self._decisions: dict[str, str] = {}  # line prefix "name{" -> name, _SKIP or "" (invalid)
        # The last label set parsed, as the label text before and after the value of the label that
        # varies between neighbouring lines (`le` in a histogram, else the last label), that label,
        # and the labels: the next label text that differs from it only in that value is not parsed.
        self._last: tuple[str, str, str, dict[str, str], int, int] = ("\n", "\n", "", {}, 1, -1)
        # (with where the value starts and stops in the next text; "\n" starts no label text)

    def _labels_of(self, body: str) -> object:
        """The labels of a label text not in the cache (read and kept), or _BAD.

        Exact: `body` differs from the last label set's text only inside the quotes of the value
        that varies, by a text without quotes or backslashes, so it parses alike but for that value.
        """
        head, tail, varying, last, start, stop = self._last
        if body.startswith(head) and body.endswith(tail) and len(body) + stop >= start:
            value = body[start:stop]
            if '"' not in value and "\\" not in value:
                labels: object = last.copy()
                labels[varying] = value  # type: ignore[index]  # a dict made here
            else:
                labels = self._read(body)
        else:
            labels = self._read(body)
        if len(self._labels) >= self._cache_size:
            self._labels.clear()  # a page that changes all its labels every scrape: start over
        self._labels[body] = labels
        return labels

    def _read(self, body: str) -> object:
        """A label text's labels (a histogram bucket's from its series', else parsed), or _BAD."""
        labels = self._bucket_labels(body)
        if labels is None:
            parsed = parse_labels(body)
            if parsed is None:
                return _BAD
            self._remember_last_label(body, parsed)
            labels = parsed
        return labels

    def _remember_last_label(self, body: str, labels: dict[str, str]) -> None:
        """Keep `labels` as the last label set, with its last label as the one that varies.

        Only for a text without backslashes that ends in the last value's closing quote: as it
        parsed, that value's text is then its value, right before the closing quote."""
        if labels and body[-1] == '"' and "\\" not in body:
            varying, value = next(reversed(labels.items()))
            start = len(body) - 1 - len(value)
            self._last = (body[:start], '"', varying, labels, start, -1)

    def _bucket_labels(self, body: str) -> object | None:
        """A histogram bucket's labels from its series' labels, or None when `body` is not one.

        The bucket lines of one series differ only in `le`, so `body` is read as its series' label
        text with `le=""` (parsed once, cached) plus the `le` value. Exact when `body` has no
        backslash and the `le="` found opens a value (an even number of quotes before it): every
        quote is then a delimiter, the value holds no quote, and the two texts parse alike but for it.
        """
        at = body.find('le="')
        if at < 0 or (at and body[at - 1] != ",") or "\\" in body or body.count('"', 0, at) % 2:
            return None  # (an `le` after a label named like `handle` is not looked for: parsed whole)
        start = at + 4
        end = body.find('"', start)
        if end <= start:
            return None  # no closing quote (malformed: parse it whole), or le="" (the series text itself)
        series = body[:start] + body[end:]  # its le="" makes it a plain parse
        parsed = self._labels.get(series) or self._labels_of(series)
        if parsed is _BAD:
            return _BAD
        base: dict[str, str] = parsed  # type: ignore[assignment]  # a parsed dict, "le" in its place
        self._last = (body[:start], body[end:], "le", base, start, end - len(body))
        labels = base.copy()
        labels["le"] = body[start:end]
        return labels

    def scan(self, text: str, complete: bool = False) -> ScanResult:
        """The selected samples of `text`. `complete`: the text is known to be whole, so a last line
        without a newline is a line, not a cut-off one."""
        result = ScanResult()
        lines = text.split("\n")
        tail = lines.pop()  # "" when the text ends in a newline, else a last line, perhaps cut off
        if tail and complete:
            lines.append(tail)
        elif tail:
            result.truncated = True
            if tail.startswith(self._prefixes):
                self._problem(result, tail, "cut off (no final newline)", len(lines) + 1)
        prefixes, label_cache = self._prefixes, self._labels
        # The lines of one sample name come together, so the name is looked at only when the line
        # stops starting with the previous "name{" (or "name "): a line of a family we read or skip
        # costs one startswith call, a line we keep one rpartition, one dict lookup and one float().
        # (A prefix holds no "{" or blank, so a line starting with `current` starts with a prefix.)
        current = "\n"  # matches no line
        width, labelled, skip = 1, False, True
        bucket: SampleList = []
        for line in lines:
            if not line.startswith(current):
                if not line.startswith(prefixes):
                    continue
                current, bucket, skip = self._switch(result, line)
                width, labelled = len(current), current[-1] == "{"
            if skip:
                continue
            if labelled:
                head, _, rest = line.rpartition("} ")
                body = head[width:]
                labels = label_cache.get(body)
                if labels is None:
                    labels = self._labels_of(body)
            else:
                rest = line[width:]
                labels = _NO_LABELS
            try:
                if labels is _BAD or "_" in rest:
                    raise ValueError(rest)
                value = float(rest)
            except ValueError:
                careful = self._careful(line, current)
                if careful is None:
                    self._problem(result, line, "expected NAME[{LABELS}] VALUE [TIMESTAMP]")
                    continue
                labels, value = careful
            bucket.append((labels, value))  # type: ignore[arg-type]  # a parsed dict here
        return result

    def _careful(self, line: str, current: str) -> tuple[object, float] | None:
        """The slow, exact reading of a line the fast path could not take (tabs, timestamps, junk)."""
        if current[-1] == "{":
            close = line.rfind("}")
            if close < len(current):
                return None
            body = line[len(current) : close]
            labels = self._labels.get(body)
            if labels is None:
                labels = self._labels_of(body)
            if labels is _BAD:
                return None
            rest = line[close + 1 :]
        else:
            labels, rest = _NO_LABELS, line[len(current) - 1 :]
        tokens = rest.split()
        if not 1 <= len(tokens) <= 2 or not rest[:1].isspace():
            return None
        try:
            value = _value(tokens[0])
            if len(tokens) == 2:
                int(tokens[1])  # a timestamp in ms: valid, unused (we scrape live values)
        except ValueError:
            return None
        return labels, value

    def _switch(self, result: ScanResult, line: str) -> tuple[str, SampleList, bool]:
        """A new sample name starts: its line prefix, where its samples go, and whether to skip it."""
        brace = line.find("{")
        if brace > 0 and line[brace - 1] not in " \t":
            current = line[: brace + 1]  # the common "name{" (checked: no blank before the brace)
        else:
            end = len(line)
            for sep in " \t":
                i = line.find(sep)
                if 0 <= i < end:
                    end = i
            if end == len(line):
                self._problem(result, line, "no value")
                return "\n", [], True  # "\n" starts no line: the next line is looked at afresh
            current = line[: end + 1]  # "name " or "name\t", or "name {" below
            if brace >= 0 and not line[end:brace].strip(" \t"):
                current = line[: brace + 1]
        name = self._decisions.get(current)
        if name is None:
            if len(self._decisions) >= self._cache_size:
                self._decisions.clear()
            name = self._decisions[current] = self._decide(current[:-1].rstrip(" \t"))
        if name is _SKIP or not name:
            if not name:
                self._problem(result, line, "invalid metric name")
            return current, [], True
        bucket = result.samples.get(name)
        if bucket is None:
            bucket = result.samples[name] = []
        return current, bucket, False

    def _decide(self, name: str) -> str:
        """`name` if its samples are wanted, _SKIP if not, "" if it is not a valid metric name."""
        if (self._names is not None and name not in self._names) or name.endswith("_created"):
            return _SKIP
        # [a-zA-Z_:][a-zA-Z0-9_:]*: for ASCII text, isidentifier() is [a-zA-Z_][a-zA-Z0-9_]*
        return name if name.replace(":", "_").isidentifier() and name.isascii() else ""

    @staticmethod
    def _problem(result: ScanResult, line: str, why: str, number: int = 0) -> None:
        result.malformed += 1
        if not result.first_problem:
            shown = line if len(line) <= 160 else line[:157] + "..."
            where = f"line {number}: " if number else ""
            result.first_problem = f"{where}{why}: {shown!r}"
