"""SGLang's scheduler inside a stage process, stepped by the stage host.

SGLang's ``Engine`` runs its scheduler in a process of its own behind ZeroMQ, with a tokenizer
manager and a detokenizer around it. Here the stage process is the scheduler's process: requests
enter through the scheduler's own ``process_input_requests`` (validation, multimodal padding,
grammar compilation, queueing), each ``step`` is one iteration of its event loop
(``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``: chunked prefill mixed
with decode, the radix cache, SGLang's sampler), and what it would send to the detokenizer is
taken in place (``_Captured``). No extra process, no sockets on the request path, and the
stage's pipeline (streaming edges, abort, batching across stages) stays the project's.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import secrets
import subprocess
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from worker.contract.stage_context import StageContext
from worker.engines import sglang as vendor
from worker.engines.base import EngineEvent, EngineRequest, ForwardTrace, TokenLogprob

# SGLang's names for our dtypes
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# SGLang builds its process groups and its global settings once a process
# (``distributed/bootstrap.py:100-110``): one engine at a time, the next after ``close``
_live: SGLangEngine | None = None


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model_path: Path
    device: str  # "cpu" or "cuda:N"
    dtype: str  # the spec's: fp32, bf16, fp16
    context_length: int
    max_running_requests: int
    kv_tokens: int  # the plan's KV pool in tokens (0: context_length x max_running_requests)
    prefill_chunk_tokens: int  # the most prompt tokens one step prefills (chunked prefill)
    kv_dtype: str | None = None  # the spec's (None: the model's dtype)
    tp_size: int = 1  # SGLang's tensor-parallel ranks (worker.engines.sglang.ranks)
    tp_rank: int = 0
    dist_port: int = 0  # where the ranks meet (rank 0 picks it)
    # the share of its GPU the plan gives the stage's process (None: on a CPU)
    memory_fraction: float | None = None
    random_weights: bool = False  # SGLang's "dummy" weights (bench/gpu_check.py at real size)
    # off for a model whose prompts are embeddings (the token ids SGLang keys its prefix cache
    # by are placeholders) and whose forward reads per-request state (no CUDA graphs)
    prefix_cache: bool = True
    cuda_graphs: bool = True
    # a long prompt's chunks in the same forward as the running decodes (off for a model whose
    # decode steps are not token steps: a talker's take its previous frame)
    mixed_prefill: bool = True
    grammar: bool = True  # constrained decoding (a model of codes has no tokenizer for it)

    @classmethod
    def of_stage(cls, ctx: StageContext) -> EngineSettings:
        """A stage's engine as its spec and the plan say (the checkpoint, device and dtype,
        the context, the plan's running requests, KV pool and share of the GPU, the prefill
        chunk, the KV cache's dtype)."""
        eng = ctx.stage.engine
        return cls(
            model_path=ctx.checkpoint,
            device=ctx.device,
            dtype=ctx.stage.dtype.value,
            context_length=eng.context_length,
            max_running_requests=ctx.max_running_requests,
            kv_tokens=ctx.kv_tokens,
            prefill_chunk_tokens=eng.prefill_chunk_tokens,
            kv_dtype=None if eng.kv_dtype is None else eng.kv_dtype.value,
            tp_size=ctx.stage.tp_size,
            memory_fraction=ctx.memory_fraction,
            random_weights=bool(ctx.extra.get("random_weights")),
        )


