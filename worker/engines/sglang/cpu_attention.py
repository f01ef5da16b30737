"""Attention over SGLang's paged KV pool on a CPU: one attention call per layer for a batch.

SGLang's ``torch_native`` backend, the one a CPU without ``sgl_kernel`` has
(``layers/attention/torch_native_backend.py`` in 0.5.23), loops over a batch's requests in
Python, one SDPA call per request and layer (``_run_sdpa_forward_decode``, lines 176-260,
marked "inefficient" there), and a prefill whose prompt starts with cached tokens (or
continues an earlier chunk) runs causal attention over the whole sequence, zero queries
standing in for the cached positions (``_run_sdpa_forward_extend``, lines 61-174: a 3-token
turn after a 1,400-token cached prefix took longer than a 1,400-token prompt's first half).
That costs what the prefix cache and chunked prefill are there to save. What a GPU host gets
from FlashInfer's paged kernels, this backend does with one masked SDPA call over the pool:

- the gather of every request's key and value slots, and the masks, are computed once per
  forward (``init_forward_metadata``, which SGLang's runner calls before each forward) and
  shared by every layer;
- a decode step is one call for the whole batch (queries ``(requests, heads, 1, dim)`` against
  the keys up to the longest request, the others masked);
- a prefill is one call for all its prompts: each new position attends to its own request's
  cached prefix and to the new positions up to itself (a causal mask offset by the prefix);
  in a mixed batch (chunked prefill beside running decodes) the single-token rows take the
  decode call, so a prompt's chunk is not padded to every decode's length.

Cross attention, encoder-only layers and sliding windows keep SGLang's path. Registered under
SGLang's own name for the backend (``attention_registry.py:217``), on CPUs only
(``patches._cpu_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

sdpa = torch.nn.functional.scaled_dot_product_attention


@dataclass(slots=True)
class _Rows:
    """Requests whose new positions attend the same way, and what they read of the pool."""

    queries: torch.Tensor | None  # their query rows in the forward (None: all rows, in order)
    slots: torch.Tensor  # pool slots of the keys they read, flat (index_select: a tenth of
    # the time of indexing by a 2-D tensor here)
    mask: torch.Tensor | None  # which keys each query may read (None: causal from 0, one
    # request)
    decode: bool  # one query per request: (requests, heads, 1, dim) against padded keys


class PagedAttention(TorchNativeAttnBackend):
    def __init__(self, model_runner: Any) -> None:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        super().__init__(model_runner)
        self.groups: list[_Rows] = []
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # a layer's K and V
        self.own_path = False  # a forward that keeps SGLang's path (see ``init_forward_metadata``)
        pool = self.token_to_kv_pool
        # a plain pool (one row of heads x dim per slot, stored in the model's dtype) takes the
        # new keys and values by index; others through SGLang's ``set_kv_buffer``
        self.plain_pool = (
            type(pool) is MHATokenToKVPool
            and not pool.is_quantized_kv_cache
            and pool.store_dtype == pool.dtype
            and not getattr(pool, "use_hnd", False)
            and getattr(pool, "kv_cache_layout", None) in (None, "NHD", "nhd")
        )

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        self.own_path = self.use_sliding_window_kv_pool or forward_batch.encoder_lens is not None
        if self.own_path:
            return
        mode = forward_batch.forward_mode
        if mode.is_decode():
            self.groups = [self._decode_rows(forward_batch, None)]
        elif mode.is_extend():
            self.groups = self._extend_rows(forward_batch)
        else:
            self.own_path = True

    # ---- what the forward reads, once per forward ----------------------------------------
    def _decode_rows(self, fb: Any, rows: torch.Tensor | None) -> _Rows:
        pool = fb.req_pool_indices if rows is None else fb.req_pool_indices[rows]
        lens = fb.seq_lens if rows is None else fb.seq_lens[rows]
        longest = int(lens.max())
        slots = self.req_to_token_pool.req_to_token[pool, :longest]  # (requests, positions)
        if lens.shape[0] == 1:  # (one request reads all its keys)
            return _Rows(rows, slots.reshape(-1), None, decode=True)
        valid = torch.arange(longest, device=lens.device)[None] < lens[:, None]
        return _Rows(rows, slots.reshape(-1), valid[:, None, None, :], decode=True)

    def _extend_rows(self, fb: Any) -> list[_Rows]:
        new = fb.extend_seq_lens_cpu
        prefix = fb.extend_prefix_lens_cpu
        starts = [0]
        for n in new:
            starts.append(starts[-1] + n)
        single = [i for i, n in enumerate(new) if n == 1]
        multi = [i for i, n in enumerate(new) if n > 1]
        groups = []
        if single:
            index = torch.tensor(single, device=fb.seq_lens.device)
            decode = self._decode_rows(fb, index)
            decode.queries = torch.tensor([starts[i] for i in single], device=index.device)
            if len(single) == len(new):
                decode.queries = None
            groups.append(decode)
        if multi:
            groups.append(self._prompt_rows(fb, multi, new, prefix, starts, len(multi) == len(new)))
        return groups

    def _prompt_rows(
        self,
        fb: Any,
        requests: list[int],
        new: list[int],
        prefix: list[int],
        starts: list[int],
        whole: bool,
    ) -> _Rows:
        """The new positions of ``requests`` as one query sequence against all their keys
        (each request's prefix and new positions, concatenated): a query sees its own
        request's keys up to its position."""
        dev = fb.seq_lens.device
        table = self.req_to_token_pool.req_to_token
        totals = [prefix[i] + new[i] for i in requests]
        slots = torch.cat(
            [table[fb.req_pool_indices[i], :t] for i, t in zip(requests, totals, strict=True)]
        )
        queries = None if whole else torch.cat(
            [torch.arange(starts[i], starts[i] + new[i], device=dev) for i in requests]
        )  # fmt: skip
        if len(requests) == 1 and prefix[requests[0]] == 0:
            return _Rows(queries, slots, None, decode=False)
        counts_q = torch.tensor([new[i] for i in requests], device=dev)
        counts_k = torch.tensor(totals, device=dev)
        index = torch.arange(len(requests), device=dev)
        request_of_query = torch.repeat_interleave(index, counts_q)
        request_of_key = torch.repeat_interleave(index, counts_k)
        first_key = torch.cumsum(counts_k, 0) - counts_k  # each request's first key
        first_query = torch.cumsum(counts_q, 0) - counts_q
        # a query's position in its request, and each key's
        q_pos = torch.arange(int(counts_q.sum()), device=dev) - first_query[request_of_query]
        q_pos = q_pos + torch.tensor([prefix[i] for i in requests], device=dev)[request_of_query]
        k_pos = torch.arange(int(counts_k.sum()), device=dev) - first_key[request_of_key]
        mask = (request_of_query[:, None] == request_of_key[None]) & (k_pos[None] <= q_pos[:, None])
        return _Rows(queries, slots, mask[None, None], decode=False)

    # ---- the layers' calls ---------------------------------------------------------------
    def _own(self, layer: Any) -> bool:
        return (
            self.own_path
            or layer.is_cross_attention
            or layer.attn_type == AttentionType.ENCODER_ONLY
            or (layer.sliding_window_size is not None and layer.sliding_window_size > -1)
        )

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if self._own(layer):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.attend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if self._own(layer):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        return self.attend(q, k, v, layer, forward_batch, save_kv_cache)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """The new positions' keys and values into the pool, then their attention output
        ``(tokens, heads x dim)``, one SDPA call per group of rows."""
        buffers = self.buffers.get(layer.layer_id)
        if buffers is None:
            pool = self.token_to_kv_pool
            buffers = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
            self.buffers[layer.layer_id] = buffers
        keys_all, values_all = buffers
        same = keys_all.dtype == q.dtype
        if save_kv_cache and k is not None and v is not None:
            if self.plain_pool:
                loc = forward_batch.out_cache_loc
                keys_all[loc] = k if same else k.to(keys_all.dtype)
                values_all[loc] = v if same else v.to(values_all.dtype)
            else:
                loc = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
                self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
        heads, dim = layer.tp_q_head_num, layer.qk_head_dim
        gqa = heads != layer.tp_k_head_num
        queries = q.reshape(-1, heads, dim)
        out = None
        for g in self.groups:
            mine = queries if g.queries is None else queries.index_select(0, g.queries)
            if g.decode:  # (requests, heads, 1, dim) against (requests, kv heads, keys, dim)
                n = mine.shape[0]
                keys = keys_all.index_select(0, g.slots).view(n, -1, *keys_all.shape[1:])
                values = values_all.index_select(0, g.slots).view(n, -1, *values_all.shape[1:])
                keys, values = keys.transpose(1, 2), values.transpose(1, 2)
                if not same:
                    keys, values = keys.to(q.dtype), values.to(q.dtype)
                got = sdpa(mine[:, :, None], keys, values, attn_mask=g.mask,
                           scale=layer.scaling, enable_gqa=gqa)[:, :, 0]  # fmt: skip
            else:  # (1, heads, queries, dim) against (1, kv heads, keys, dim)
                keys = keys_all.index_select(0, g.slots).movedim(0, 1)[None]
                values = values_all.index_select(0, g.slots).movedim(0, 1)[None]
                if not same:
                    keys, values = keys.to(q.dtype), values.to(q.dtype)
                got = sdpa(mine.movedim(0, 1)[None], keys, values, attn_mask=g.mask,
                           is_causal=g.mask is None, scale=layer.scaling,
                           enable_gqa=gqa)[0].movedim(0, 1)  # fmt: skip
            if g.queries is None:
                out = got
            else:
                if out is None:
                    out = queries.new_empty(queries.shape[0], heads, layer.v_head_dim)
                out.index_copy_(0, g.queries, got)
        assert out is not None
        return out.reshape(-1, heads * layer.v_head_dim)
