"""Building one stage by itself, with the streams the wiring would make for it."""

from __future__ import annotations

from typing import Any

from kvscope.agent.app.wiring import make_streams
from kvscope.agent.core.streams import Streams, StreamUse


def streams_for(use: StreamUse, options: Any) -> Streams:
    """The streams `make_streams` makes for a stage enabled alone: a buffer its writer needs even with no
    reader (the OTLP receiver's request records); none that needs a reader."""
    streams = Streams()
    make_streams(streams, [(use, options)])
    return streams
