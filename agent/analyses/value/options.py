"""The value analysis' options (`[analyses.value]`): the GPUs an engine spans and, if the site says them, prices."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.agent.core.tiers import STORAGE_TIERS, link

TIERS = tuple(t.value for t in STORAGE_TIERS)


@dataclass
class ValueOptions:
    # GPUs one engine's prefill occupies (tensor x pipeline parallel): GPU-seconds = its prefill seconds x this
    gpus_per_engine: float = 1.0
    # seconds of history the hourly rates and the marginal values are taken over
    window: float = 3600.0
    # prices, never guessed: without gpu_hour no cost figure is exported (GPU-seconds only)
    currency: str = ""  # a label for reports ("USD", "EUR"); the figures are in whatever unit the prices are
    gpu_hour: float = 0.0  # per GPU-hour
    tier_gib_month: dict[str, float] = field(default_factory=dict)  # per GiB-month of each tier: {G4 = 0.05}
    transfer_gb: dict[str, float] = field(default_factory=dict)  # per GB moved on a billed link: {"G4->G2" = 0.01}

    def validate(self, path: str) -> None:
        if not self.gpus_per_engine > 0:
            raise ValueError(f"gpus_per_engine must be > 0, got {self.gpus_per_engine}")
        if not self.window > 0:
            raise ValueError(f"window must be > 0, got {self.window}")
        if self.gpu_hour < 0:
            raise ValueError(f"gpu_hour must be >= 0, got {self.gpu_hour}")
        for tier, price in self.tier_gib_month.items():
            if tier not in TIERS:
                raise ValueError(f"tier_gib_month.{tier}: unknown tier ({', '.join(TIERS)})")
            if price < 0:
                raise ValueError(f"tier_gib_month.{tier} must be >= 0, got {price}")
        for name, price in self.transfer_gb.items():
            src, sep, dst = name.partition("->")
            if not sep:
                raise ValueError(f"transfer_gb.{name}: a link is written SRC->DST, e.g. \"G4->G2\"")
            link(src, dst)  # a ValueError naming what is wrong
            if price < 0:
                raise ValueError(f"transfer_gb.{name} must be >= 0, got {price}")
        if (self.tier_gib_month or self.transfer_gb) and not self.gpu_hour:
            raise ValueError("tier_gib_month / transfer_gb need gpu_hour: a tier's cost is weighed against the GPU "
                             "time it saves")

    @property
    def priced(self) -> bool:
        return self.gpu_hour > 0
