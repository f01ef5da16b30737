"""A codec vocoder decoded as its frames arrive, each layer keeping what it needs between steps,
so that a stream costs what its audio costs and equals the reference's decode at any length.

Both Qwen3 vocoders (Qwen3-Omni's code2wav, Qwen3-TTS's speech-tokenizer decoder) are decoded
by their references in blocks (``chunked_decode``: ``block`` frames at a time, each decoded in
one pass from a fresh start with up to ``context`` frames before it, none before the first).
Their decoders are causal: a frame-rate transformer with sliding-window attention, then
convolutions up to the sample rate (causal convolutions, transposed convolutions, pointwise
activations and residual sums). So a block's decode can run in steps:

- a causal convolution keeps its last ``receptive field - 1`` inputs and convolves them with
  the new ones (zeros at a block's start: its left padding);
- a transposed convolution keeps the inputs whose kernels still overlap outputs to come, and
  gives the outputs that no later input changes; the reference's trims (a lag on the left
  for Qwen3-Omni's, ``kernel - stride`` on the right for both) become where the stream starts
  and what it never sends;
- pointwise activations and norms take the new samples as they are;
- the transformer keeps each layer's keys and values within its window (the family's part).

At a block's end the state is dropped and the next block starts fresh with its ``context``
frames decoded first (their audio not sent), as the reference decodes it. Every output sample
is computed from the same inputs by the same operations as in the reference's decode; only
the order of some floating-point sums may differ (tests compare within a rounding step).

Steps ramp from ``first`` frames (a fast first packet) doubling up to ``chunk``; a stream
whose frames all arrived is decoded in what remains. Streams at the same point (equal step
sizes, none at a block's start) decode as one batch: every layer's state has the same shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class Schedule:
    block: int  # frames per reference block
    context: int  # frames decoded before each block but the first
    first: int  # frames of a stream's first step
    chunk: int  # the largest step
    upsample: int  # samples per frame


# ---- the convolutional part ------------------------------------------------------------
class _Op:
    """One layer of the convolutional part, run on a step's new samples ``(batch, channels,
    samples)`` with its state (``None`` at a block's start)."""

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        raise NotImplementedError


class _Pointwise(_Op):
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        return self.module(x)


class _CausalConv(_Op):
    """A stride-1 convolution left-padded by ``left`` zeros: it keeps its last ``left``
    inputs."""

    def __init__(self, conv: nn.Conv1d, left: int) -> None:
        if conv.stride != (1,) or conv.padding != (0,):
            raise ValueError("a streamed causal convolution has stride 1 and no own padding")
        self.conv, self.left = conv, left

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        if not self.left:
            if not x.shape[-1]:
                return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
            return self.conv(x)
        past = state[slot]
        if past is None:
            past = state[slot] = x.new_zeros(x.shape[0], x.shape[1], self.left)
        if not x.shape[-1]:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        full = torch.cat((past, x), dim=-1)
        state[slot] = full[..., full.shape[-1] - self.left :]
        return self.conv(full)


class _TransConv(_Op):
    """A transposed convolution (kernel ``k``, stride ``s``) whose whole-sequence output the
    reference trims by ``lead`` samples on the left and ``k - s`` on the right. Its output
    sample ``t`` sums the inputs ``i`` with ``i * s <= t < i * s + k``: once ``n`` inputs have
    come, the samples before ``n * s`` are final. It keeps the last ``ceil(k / s) - 1`` inputs
    (zeros before the first: they add nothing) and how many inputs it has seen."""

    def __init__(self, conv: nn.ConvTranspose1d, lead: int, trail: int) -> None:
        k, s = conv.kernel_size[0], conv.stride[0]
        if trail != k - s or conv.padding != (0,) or conv.output_padding != (0,):
            raise ValueError("a streamed transposed convolution is trimmed by kernel - stride")
        self.conv, self.lead, self.stride = conv, lead, s
        self.keep = math.ceil(k / s) - 1

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        # (a batch's blocks each count what they have seen; past their first step they slice
        # alike: ``StreamedDecoder.decode``)
        past, seen = state[slot] if state[slot] is not None else (None, 0)
        counts = seen if isinstance(seen, list) else None
        seen = counts[0] if counts else seen
        n = x.shape[-1]
        if past is None:
            past = x.new_zeros(x.shape[0], x.shape[1], self.keep)
        full = torch.cat((past, x), dim=-1) if self.keep else x
        kept = full[..., full.shape[-1] - self.keep :]
        state[slot] = (kept, [c + n for c in counts] if counts else seen + n)
        if n == 0:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        out = self.conv(full)  # its sample 0 is the whole output's (seen - keep) * s
        s = self.stride
        start = max(seen * s, self.lead)  # past what earlier steps gave, and the left trim
        return out[..., start - (seen - self.keep) * s : (n + self.keep) * s]


class _Sequence(_Op):
    def __init__(self, ops: list[tuple[_Op, int]]) -> None:
        self.ops = ops

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        for op, at in self.ops:
            x = op(x, state, at)
        return x


class _Residual(_Op):
    """``x + f(x)`` where ``f`` keeps the length of its input (causal convolutions and
    activations: Qwen3's residual units)."""

    def __init__(self, body: _Sequence) -> None:
        self.body = body

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        return x + self.body(x, state, slot)


class _ConvNeXt(_Op):
    """A ConvNeXt block: its depthwise causal convolution streamed, then per sample its norm,
    its two linear layers around a GELU and its scale, added to the input."""

    def __init__(self, block: nn.Module, conv: _Op, slot: int) -> None:
        self.block, self.conv, self.at = block, conv, slot

    def __call__(self, x: torch.Tensor, state: list[Any], slot: int) -> torch.Tensor:
        b: Any = self.block
        h = self.conv(x, state, self.at).transpose(1, 2)
        h = b.pwconv2(F.gelu(b.pwconv1(b.norm(h))))
        return x + (b.gamma * h).transpose(1, 2)


class ConvPart:
    """The convolutional part of a decoder (after its transformer), in order, streamed; its
    state is a list with one slot per stateful layer."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.slots = 0
        self.root = self._seq(modules)

    def _slot(self) -> int:
        self.slots += 1
        return self.slots - 1

    def _seq(self, modules: Any) -> _Sequence:
        return _Sequence([self._op(m) for m in modules])

    def _op(self, m: Any) -> tuple[_Op, int]:
        """By the layers' shape, as both vocoders (the project's Qwen3-TTS codec and
        transformers' Qwen3-Omni code2wav) name them; anything else is refused."""
        conv = getattr(m, "conv", None)
        if isinstance(m, nn.ModuleList | nn.Sequential):
            return self._seq(m), -1
        if isinstance(getattr(m, "block", None), nn.ModuleList):  # a decoder block
            return self._seq(m.block), -1
        if hasattr(m, "dwconv"):  # ConvNeXt
            inner, at = self._op(m.dwconv)
            return _ConvNeXt(m, inner, at), -1
        if hasattr(m, "conv1") and hasattr(m, "conv2") and hasattr(m, "act1"):  # residual unit
            body = self._seq([m.act1, m.conv1, m.act2, m.conv2])
            return _Residual(body), -1
        if isinstance(conv, nn.Conv1d):  # causal convolution (padding: kernel - stride)
            return _CausalConv(conv, int(m.padding)), self._slot()
        if isinstance(conv, nn.ConvTranspose1d):
            k, s = conv.kernel_size[0], conv.stride[0]
            lead = int(getattr(m, "left_pad", 0))
            trail = int(getattr(m, "right_pad", getattr(m, "trim", k - s)))
            return _TransConv(conv, lead, trail), self._slot()
        if hasattr(m, "alpha") and hasattr(m, "beta"):  # SnakeBeta
            return _Pointwise(m), -1
        raise ValueError(f"the streamed vocoder does not know the layer {type(m).__name__}")

    def fresh(self) -> list[Any]:
        return [None] * self.slots

    def __call__(self, x: torch.Tensor, state: list[Any]) -> torch.Tensor:
        return self.root(x, state, -1)


# ---- a decoder: the family's frame-rate part, then the convolutional part -------------
class Front(Protocol):
    """A family's frame-rate part: codes ``(batch, groups, frames)`` to the convolutional
    part's input ``(batch, channels, frames)``, with its own state per block."""

    def fresh(self) -> Any: ...

    def __call__(self, codes: torch.Tensor, state: Any) -> torch.Tensor: ...


@dataclass(slots=True)
class Block:
    """One reference block's decode in progress for one stream."""

    start: int  # its first frame (the block's, not its context's)
    front: Any
    convs: list[Any]
    skip: int  # samples still to drop: its context frames' audio
    decoded: int = 0  # frames decoded, its context's included


class StreamedDecoder:
    def __init__(
        self, front: Front, convs: ConvPart, schedule: Schedule, device: str | torch.device
    ) -> None:
        self.front, self.convs, self.schedule = front, convs, schedule
        self.device = torch.device(device)

    def open(self, frames: list[Any], start: int) -> Block:
        """The block starting at frame ``start`` of ``frames``, its context decoded."""
        b = self.schedule
        context = b.context if start - b.context > 0 else start
        block = Block(start, self.front.fresh(), self.convs.fresh(), context * b.upsample)
        if context:
            self.decode([(block, frames[start - context : start])])
        return block

    def decode(self, work: list[tuple[Block, list[Any]]]) -> list[torch.Tensor]:
        """Each block's next frames (the same number for all) -> its new samples ``(samples,)``
        in [-1, 1]: the frame-rate part of each block alone, the convolutional part of all
        at once (blocks past their first step: their states have one shape)."""
        parts = []
        for block, frames in work:
            codes = torch.as_tensor(np.stack(frames), device=self.device).T[None]  # (1, groups, n)
            parts.append(self.front(codes, block.front))
        x = torch.cat(parts) if len(parts) > 1 else parts[0]
        states = _merge([block.convs for block, _ in work])
        wav = self.convs(x, states).clamp(-1, 1)[:, 0]
        out = []
        for i, ((block, frames), samples) in enumerate(zip(work, wav, strict=True)):
            block.convs = [None if s is None else _take(s, i) for s in states]
            block.decoded += len(frames)
            drop = min(block.skip, samples.shape[0])
            block.skip -= drop
            out.append(samples[drop:])
        return out


def _merge(states: list[list[Any]]) -> list[Any]:
    """One state for a batch of blocks (their slots concatenated along the batch)."""
    if len(states) == 1:
        return list(states[0])
    merged: list[Any] = []
    for slots in zip(*states, strict=True):
        if slots[0] is None:
            merged.append(None)
        elif isinstance(slots[0], tuple):  # a transposed convolution's (kept, seen)
            merged.append((torch.cat([s[0] for s in slots]), [s[1] for s in slots]))
        else:
            merged.append(torch.cat(slots))
    return merged


def _take(slot: Any, i: int) -> Any:
    if isinstance(slot, tuple):
        kept, seen = slot
        return (kept[i : i + 1], seen[i] if isinstance(seen, list) else seen)
    return slot[i : i + 1]
