"""The text-format scanner: exactness against prometheus_client's parser, edge cases, bad input."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.collectors.scrape.exposition import ExpositionScanner, SampleList, parse_labels
from testkit.paths import FIXTURES

PAGES = sorted((FIXTURES / "vllm").glob("*.prom"))


Flat = set[tuple[str, frozenset[tuple[str, str]], float]]


def flat(samples: dict[str, SampleList]) -> Flat:
    return {(name, frozenset(labels.items()), value) for name, rows in samples.items() for labels, value in rows}


def reference(text: str, prefix: str = "vllm:") -> Flat:
    out = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                out.add((s.name, frozenset(s.labels.items()), float(s.value)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_fixture_pages_match_prometheus_client(page: Path) -> None:
    text = page.read_text()
    result = ExpositionScanner(("vllm:",)).scan(text)
    assert result.malformed == 0 and not result.truncated
    ours = flat(result.samples)
    assert ours == reference(text)
    assert len(ours) > 100


def test_warm_scan_equals_cold_scan() -> None:
    text = PAGES[0].read_text()
    scanner = ExpositionScanner(("vllm:",))
    first = flat(scanner.scan(text).samples)
    assert flat(scanner.scan(text).samples) == first
    tiny = ExpositionScanner(("vllm:",), cache_size=3)  # the caches clear themselves and stay right
    assert flat(tiny.scan(text).samples) == first


EDGE_PAGE = (
    "# HELP vllm:x_total A counter.\n"
    "# TYPE vllm:x_total counter\n"
    'vllm:x_total{model_name="m",engine="1"} 2.147483648e+09\n'
    'vllm:x_total{engine="0",model_name="m"} 7\n'
    'vllm:x_created{engine="0",model_name="m"} 1.7e+09\n'
    "vllm:plain 3.5\n"
    "vllm:plain_ts 4 1700000000000\n"
    'vllm:esc{a="back\\\\slash",b="quo\\"te",c="new\\nline",d="} 5"} 1\n'
    'vllm:spaced {a="1", b="x y" ,} 2\n'
    "vllm:tabbed{a=\"1\"}\t+Inf\n"
    'vllm:neg{a="1"} -Inf\n'
    'vllm:nan{a="1"} NaN\n'
    'vllm:h_bucket{le="+Inf",engine="0"} 10.0\r\n'
    'vllm:trailing{a="1",} 5\n'
    "http_requests_total{handler=\"/v1/completions\"} 996.0\n"
    "process_cpu_seconds_total 4123.45\n"
    "\n"
)


def test_edge_cases_read_exactly() -> None:
    result = ExpositionScanner(("vllm:",)).scan(EDGE_PAGE)
    s = result.samples
    assert result.malformed == 0, result.first_problem
    assert s["vllm:x_total"] == [({"model_name": "m", "engine": "1"}, 2147483648.0),
                                 ({"engine": "0", "model_name": "m"}, 7.0)]
    assert "vllm:x_created" not in s
    assert s["vllm:plain"] == [({}, 3.5)]
    assert s["vllm:plain_ts"] == [({}, 4.0)]
    assert s["vllm:esc"] == [({"a": "back\\slash", "b": 'quo"te', "c": "new\nline", "d": "} 5"}, 1.0)]
    assert s["vllm:spaced"] == [({"a": "1", "b": "x y"}, 2.0)]
    assert s["vllm:tabbed"] == [({"a": "1"}, math.inf)]
    assert s["vllm:neg"] == [({"a": "1"}, -math.inf)]
    assert math.isnan(s["vllm:nan"][0][1])
    assert s["vllm:h_bucket"] == [({"le": "+Inf", "engine": "0"}, 10.0)]
    assert s["vllm:trailing"] == [({"a": "1"}, 5.0)]
    assert not any(name.startswith(("http_", "process_")) for name in s)


def test_only_wanted_names_are_read() -> None:
    result = ExpositionScanner(("vllm:",), names={"vllm:plain", "vllm:x_total"}).scan(EDGE_PAGE)
    assert set(result.samples) == {"vllm:plain", "vllm:x_total"}
    assert len(result.samples["vllm:x_total"]) == 2


@pytest.mark.parametrize("line", [
    "vllm:novalue",
    'vllm:novalue2{a="1"}',
    'vllm:badvalue{a="1"} twelve',
    'vllm:underscore{a="1"} 1_000',
    'vllm:open{a="1" 3',
    'vllm:unterminated{a="1} 3',
    'vllm:badescape{a="\\t"} 3',
    'vllm:dup{a="1",a="2"} 3',
    'vllm:badlabel{1a="1"} 3',
    'vllm:noquotes{a=1} 3',
    'vllm:stray{a="1"x} 3',
    "vllm:three 1 2 3",
    "vllm:badts 1 soon",
    'vllm:bad-name{a="1"} 3',
    'vllm:glued{a="1"}3 4',
])
def test_malformed_line_is_counted_and_skipped(line: str) -> None:
    text = f'vllm:before{{a="1"}} 1\n{line}\nvllm:after{{a="1"}} 2\n'
    result = ExpositionScanner(("vllm:",)).scan(text)
    assert result.malformed == 1, line
    assert result.first_problem
    assert result.samples["vllm:before"] == [({"a": "1"}, 1.0)]
    assert result.samples["vllm:after"] == [({"a": "1"}, 2.0)]
    assert sum(len(v) for v in result.samples.values()) == 2


def test_line_without_value_does_not_swallow_the_next_family() -> None:
    text = 'vllm:x\nvllm:x_total{a="1"} 4\nvllm:x 5\n'
    result = ExpositionScanner(("vllm:",)).scan(text)
    assert result.malformed == 1
    assert result.samples == {"vllm:x_total": [({"a": "1"}, 4.0)], "vllm:x": [({}, 5.0)]}


def test_page_cut_off_mid_line() -> None:
    text = PAGES[0].read_text()
    cut = text[: text.index("vllm:prefix_cache_hits_total{") + 40]
    result = ExpositionScanner(("vllm:",)).scan(cut)
    assert result.truncated
    assert result.malformed == 1 and "cut off" in result.first_problem
    assert "vllm:prefix_cache_hits_total" not in result.samples
    assert result.samples["vllm:prefix_cache_queries_total"][0][1] == 182736.0
    # a cut right after a newline is a complete page
    whole = ExpositionScanner(("vllm:",)).scan(text[: text.index("vllm:prefix_cache_hits_total{")])
    assert not whole.truncated and whole.malformed == 0


def test_garbage_never_raises() -> None:
    rng = random.Random(1234)
    lines = PAGES[0].read_text().split("\n")
    alphabet = '{}",=\\ \t\nvllm:_+e.-0123456789abcINFNa'
    scanner = ExpositionScanner(("vllm:",))
    for _ in range(300):
        mutated = []
        for line in rng.sample(lines, 40):
            chars = list(line)
            for _ in range(rng.randint(0, 4)):
                if chars:
                    chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            mutated.append("".join(chars))
        result = scanner.scan("\n".join(mutated))
        assert result.malformed >= 0
        for rows in result.samples.values():
            for labels, value in rows:
                assert isinstance(value, float) and isinstance(labels, dict)


def test_parse_labels_paths_agree() -> None:
    assert parse_labels('a="1",b="2"') == {"a": "1", "b": "2"}
    assert parse_labels('b="2", a="1"') == {"a": "1", "b": "2"}
    assert parse_labels('a="x\\"y"') == {"a": 'x"y'}
    assert parse_labels('a="1"b="2"') is None
    assert parse_labels("") == {}


def test_scanner_needs_a_prefix() -> None:
    with pytest.raises(ValueError):
        ExpositionScanner(())


def test_prefix_must_be_the_start_of_a_name() -> None:
    for prefix in ("vllm:{", "vllm ", "vllm\t"):
        with pytest.raises(ValueError):
            ExpositionScanner((prefix,))


LABEL_TEXTS = [
    'engine="0",le="1.0",model_name="m"', 'engine="0",le="+Inf",model_name="m"', 'le="5",a="1"', 'a="1",le="2"',
    'engine="0",le="",model_name="m"', 'engine="0",le="7",model_name="m",', 'engine="0",le="x y",model_name="m"',
    'a="1",b="x"', 'a="1",b="y"', 'a="1",b=""', 'a="1",b="q\\"z"', 'a="1",b="w\\\\"', 'a="1",b="7",',
    'a=",le="', 'a=",le="1",b="2"', 'a=",le="3",b="4"', 'handle="x",le="9"', 'xle="1"', 'le="1"x="2"',
    'engine="0",le="3",le="4"', 'engine="0",le="5",model_name="m"x', 'engine="0",le="6",model_name="m',
    'a="1",b="x",c', 'a="1",b="x"c="2"', ' a = "1" , b = "x"', 'a="1",b="x" ', 'a="1",le="2" ,b="3"',
    'a="1",le="2\\"",b="3"', 'a="\\"",le="4",b="5"', 'le="8', 'le="9",', 'le=""', 'a="1",b="x"",c="2"',
]


@pytest.mark.parametrize("seed", range(20))
def test_labels_read_from_the_last_set_equal_a_full_parse(seed: int) -> None:
    """Bucket and neighbouring label texts are read from the last label set; in any order, every
    text must read exactly as parse_labels reads it on its own."""
    rng = random.Random(seed)
    texts = LABEL_TEXTS * 2
    rng.shuffle(texts)
    scanner = ExpositionScanner(("vllm:",), cache_size=rng.choice([3, 1000]))
    page = "".join(f"vllm:h_bucket{{{body}}} {i}\n" for i, body in enumerate(texts))
    result = scanner.scan(page)
    expected = [(parse_labels(body), float(i)) for i, body in enumerate(texts)]
    assert result.samples.get("vllm:h_bucket", []) == [(labels, v) for labels, v in expected if labels is not None]
    assert result.malformed == sum(labels is None for labels, _ in expected)