class SGLangEngine:
    def __init__(
        self, settings: EngineSettings, on_forward: Callable[[ForwardTrace], None] | None = None
    ) -> None:
        global _live
        if _live is not None:
            raise RuntimeError(
                "an SGLang engine already runs in this process: SGLang builds its process "
                "groups once a process (one autoregressive stage per process; close() the "
                "other first)"
            )
        vendor.load()
        from sglang.srt.managers import io_struct
        from sglang.srt.managers.scheduler import Scheduler, SpawnRanks, publish
        from sglang.srt.server_args import PortArgs
        from sglang.srt.utils.common import DynamicGradMode

        self.io = io_struct
        self.grad_mode = DynamicGradMode
        self.ranks: Ranks | None = None  # rank 0 of several: the others
        if settings.tp_size > 1 and settings.tp_rank == 0:
            from fleet.redis_server import free_port

            settings = dataclasses.replace(settings, dist_port=free_port())
            self.ranks = Ranks(settings)  # (they build their schedulers beside this one)
        server_args = _server_args(settings)
        gpu = int(settings.device.split(":")[1]) if settings.device.startswith("cuda:") else 0
        if settings.tp_size > 1 and not settings.device.startswith("cuda"):
            gpu = settings.tp_rank  # (SGLang's CPU thread binding reads the rank's entry)
        ranks = SpawnRanks(world_rank=settings.tp_rank, dp_rank=None, gpu_id=gpu)
        publish(server_args, role="scheduler", ranks=ranks)
        try:
            ports = PortArgs.init_new(server_args)
            self.scheduler = _stage_scheduler(Scheduler)(server_args, ports)
        except BaseException:
            _reset_process_state()  # (what it built before it failed)
            if self.ranks is not None:
                self.ranks.stop()
            raise
        self.outputs: list[Any] = []
        captured = _Captured(self.outputs)
        s = self.scheduler
        s.output_streamer.send_to_detokenizer = captured
        s.ipc_channels = dataclasses.replace(
            s.ipc_channels, send_to_tokenizer=captured, send_to_detokenizer=captured
        )
        self.vocab_size = s.model_config.vocab_size
        self.on_forward = on_forward
        self.incoming: list[Any] = []
        self.live: set[str] = set()
        # requests refused by SGLang's own check of their sampling values, for the next step
        self.refused: list[EngineEvent] = []
        # requests that sit out the coming steps (a talker waiting for its next input); they
        # keep their KV, outside the scheduler's running batch
        self.held: set[str] = set()
        self.parked: Any = None  # their ScheduleBatch
        _live = self
        if settings.kv_tokens and self.pool_tokens < settings.kv_tokens:
            self.close()
            raise RuntimeError(
                f"SGLang's KV pool holds {self.pool_tokens} tokens, the plan's "
                f"{settings.kv_tokens}: the memory it profiled does not hold what the plan sized "
                "(another process on the device?); lower the stage's engine.kv_budget_tokens or "
                "max_running_requests, or give it a larger memory_share"
            )

    def close(self) -> None:
        """This process's SGLang state given up (its process groups, ``distributed/
        parallel_state.py:3266-3340``, and its published settings and resources), so that
        another engine can start here; this one cannot step afterwards."""
        global _live
        if self.ranks is not None:
            self.ranks.stop()
            self.ranks = None
        if _live is self:
            _reset_process_state()
            _live = None

    @property
    def model(self) -> Any:
        """The model instance SGLang's runner built (for a family's captured tensors)."""
        return self.scheduler.tp_worker.model_runner.model

    # ---- the engine interface ---------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        try:
            tokenized = self._tokenized(request)
        except ValueError as exc:  # SamplingParams.verify: a value the model cannot take
            self.refused.append(EngineEvent(request.rid, finish="abort", error=str(exc)))
            return
        self.incoming.append(tokenized)
        self.live.add(request.rid)

    def abort(self, rid: str) -> None:
        if rid not in self.live:
            return
        self.live.discard(rid)
        self.incoming = [r for r in self.incoming if r.rid != rid]
        self.held.discard(rid)
        if self.ranks is not None:
            self.ranks.send("abort", rid)
        self._abort(rid)

    def _abort(self, rid: str) -> None:
        if any(r.rid == rid for r in self._parked_reqs()):
            self._park()  # back in the running batch, where the scheduler's abort finds it
        with self.grad_mode():
            self.scheduler.process_input_requests([self.io.AbortReq(rid=rid)])
        self.outputs.clear()  # (the abort's own notice; the request is forgotten here)

    def has_work(self) -> bool:
        return (
            bool(self.incoming or self.refused)
            or not self.scheduler.is_fully_idle()
            or any(r.rid not in self.held for r in self._parked_reqs())
        )

    def queue_depth(self) -> int:
        return len(self.live)

    @property
    def pool_tokens(self) -> int:
        """The tokens its KV pool holds (the plan's budget, as SGLang sized it)."""
        return int(self.scheduler.max_total_num_tokens)

    def step(self) -> list[EngineEvent]:
        if self.ranks is not None:
            self.ranks.send("step", self.incoming, self.held)
        with self.grad_mode():  # as SGLang's event loop runs (``scheduler.py:2025``)
            return self._step()

    def follow(self, op: str, *args: Any) -> None:
        """Rank 0's ``step`` or ``abort`` on this rank (worker.engines.sglang.ranks): the same
        scheduler calls on the same inputs; what they output is rank 0's to send."""
        if op == "step":
            self.incoming, self.held = list(args[0]), set(args[1])
            with self.grad_mode():
                self._step()
        elif op == "abort":
            self._abort(args[0])
        else:
            raise ValueError(f"rank {op!r}?")
        self.outputs.clear()

    def _step(self) -> list[EngineEvent]:
        s = self.scheduler
        if self.incoming:
            s.process_input_requests(self.incoming)
            self.incoming = []
        if self.held or self.parked is not None:
            self._park()
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch:
            result = s.run_batch(batch)
            if self.on_forward is not None:
                prefill = batch.forward_mode.is_extend()
                lengths = list(batch.extend_lens) if prefill else [1] * len(batch.reqs)
                self.on_forward(ForwardTrace([r.rid for r in batch.reqs], lengths, prefill))
            s.process_batch_result(batch, result)
        s.last_batch = batch
        return self._events()

    # ---- internals ----------------------------------------------------------------------------
    def _parked_reqs(self) -> list[Any]:
        return [] if self.parked is None else list(self.parked.reqs)

    def _park(self) -> None:
        """Before a step: the held requests out of the scheduler's batches (the running one,
        and the prefill just run, which the scheduler merges into it next), the others back
        in. A parked request keeps its KV and its place in the request pool; SGLang moves
        requests between batches the same way (``ScheduleBatch.filter_batch`` /
        ``merge_batch``, ``schedule_batch.py:3834-3990``, as it merges a prefill into the
        running batch, ``scheduler.py:3940-3961``). A decode step's inputs are gathered by
        request-pool index after the move (``overlap_utils.py:113-143``)."""
        s = self.scheduler
        if self.parked is not None:
            back = [i for i, r in enumerate(self.parked.reqs) if r.rid not in self.held]
            if back:
                resumed = _split(self.parked, back)
                if self.parked.is_empty():
                    self.parked = None
                if s.running_batch.is_empty():
                    s.running_batch = resumed
                else:
                    s.running_batch.merge_batch(resumed)
        holders = [s.running_batch]
        if s.last_batch is not None and s.last_batch.forward_mode.is_extend():
            holders.append(s.last_batch)
        for batch in holders:
            rows = [
                i
                for i, r in enumerate(batch.reqs)
                if r.rid in self.held and not r.finished() and r is not s.chunked_req
            ]
            if not rows:
                continue
            parked = _split(batch, rows)
            if self.parked is None:
                self.parked = parked
            else:
                self.parked.merge_batch(parked)

    def _tokenized(self, r: EngineRequest) -> Any:
        from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

        sp = r.sampling
        grammar = r.grammar
        params = SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=sp.temperature or 0.0,
            top_p=1.0 if sp.top_p is None else sp.top_p,
            top_k=TOP_K_ALL if sp.top_k in (None, 0, -1) else sp.top_k,
            min_p=sp.min_p or 0.0,
            presence_penalty=sp.presence_penalty or 0.0,
            frequency_penalty=sp.frequency_penalty or 0.0,
            repetition_penalty=1.0 if sp.repetition_penalty is None else sp.repetition_penalty,
            stop_token_ids=set(r.stop_token_ids) or None,
            logit_bias={str(t): b for t, b in sp.logit_bias} or None,
            # (every request has one: see patches._per_request_seeds)
            sampling_seed=secrets.randbits(62) if sp.seed is None else sp.seed,
            json_schema=None
            if grammar is None
            else ("$$ANY$$" if grammar.kind == "json" else grammar.schema),
        )
        params.normalize(None)
        params.verify(self.vocab_size)
        return self.io.TokenizedGenerateReqInput(
            rid=r.rid,
            input_text=None,
            input_ids=array("q", r.input_ids),
            input_embeds=None,
            mm_inputs=r.multimodal,
            token_type_ids=None,
            sampling_params=params,
            return_logprob=r.logprobs is not None,
            logprob_start_len=-1,
            top_logprobs_num=r.logprobs or 0,
            token_ids_logprob=None,
            stream=True,
            extra_key=r.prefix_namespace,
        )

    def _events(self) -> list[EngineEvent]:
        events, self.refused = self.refused, []
        for out in self.outputs:
            if isinstance(out, self.io.AbortReq):  # refused before it ran (too long, ...)
                if out.rid in self.live:
                    self.live.discard(out.rid)
                    reason = out.finished_reason or {}
                    message = reason.get("message") or out.abort_message or "refused"
                    events.append(EngineEvent(out.rid, finish="abort", error=str(message)))
                continue
            if not isinstance(out, self.io.BatchTokenIDOutput):
                continue
            for i, rid in enumerate(out.rids or ()):
                if rid not in self.live:
                    continue
                ev = EngineEvent(
                    rid,
                    tokens=list(out.output_ids[i]),
                    cached_tokens=out.cached_tokens[i],
                )
                if out.output_token_logprobs_val:
                    ev.logprobs = _logprobs(out, i)
                reason = out.finished_reasons[i]
                if reason is not None:
                    self.live.discard(rid)
                    kind = reason.get("type")
                    ev.finish = kind if kind in ("stop", "length") else "abort"
                    if ev.finish == "abort":
                        ev.error = str(reason.get("message") or reason)
                events.append(ev)
        self.outputs.clear()
        return events


