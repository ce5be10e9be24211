"""`kvscope kv-size` and `kvscope reference ...`: subcommands added to the main parser by `add_commands`.

Heavy modules (numpy, zmq, the engine) are imported inside the handlers so `kvscope --help` stays fast
and works without the `reference` extra.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvscope.agent.tools.reference.geometry import KVGeometry, human_bytes, parse_count, parse_size, preset

TIER_FLAGS = ("g1", "g2", "g3", "g4")


DEFAULT_MODEL = "gpt-oss-120b"


def add_geometry_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV geometry (a preset, custom values, or a preset with values overridden)")
    g.add_argument("--model", help=f"preset (default {DEFAULT_MODEL} when no custom value is given)")
    g.add_argument("--layers", type=int, help="number of layers")
    g.add_argument("--kv-heads", type=int, help="KV heads per layer")
    g.add_argument("--head-dim", type=int, help="head dimension")
    g.add_argument("--dtype", help="KV dtype: fp16, bf16, fp8, fp32, int8")
    g.add_argument("--sliding-window-layers", type=int, help="layers that use a sliding window")
    g.add_argument("--sliding-window", type=int, help="tokens a sliding-window layer keeps")


def geometry_from_args(args: argparse.Namespace) -> KVGeometry:
    overrides: dict[str, Any] = {
        k: getattr(args, k)
        for k in ("layers", "kv_heads", "head_dim", "dtype", "sliding_window_layers", "sliding_window")
        if getattr(args, k) is not None
    }
    if args.model or not overrides:
        base = preset(args.model or DEFAULT_MODEL)
        if not overrides:
            return base
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        fields.update(overrides, name=f"{base.name} (modified)", source="custom flags over " + base.name)
        return KVGeometry(**fields)
    missing = [f for f in ("layers", "kv_heads", "head_dim") if f not in overrides]
    if missing:
        raise ValueError("custom geometry needs --" + ", --".join(m.replace("_", "-") for m in missing))
    return KVGeometry("custom", **overrides)


def kv_size_report(geo: KVGeometry, tokens: int, block_tokens: int, sequences: int,
                   capacities: dict[str, int]) -> str:
    bpt = geo.bytes_per_token
    lines = [
        f"model            {geo.name}  ({geo.source}{'; UNSURE, check the card' if geo.unsure else ''})",
        f"geometry         {geo.layers} layers ({geo.full_attention_layers} full attention, "
        f"{geo.sliding_window_layers} sliding window of {geo.sliding_window} tokens), {geo.kv_heads} KV heads, "
        f"head dim {geo.head_dim}, {geo.dtype}",
        f"bytes/token      {bpt:,} B (full-attention layers; sliding-window layers hold only their window)",
        f"tokens           {tokens:,}",
        f"total KV         {human_bytes(tokens * bpt)}",
    ]
    if geo.sliding_window_layers:
        window = sequences * geo.window_bytes(geo.sliding_window)
        lines.append(f"+ windows        {human_bytes(window)} for {sequences} sequence(s) "
                     f"({geo.window_bytes(geo.sliding_window):,} B each)")
    block_bytes = geo.block_bytes(block_tokens)
    lines.append(f"blocks           {-(-tokens // block_tokens):,} of {block_tokens} tokens ({block_bytes:,} B each)")
    for tier, cap in capacities.items():
        fit = cap // bpt
        share = 100 * min(1.0, fit / tokens) if tokens else 0.0
        lines.append(f"{tier.upper():<16} {human_bytes(cap)} holds {fit:,} tokens = {fit // block_tokens:,} blocks "
                     f"({share:.1f}% of the tokens)")
    return "\n".join(lines) + "\n"


def _kv_size(args: argparse.Namespace) -> int:
    try:
        geo = geometry_from_args(args)
        tokens = parse_count(args.tokens)
        caps = {t: parse_size(getattr(args, t)) for t in TIER_FLAGS if getattr(args, t)}
    except ValueError as exc:
        print(f"kvscope kv-size: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(kv_size_report(geo, tokens, args.block_tokens, args.sequences, caps))
    return 0


def add_commands(sub: Any) -> None:
    """Adds `kv-size` and `reference` to the main parser's subcommands."""
    kv = sub.add_parser("kv-size", help="KV bytes per token, total size, and what fits in each tier")
    add_geometry_args(kv)
    kv.add_argument("--tokens", default="1", help="tokens of KV to size (24000000, 24M, 130k)")
    kv.add_argument("--block-tokens", type=int, default=256, help="tokens per block (default 256)")
    kv.add_argument("--sequences", type=int, default=1, help="sequences, for the sliding-window share")
    for t in TIER_FLAGS:
        kv.add_argument(f"--{t}", help=f"{t.upper()} capacity (19.6GiB, 2TB, ...)")
    kv.set_defaults(func=_kv_size)
    from kvscope.agent.tools.reference.serve_commands import add_reference_commands

    add_reference_commands(sub)
