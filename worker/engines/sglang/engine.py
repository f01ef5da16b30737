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
import pickle
import secrets
import subprocess
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from planner.engine_plan import attention_backend, sglang_args
from planner.spec import DType
from worker.contract.stage_context import StageContext
from worker.engines import gpu_memory
from worker.engines import sglang as vendor
from worker.engines.base import EngineEvent, EngineRequest, ForwardTrace, TokenLogprob
from worker.engines.gpu_memory import GpuBudget
from worker.engines.sglang import patches

# SGLang builds its process groups and its global settings once a process
# (``distributed/bootstrap.py:100-110``): one engine at a time, the next after ``close``
_live: SGLangEngine | None = None


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One SGLang engine: what the plan gives it (planner.engine_plan makes its SGLang
    arguments from these, as for ``omni-plan``), and what a run adds."""

    model_path: Path
    device: str  # "cpu" or "cuda:N"
    dtype: DType  # resolved (not auto)
    context_length: int
    max_running_requests: int
    kv_tokens: int  # the plan's KV pool in tokens (0: context_length x max_running_requests)
    prefill_chunk_tokens: int  # the most prompt tokens one step prefills (chunked prefill)
    kv_dtype: DType | None = None  # the spec's (None: the model's dtype)
    prompt: str = "tokens"  # the spec's engine.prompt: "tokens", or "embeddings" (a talker)
    attention_backend: str | None = None  # the plan's (None: the CPU's)
    kv_bytes: int | None = None  # the plan's KV pool in bytes on a rank (None: not planned)
    mem_fraction_static: float | None = None  # SGLang's meaning: (weights + KV) / the GPU
    tp_size: int = 1  # SGLang's tensor-parallel ranks (worker.engines.sglang.ranks)
    tp_rank: int = 0
    dist_port: int = 0  # where the ranks meet (rank 0 picks it)
    # the process's GPU budget (each rank's process caps its allocator with it)
    budget: GpuBudget | None = None
    # what puts the family's model classes in SGLang's registry: every rank calls them before
    # SGLang builds its model (functions, sent to the ranks by reference)
    registers: tuple[Callable[[], None], ...] = ()
    random_weights: bool = False  # SGLang's "dummy" weights (bench/gpu_check.py at real size)

    @classmethod
    def of_stage(
        cls, ctx: StageContext, registers: tuple[Callable[[], None], ...] = ()
    ) -> EngineSettings:
        """A stage's engine as its spec and the plan say (the checkpoint, device and dtype, the
        context, the plan's running requests and KV pool, the attention backend, the prefill
        chunk, the KV cache's dtype)."""
        eng = ctx.stage.engine
        plan = ctx.engine
        return cls(
            model_path=ctx.checkpoint,
            device=ctx.device,
            dtype=ctx.dtype,
            context_length=eng.context_length,
            max_running_requests=ctx.max_running_requests,
            kv_tokens=ctx.kv_tokens,
            prefill_chunk_tokens=eng.prefill_chunk_tokens,
            kv_dtype=eng.kv_dtype,
            prompt=eng.prompt,
            attention_backend=None if plan is None else plan.attention_backend,
            kv_bytes=None if plan is None else plan.kv_bytes,
            mem_fraction_static=None if plan is None else plan.sglang.get("mem_fraction_static"),
            tp_size=ctx.stage.tp_size,
            budget=gpu_memory.current(),
            registers=registers,
            random_weights=bool(ctx.extra.get("random_weights")),
        )

    @property
    def pool_tokens(self) -> int:
        return self.kv_tokens or self.context_length * self.max_running_requests

    def planned_pool(self) -> patches.PlannedPool:
        """The KV pool SGLang sizes for this engine (``patches._kv_pool_from_the_plan``)."""
        return patches.PlannedPool(self.pool_tokens, self.kv_bytes, self.device)

    def sglang_args(self) -> dict[str, Any]:
        """SGLang's server arguments: the plan's (``planner.engine_plan.sglang_args``, the one
        function ``omni-plan`` shows them by) and what this run decides."""
        cuda = self.device.startswith("cuda")
        attention = self.attention_backend
        if attention is None:  # (an engine started outside a plan: gpu_check, tests)
            fp32 = self.dtype == DType.FP32
            attention = (
                attention_backend(self.dtype, None) if not cuda else "triton" if fp32 else None
            )
        args = sglang_args(
            dtype=self.dtype,
            kv_dtype=self.kv_dtype,
            gpu=cuda,
            attention=attention,
            context_length=self.context_length,
            max_running_requests=self.max_running_requests,
            kv_tokens=self.pool_tokens,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
            prompt=self.prompt,
            tp_size=self.tp_size,
            mem_fraction_static=self.mem_fraction_static,
        )
        args["model_path"] = str(self.model_path)
        args["load_format"] = "dummy" if self.random_weights else "auto"
        if self.tp_size > 1:
            # one address for every rank (each builds its own PortArgs:
            # ``distributed/bootstrap.py:233-248``)
            args["dist_init_addr"] = f"127.0.0.1:{self.dist_port}"
        return args


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
        for register in settings.registers:
            register()  # (the family's model classes, before SGLang builds the model)
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
            with patches.planned_pool(settings.planned_pool()):
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
        if self.pool_tokens != settings.pool_tokens:
            self.close()
            raise RuntimeError(
                f"SGLang's KV pool holds {self.pool_tokens} tokens, the plan's "
                f"{settings.pool_tokens}: SGLang rounded the plan's pool (its page size, "
                "server_args.page_size?); give the stage a pool in whole pages"
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
    of file and exits.

    What crosses a pipe is pickled by value (``pickle``, as SGLang's own broadcast of requests
    to its ranks, ``broadcast_pyobj``): a ``Connection``'s pickler would send a request's
    tensors (a clip's or an image's embeddings) as handles to shared memory, which a rank
    process, not of rank 0's multiprocessing family, cannot open (its authentication key is
    another)."""

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
                send(conn, dataclasses.replace(settings, tp_rank=rank, device=device))
        except BaseException:
            self.stop()
            raise

    def send(self, *command: Any) -> None:
        for conn in self.conns:
            send(conn, command)

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                send(conn, ("close",))
            conn.close()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns, self.procs = [], []


def send(conn: Connection, obj: Any) -> None:
    """``obj`` to a rank, pickled by value (``Ranks``)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """What rank 0 sent (``send``)."""
    return pickle.loads(conn.recv_bytes())


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
    """SGLang's ``ServerArgs`` for the engine (``EngineSettings.sglang_args``), with the
    process settings SGLang reads from its environment."""
    from sglang.srt.environ import envs
    from sglang.srt.server_args import ServerArgs

    # the pool is the plan's (patches._kv_pool_from_the_plan): no resize after graph capture
    # by the GPU's free memory (``model_runner_components/kv_pool_runtime.py:59``)
    envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.set(False)
    # no multimodal embedding cache in SGLang's scheduler (100 MB by default, allocated after
    # the pool is sized: ``mem_cache/kv_cache_builder.py:479``): the encoder stages keep
    # their outputs by content themselves (encoder_cache_bytes), in host memory
    envs.SGLANG_VLM_CACHE_SIZE_MB.set(0)
    if not st.device.startswith("cuda"):
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
    return ServerArgs(**st.sglang_args())