def _kv_cache_dtype(st: EngineSettings) -> str:
    """SGLang's name for the KV cache's dtype (``arg_groups/fields/model.py:197-221``): the
    model's own (auto), bf16 or fp8 (the planner refuses others, and fp8 on a CPU)."""
    if st.kv_dtype is None or st.kv_dtype == st.dtype:
        return "auto"
    names = {"bf16": "bfloat16", "fp8": "fp8_e4m3"}
    if st.kv_dtype not in names:
        raise ValueError(f"SGLang keeps no KV cache in {st.kv_dtype}")
    return names[st.kv_dtype]


def _reset_process_state() -> None:
    """SGLang's process-wide state gone: its process groups, then its published settings,
    flags and resources (``runtime_context.py:1751-1765``, its own test teardown)."""
    from sglang.srt.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )
    from sglang.srt.runtime_context import reset_context

    destroy_model_parallel()
    destroy_distributed_environment()
    reset_context()


def _split(batch: Any, rows: list[int]) -> Any:
    """The requests at ``rows`` of ``batch`` as a batch of their own; ``batch`` keeps the
    others. SGLang has no such split, only the in-place ``filter_batch``: the copy is filtered
    one way and the batch the other. The copy's sampling info is its own, as
    ``SamplingBatchInfo.filter_batch`` rebinds its tensors (``sampling_batch_info.py:466-510``);
    its penalizer orchestrator is shared, which holds for requests that use no penalizer (its
    ``filter``/``merge`` are no-ops then, ``penaltylib/orchestrator.py:106-164``): the talkers
    pick their codes in the model, and SGLang's sampler only takes the pick."""
    part = copy.copy(batch)
    part.sampling_info = copy.copy(batch.sampling_info)
    part.filter_batch(keep_indices=rows)
    batch.filter_batch(keep_indices=[i for i in range(len(batch.reqs)) if i not in rows])
    return part


