"""Step-level batching of autoregressive requests over one left-padded KV cache.

Each running request owns one row of a batched ``DynamicCache`` plus a row of the 2-D attention
mask (0 = padding). A request joins after its own prefill: both caches are left-padded to a
common length and concatenated on the batch axis, so the next decode step already includes it;
a request that leaves is dropped with ``index_select`` and all-padding columns on the left are
trimmed. Rows that have no input this step ("bubbles", e.g. a talker waiting for the thinker)
still run but their new column is masked out, so they never attend to it.
The join/leave copies cost O(cache) once per request, decode steps append one column.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch


class KVBatch:
    def __init__(self) -> None:
        self.rids: list[str] = []
        self.cache: Any = None  # DynamicCache with batch = len(rids)
        self.mask: torch.Tensor | None = None  # (B, L) long

    def __len__(self) -> int:
        return len(self.rids)

    def fits(self, n: int, kv_tokens: int) -> bool:
        """One more row of ``n`` positions fits a KV pool of ``kv_tokens`` (0: no pool): the
        left-padded batch holds its rows times its longest row."""
        width = max(self.mask.shape[1] if self.mask is not None else 0, n)
        return not kv_tokens or (len(self) + 1) * width <= kv_tokens

    def join(self, rid: str, cache: Any, length: int) -> None:
        """Add a prefilled request (its cache has batch size 1 and ``length`` valid tokens)."""
        new_mask = torch.ones(1, length, dtype=torch.long, device=_device(cache))
        if self.cache is None:
            self.rids, self.cache, self.mask = [rid], cache, new_mask
            return
        assert self.mask is not None
        total = max(self.mask.shape[1], length)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_lpad(mine.keys, total), _lpad(theirs.keys, total)])
            mine.values = torch.cat([_lpad(mine.values, total), _lpad(theirs.values, total)])
        self.mask = torch.cat([_lpad(self.mask, total, dim=1), _lpad(new_mask, total, dim=1)])
        self.rids.append(rid)

    def leave(self, rids: set[str]) -> None:
        keep = [i for i, r in enumerate(self.rids) if r not in rids]
        if len(keep) == len(self.rids):
            return
        if not keep:
            self.rids, self.cache, self.mask = [], None, None
            return
        assert self.mask is not None
        idx = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        # columns that are padding for every remaining row can go
        first = int(mask.any(dim=0).nonzero()[0])
        self.mask = mask[:, first:].contiguous()
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first:].contiguous()
            layer.values = layer.values.index_select(0, idx)[:, :, first:].contiguous()
        self.rids = [self.rids[i] for i in keep]

    @overload
    def step(
        self,
        model: Any,
        embeds: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        want_hidden: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def step(
        self,
        model: Any,
        embeds: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        want_hidden: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def step(
        self,
        model: Any,
        embeds: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        want_hidden: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode step for every row: embeds (B, 1, H), valid (B,) bool, positions (B,).
        Returns last-position logits (B, V) and, if asked, last hidden states (B, H)."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, valid.long()[:, None]], dim=1)
        out = model(
            inputs_embeds=embeds,
            attention_mask=self.mask,
            position_ids=positions[:, None],
            cache=self.cache,
            use_cache=True,
            output_hidden_states=want_hidden,
        )
        self.cache = out.cache
        hidden = out.hidden_states[-1][:, -1] if want_hidden else None
        return out.logits[:, -1], hidden


def _lpad(t: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _device(cache: Any) -> torch.device:
    return cache.layers[0].keys.device
