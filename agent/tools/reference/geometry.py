"""KV-cache geometry: how many bytes one token of context costs in each tier.

Per layer and token the cache holds K and V: 2 × kv_heads × head_dim × dtype bytes. Full-attention
layers keep every token; sliding-window layers keep only the last `window` tokens of a sequence, so
their cost is a fixed amount per sequence, not per token. `bytes_per_token` is the marginal cost
(full-attention layers only): that is what grows with context and what the seeds' 825 GB counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class KVGeometry:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "fp16"
    sliding_window_layers: int = 0
    sliding_window: int = 0  # tokens kept by a sliding-window layer
    source: str = "custom"  # where the config values come from
    unsure: bool = False  # values quoted from memory that should be checked against the model card

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {self.dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        if min(self.layers, self.kv_heads, self.head_dim) <= 0:
            raise ValueError("layers, kv_heads and head_dim must be positive")
        if not 0 <= self.sliding_window_layers <= self.layers:
            raise ValueError("sliding_window_layers must be between 0 and layers")
        if self.sliding_window_layers and self.sliding_window <= 0:
            raise ValueError("sliding-window layers need a positive sliding_window")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_layer_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes  # K and V

    @property
    def full_attention_layers(self) -> int:
        return self.layers - self.sliding_window_layers

    @property
    def bytes_per_token(self) -> int:
        """Marginal bytes per token of context (full-attention layers)."""
        return self.full_attention_layers * self.bytes_per_layer_token

    def window_bytes(self, sequence_tokens: int) -> int:
        """Bytes the sliding-window layers hold for one sequence of that many tokens."""
        return self.sliding_window_layers * self.bytes_per_layer_token * min(sequence_tokens, self.sliding_window)

    def sequence_bytes(self, tokens: int) -> int:
        """Bytes one sequence of `tokens` tokens holds across all layers."""
        return tokens * self.bytes_per_token + self.window_bytes(tokens)

    def block_bytes(self, block_tokens: int) -> int:
        return block_tokens * self.bytes_per_token


# Config values from each model's config.json on its Hugging Face model card (num_hidden_layers,
# num_key_value_heads, head_dim, sliding_window / layer_types). Entries marked unsure were quoted from
# memory without the card at hand.
PRESETS: dict[str, KVGeometry] = {
    g.name: g
    for g in (
        KVGeometry("gpt-oss-120b", 36, 8, 64, "fp16", 18, 128,
                   "openai/gpt-oss-120b config.json (alternating sliding/full layer_types); seeds summary"),
        KVGeometry("gpt-oss-20b", 24, 8, 64, "fp16", 12, 128,
                   "openai/gpt-oss-20b config.json (alternating sliding/full layer_types)"),
        KVGeometry("llama-3.1-8b", 32, 8, 128, "bf16", source="meta-llama/Llama-3.1-8B config.json"),
        KVGeometry("llama-3.1-70b", 80, 8, 128, "bf16", source="meta-llama/Llama-3.1-70B config.json"),
        KVGeometry("qwen3-0.6b", 28, 8, 128, "bf16", source="Qwen/Qwen3-0.6B config.json", unsure=True),
        KVGeometry("qwen3-1.7b", 28, 8, 128, "bf16", source="Qwen/Qwen3-1.7B config.json", unsure=True),
        KVGeometry("qwen3-4b", 36, 8, 128, "bf16", source="Qwen/Qwen3-4B config.json", unsure=True),
        KVGeometry("qwen3-8b", 36, 8, 128, "bf16", source="Qwen/Qwen3-8B config.json"),
        KVGeometry("qwen3-14b", 40, 8, 128, "bf16", source="Qwen/Qwen3-14B config.json"),
        KVGeometry("qwen3-32b", 64, 8, 128, "bf16", source="Qwen/Qwen3-32B config.json"),
        KVGeometry("qwen3-30b-a3b", 48, 4, 128, "bf16", source="Qwen/Qwen3-30B-A3B config.json"),
        KVGeometry("qwen3-235b-a22b", 94, 4, 128, "bf16", source="Qwen/Qwen3-235B-A22B config.json", unsure=True),
    )
}


def preset(name: str) -> KVGeometry:
    key = name.strip().lower().removeprefix("openai/").removeprefix("meta-llama/").removeprefix("qwen/")
    key = key.replace("-instruct", "").replace("meta-llama-", "llama-")
    if key not in PRESETS:
        raise ValueError(f"unknown model {name!r} (presets: {', '.join(PRESETS)})")
    return PRESETS[key]


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?)(i?)B?\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_size(text: str) -> int:
    """'19.6GiB' → bytes (binary), '825GB' → bytes (decimal), '4096' → 4096."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 19.6GiB, 825GB, 4096)")
    number, prefix, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    base = 1024 if binary or not prefix else 1000
    return int(number * base ** _POWERS[prefix])


def parse_count(text: str) -> int:
    """'24000000', '24M', '1.14M', '130k' → an integer count."""
    m = re.match(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)\s*$", text)
    if not m:
        raise ValueError(f"not a count: {text!r} (examples: 24000000, 24M, 130k)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    return round(float(m.group(1)) * scale)


def human_bytes(n: float) -> str:
    """Both conventions, because the seeds quote decimal GB while capacities are binary GiB."""
    return f"{n:,.0f} B ({n / 2**30:,.1f} GiB, {n / 1e9:,.1f} GB)"