def _logprobs(out: Any, i: int) -> list[TokenLogprob]:
    values = out.output_token_logprobs_val[i]
    tops_v = out.output_top_logprobs_val[i] if out.output_top_logprobs_val else None
    tops_i = out.output_top_logprobs_idx[i] if out.output_top_logprobs_idx else None
    found = []
    for k, lp in enumerate(values):
        top: tuple[tuple[int, float], ...] = ()
        if tops_v is not None and tops_i is not None and k < len(tops_v) and tops_v[k]:
            top = tuple(zip((int(t) for t in tops_i[k]), (float(v) for v in tops_v[k]),
                            strict=True))  # fmt: skip
        found.append(TokenLogprob(float(lp), top))
    return found


class Ranks:
    """SGLang's tensor-parallel ranks 1 to n-1 of rank 0's engine (the stage's own, in its
    process), each a process (``worker.engines.sglang.rank``) with the same engine over its
    shard of the weights and the KV pool (gloo on a CPU, NCCL on GPUs: the platform's backend,
    ``distributed/parallel_state.py:2388-2396``).

    SGLang's scheduler keeps its queues, radix cache and pools on every rank, and a forward's
    collectives pair up only when every rank takes the same steps: its own scheduler processes
    receive the requests on rank 0 and broadcast them (``scheduler_components/
    request_receiver.py:80-108``), then each runs the whole loop. Here rank 0 sends each step's
    inputs (the requests tokenized on rank 0, their seeds drawn there; the requests held out)
    and each abort to the other ranks before it runs them itself, over a pipe of its own to each
    (SGLang's gloo groups time out after hours idle), and they run the same methods
    (``SGLangEngine.follow``); their outputs are dropped. A rank whose rank 0 is gone reads end
    of file and exits."""

    def __init__(self, settings: Any) -> None:
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        try:
            for rank in range(1, settings.tp_size):
                read, write = os.pipe()
                entry = [sys.executable, "-m", "worker.engines.sglang.rank", str(read)]
                self.procs.append(subprocess.Popen(entry, pass_fds=(read,)))
                os.close(read)
                conn = Connection(write, readable=False)
                self.conns.append(conn)
                device = settings.device
                if device.startswith("cuda"):
                    device = f"cuda:{rank}"  # (the process sees its plan's GPUs, rank order)
                conn.send(dataclasses.replace(settings, tp_rank=rank, device=device))
        except BaseException:
            self.stop()
            raise

    def send(self, *command: Any) -> None:
        for conn in self.conns:
            conn.send(command)

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("close",))
            conn.close()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns, self.procs = [], []


