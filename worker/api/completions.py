"""POST /v1/completions: OpenAI's (legacy) text completion, as vLLM and SGLang serve it. The
prompt is continued as it is, without the chat template (text, or token ids), through the same
thinker and decode stages as a chat; one request may hold several prompts, each with ``n``
choices (ordered by prompt, then choice). Every sampling field of a chat is honoured; ``echo``
puts a text prompt before its completion; ``logprobs`` (0-5) gives each token's log
probability and its likeliest alternatives. What cannot be served is refused with a 400 naming
the field: ``suffix`` (no fill-in-the-middle), ``best_of`` above ``n`` (nothing is ranked),
``echo`` with ``logprobs`` (the prompt's own log probabilities are not computed) or with a
prompt of token ids."""

from __future__ import annotations

import dataclasses

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from fleet.errors import error_body
from fleet.records import Endpoint
from worker.api.common import (
    closed_response,
    read_json,
    service_of,
    session_of,
)
from worker.api.errors import stage_error
from worker.api.generation import Collected, merged_events
from worker.api.limits import check_max_tokens
from worker.api.replay import created, reply_id
from worker.api.schemas import COMPLETION_MAX_PROMPTS, CompletionRequest
from worker.api.textgen import (
    bad,
    choices,
    collect_all,
    event_stream,
    refuse_unserved,
    sampling_of,
    sse,
    stops,
    usage,
)
from worker.contract.pipeline import (
    Finished,
    GenerationRequest,
    RequestKind,
    StageFailed,
    TextDelta,
    TokenLogprob,
)
from worker.service import Ticket, WorkerService

router = APIRouter()


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """The request's prompts, each a text or a list of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad("prompt is empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]  # type: ignore[list-item]  # one prompt of token ids
    if len(prompt) > COMPLETION_MAX_PROMPTS:
        raise bad(f"at most {COMPLETION_MAX_PROMPTS} prompts in one request", "prompt")
    return list(prompt)  # type: ignore[arg-type]


def _check(body: CompletionRequest, prompts: list[str | list[int]]) -> None:
    if body.suffix:
        raise bad("suffix is not served: this model does not fill in the middle", "suffix")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise bad("best_of is served only equal to n (choices are not ranked)", "best_of")
    refuse_unserved(body)
    if body.echo and body.logprobs is not None:
        raise bad("echo with logprobs is not served (the prompt's are not computed)", "echo")
    if body.echo and any(not isinstance(p, str) for p in prompts):
        raise bad("echo needs text prompts (not token ids)", "echo")
    for i, p in enumerate(prompts):
        if not p:
            raise bad("a prompt is empty", "prompt" if len(prompts) == 1 else f"prompt.{i}")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request, CompletionRequest)
    service.check_serves(body.model, Endpoint.COMPLETIONS)
    prompts = _prompts(body.prompt)
    _check(body, prompts)
    check_max_tokens(service.spec, body.max_tokens, "max_tokens")
    n = body.n or 1
    stop = stops(body.stop)
    session = session_of(request, body.user)
    ticket = service.admit(session, RequestKind.COMPLETION, requests=len(prompts) * n)
    first = GenerationRequest(
        request_id=reply_id(request, "cmpl"),
        kind=RequestKind.COMPLETION,
        sampling=sampling_of(request, body),
        stop=stop,
        logprobs=body.logprobs,
        max_tokens=body.max_tokens,
        session_id=session,
    )
    gens = [
        g
        for p in prompts
        for g in choices(
            dataclasses.replace(
                first,
                text=p if isinstance(p, str) else "",
                prompt_ids=None if isinstance(p, str) else list(p),
            ),
            n,
        )
    ]
    echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts for _ in range(n)]
    at = created(request)
    if body.stream:
        return event_stream(_stream(service, body, gens, echoes, n, ticket, at), ticket)
    results = await collect_all(request, service, gens, ticket)
    if results is None:
        return closed_response()
    finished = [r.finished or Finished("stop") for r in results]
    return Response(
        orjson.dumps(
            {
                "id": first.request_id,
                "object": "text_completion",
                "created": at,
                "model": body.model,
                "choices": [_choice(i, r, echoes[i], body.logprobs) for i, r in enumerate(results)],
                "usage": usage(finished[::n], finished),
            }
        ),
        media_type="application/json",
    )


def _choice(index: int, result: Collected, echo: str, logprobs: int | None) -> dict:
    return {
        "index": index,
        "text": echo + "".join(result.text),
        "logprobs": None if logprobs is None else _logprobs_json(result.logprobs, len(echo)),
        "finish_reason": result.finish_reason,
    }


def _logprobs_json(entries: list[TokenLogprob], offset: int) -> dict:
    """OpenAI's legacy ``logprobs``: the tokens, their log probabilities, the likeliest
    alternatives of each (the chosen token among them) and where each starts in the text."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{**dict(e.top), e.token: e.logprob} for e in entries],
        "text_offset": offsets,
    }


async def _stream(
    service: WorkerService,
    body: CompletionRequest,
    gens: list[GenerationRequest],
    echoes: list[str],
    n: int,
    ticket: Ticket,
    created: int,
):
    def chunk(index: int, text: str, reason: str | None = None, logprobs: dict | None = None):
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return sse(
            {
                "id": gens[0].request_id,
                "object": "text_completion",
                "created": created,
                "model": body.model,
                "choices": [choice],
            }
        )

    finished = [Finished("stop") for _ in gens]
    offsets = [len(e) for e in echoes]  # where each choice's next text starts
    done = False
    try:
        for i, echo in enumerate(echoes):
            if echo:
                yield chunk(i, echo)
        async with merged_events(service, gens) as stream:
            async for i, event in stream:
                if isinstance(event, TextDelta):
                    ticket.text()
                    entries = None
                    if body.logprobs is not None:
                        entries = _logprobs_json(event.logprobs or [], offsets[i])
                    offsets[i] += len(event.text)
                    yield chunk(i, event.text, None, entries)
                elif isinstance(event, Finished):
                    finished[i] = event
        service.metrics.tokens_out.inc(sum(f.completion_tokens for f in finished))
        for i, f in enumerate(finished):
            yield chunk(i, "", f.finish_reason)
        if body.stream_options is not None and body.stream_options.include_usage:
            yield sse(
                {
                    "id": gens[0].request_id,
                    "object": "text_completion",
                    "created": created,
                    "model": body.model,
                    "choices": [],
                    "usage": usage(finished[::n], finished),
                }
            )
        done = True
    except StageFailed as exc:
        yield sse(error_body(*stage_error(exc)))
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
    yield sse("[DONE]")
