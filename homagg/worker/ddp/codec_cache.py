"""The hook's codecs: one per bucket index and codec name, kept across steps because a codec
carries per-bucket state (error memory, block exponents) from one step to the next."""

from __future__ import annotations

from typing import Any

from homagg.worker.codecs import Codec, make_codec


class CodecCache:
    """Codecs by (bucket index, codec name), each with the bucket size it was made for.
    Pickles empty: codecs are remade on first use, as after a bucket rebuild."""

    def __init__(self, world_size: int, rank: int) -> None:
        self.world_size, self.rank = world_size, rank
        self.held: dict[tuple[int, str], tuple[int, Codec]] = {}

    def get(self, index: int, numel: int, name: str, options: dict[str, Any]) -> Codec:
        """Bucket `index`'s codec `name`, made anew when the bucket's size changed (DDP
        rebuilt its buckets); a held ratio codec only takes the new `ratio` option."""
        held = self.held.get((index, name))
        if held is None or held[0] != numel:
            held = (numel, make_codec(name, self.world_size, self.rank, **options))
            self.held[(index, name)] = held
        elif "ratio" in options:
            held[1].ratio = options["ratio"]  # type: ignore[attr-defined]
        return held[1]

    def __getstate__(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "rank": self.rank}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.world_size, self.rank = state["world_size"], state["rank"]
        self.held = {}