class _Captured:
    """Stands where the scheduler's senders to the detokenizer and the tokenizer manager are
    (``scheduler_components/ipc_channels.py:52-73``, ``output_streamer.py:235``): what they
    would send over ZeroMQ is kept for ``step`` to read."""

    def __init__(self, sink: list[Any]) -> None:
        self.sink = sink
        self.socket = None

    def send_output(self, output: Any, recv_obj: object = None) -> None:
        self.sink.append(output)


def _stage_scheduler(scheduler: type) -> type:
    """SGLang's scheduler without a tokenizer manager's duties: a stage's inputs arrive as
    token ids and, for a multimodal model, processed (the encoder stages' embeddings, rope
    positions from the family), so it runs with ``skip_tokenizer_init`` (no Hugging Face
    processor, whose video part needs torchvision's C operators: ``scheduler.py:891-938``,
    ``tp_worker.py:326-348``). The grammar backend, which that flag turns off
    (``constrained/grammar_manager.py:36-45``), is built here over the checkpoint's tokenizer."""

    class StageScheduler(scheduler):
        def init_grammar_manager(self) -> None:
            super().init_grammar_manager()
            from sglang.srt.constrained.base_grammar_backend import create_grammar_backend
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            manager = self.grammar_manager
            if manager.grammar_backend is None and self.server_args.grammar_backend != "none":
                cfg = self.model_config
                manager.grammar_backend = create_grammar_backend(
                    self.server_args,
                    get_tokenizer(self.server_args.model_path),
                    cfg.vocab_size,
                    cfg.hf_eos_token_id,
                    think_end_ids=cfg.think_end_ids,
                )

    return StageScheduler


def _server_args(st: EngineSettings) -> Any:
    from sglang.srt.environ import envs
    from sglang.srt.server_args import ServerArgs

    cpu = not st.device.startswith("cuda")
    if cpu:
        # the eager runner copies each batch into fixed buffers for CUDA graphs to read
        # (``runner/eager_runner.py:180-207``); a CPU replays no graph (SGLang's own switch,
        # ``environ.py:1656``, which it sets for some models itself)
        envs.SGLANG_EAGER_INPUT_NO_COPY.set(True)
        if st.tp_size > 1:
            # SGLang binds each CPU rank's threads to a NUMA node unless told its cores, one
            # entry a rank (``utils/numa_utils.py:454-508``; without AMX only checked)
            cores = os.cpu_count() or 1
            binding = "|".join(str(r % cores) for r in range(st.tp_size))
            os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", binding)
    tp = {}
    if st.tp_size > 1:
        tp = {
            "tp_size": st.tp_size,
            # one address for every rank (each builds its own PortArgs:
            # ``distributed/bootstrap.py:233-248``); custom all-reduce is for GPUs only
            "dist_init_addr": f"127.0.0.1:{st.dist_port}",
            "disable_custom_all_reduce": True,
        }
    kv = st.kv_tokens or st.context_length * st.max_running_requests
    return ServerArgs(
        model_path=str(st.model_path),
        load_format="dummy" if st.random_weights else "auto",
        dtype=_DTYPES.get(st.dtype, st.dtype),
        skip_tokenizer_init=True,
        device="cpu" if cpu else "cuda",
        # the spec's, which the planner holds within the checkpoint's trained positions
        context_length=st.context_length,
        max_running_requests=st.max_running_requests,
        max_total_tokens=kv,  # the plan's KV budget, enforced by SGLang's pool
        kv_cache_dtype=_kv_cache_dtype(st),
        # on a GPU the plan's share for weights, KV and activations: SGLang sizes its pool
        # within it (``kv_cache_configurator.py:2990-3060``), min'd with max_total_tokens
        mem_fraction_static=st.memory_fraction,
        chunked_prefill_size=st.prefill_chunk_tokens,
        # a long prompt's chunks run in the same forward as the running decodes, which keep
        # streaming while it is prefilled
        enable_mixed_chunk=st.mixed_prefill,
        # the stage host steps the scheduler itself, one iteration per step
        disable_overlap_schedule=True,
        # on every device: flashinfer's sampler takes no per-request seed (sampler.py:404)
        sampling_backend="pytorch",
        grammar_backend="xgrammar" if st.grammar else "none",
        # no free whitespace in constrained JSON: a reply cannot wander in it to its limit
        constrained_json_disable_any_whitespace=True,
        attention_backend="torch_native" if cpu else None,
        random_seed=0,  # (the engine's own draws; every request carries its seed)
        disable_cuda_graph=cpu or not st.cuda_graphs,
        disable_radix_cache=not st.prefix_cache,
        log_level="warning",
        **tp,
    )
