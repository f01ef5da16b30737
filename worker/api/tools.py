"""Function calling on ``/v1/chat/completions``: ``tools``, ``tool_choice``,
``parallel_tool_calls``, and the ``tool`` role and assistant ``tool_calls`` in the history.

The tools go into the prompt through the checkpoint's own chat template (Qwen's: a ``# Tools``
system section listing them in ``<tools>``, calls written as ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, results given back as ``<tool_response>`` in a user turn).
Then, by ``tool_choice``:

- ``auto`` (the default with tools): the model writes freely; every ``<tool_call>`` block of
  its reply that holds a call to a listed function is taken out of the text into
  ``tool_calls`` (``finish_reason: "tool_calls"``); a block that is not one stays text, as
  vLLM's Hermes parser does, and so does a call of a ``strict`` function whose arguments do
  not fit its ``parameters`` (checked with ``jsonschema``: strict calls always fit).
  ``parallel_tool_calls: false`` ends the reply at its first call.
- ``required``, or a named function: the reply is held by constrained decoding (xgrammar) to one
  call whose ``name`` is a listed function (the named one) and whose ``arguments`` fit that
  function's ``parameters`` schema; it is returned as ``tool_calls`` only.
- ``none``: the tools are in the prompt and the reply is text.

Streamed, text goes out as it comes except what may begin a ``<tool_call>``; each call goes
out whole in one ``tool_calls`` delta once its block (or the constrained reply) is complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleet.errors import ErrorCode, OmniError
from worker.api.schemas import ChatRequest, Message
from worker.contract.grammar import Grammar, check_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_ANY_OBJECT: dict = {"type": "object"}


def _bad(message: str, param: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


@dataclass(frozen=True, slots=True)
class ToolUse:
    """What a request asks of the tools: the template's ``tools``, and how calls are made."""

    tools: list[dict]  # OpenAI's {type, function: {name, description, parameters}}
    choice: str  # "auto" | "required" | "none" | "named"
    named: str | None = None
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def fits(self, name: str, arguments: Any) -> bool:
        """A ``strict`` function's call must fit its parameters; any other call does."""
        function = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        if not function.get("strict") or not function.get("parameters"):
            return True
        import jsonschema

        return jsonschema.Draft202012Validator(function["parameters"]).is_valid(arguments)

    def stops(self) -> tuple[str, ...]:
        """``parallel_tool_calls: false`` with ``auto``: the reply ends at its first call."""
        return (CLOSE,) if self.choice == "auto" and not self.parallel else ()

    def grammar(self) -> Grammar | None:
        """``required`` / named: one call of a listed function, its arguments fitting."""
        if not self.constrained:
            return None
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": t["function"].get("parameters") or _ANY_OBJECT,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
            if self.named is None or t["function"]["name"] == self.named
        ]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return Grammar("json_schema", orjson.dumps(schema).decode())


class ToolsRefused(ValueError):
    """Tools that cannot be used as asked: the message, and the field as a path below the
    request's tools (``tools``, ``tool_choice``, or ``parameters`` of the tool at ``index``);
    chat and realtime each name the field in their own shape."""

    def __init__(self, message: str, field: str, index: int | None = None) -> None:
        super().__init__(message)
        self.field, self.index = field, index


def checked_tool_use(
    tools: list[dict], choice: str, named: str | None, parallel: bool, grammars_available: bool
) -> ToolUse:
    """``tools`` in chat's shape (``{type, function: {name, ...}}``) with their choice, checked
    as chat and realtime both check them; ``ToolsRefused`` for what cannot hold."""
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ToolsRefused("tool function names must be unique", "tools")
    if named is not None and named not in names:
        raise ToolsRefused(
            f"tool_choice names {named!r}, which is not among the tools", "tool_choice"
        )
    use = ToolUse(tools, choice, named, parallel)
    if use.constrained:
        if not grammars_available:
            raise ToolsRefused(
                "tool_choice required or a named function needs xgrammar on this worker "
                "(pip install 'omni-fleet[worker]')",
                "tool_choice",
            )
        for i, t in enumerate(tools):
            if t["function"].get("parameters") is not None:
                try:
                    check_schema(t["function"]["parameters"])
                except ValueError as exc:
                    raise ToolsRefused(f"cannot be held to: {exc}", "parameters", i) from None
    return use


def tool_use(body: ChatRequest, grammars_available: bool) -> ToolUse | None:
    """The request's tools, checked (None: no tools); a 400 naming the field otherwise."""
    if not body.tools:
        if body.tool_choice not in (None, "none"):
            raise _bad("tool_choice needs tools", "tool_choice")
        if body.parallel_tool_calls is not None:
            raise _bad("parallel_tool_calls needs tools", "parallel_tool_calls")
        return None
    choice, named = "auto", None
    if isinstance(body.tool_choice, str):
        choice = body.tool_choice
    elif body.tool_choice is not None:
        choice, named = "named", body.tool_choice.function.name
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    try:
        use = checked_tool_use(
            tools, choice, named, body.parallel_tool_calls is not False, grammars_available
        )
    except ToolsRefused as refused:
        if refused.index is None:
            raise _bad(str(refused), refused.field) from None
        param = f"tools.{refused.index}.function.{refused.field}"
        raise _bad(f"{param} {refused}", param) from None
    forced_format = body.response_format is not None and body.response_format.type != "text"
    if use.constrained and forced_format:
        raise _bad("response_format and a forced tool call cannot both hold", "tool_choice")
    return use


def history(message: Message) -> dict:
    """A ``tool`` message, or an assistant message with ``tool_calls``, as the template takes
    it (arguments as the JSON text the client sent)."""
    out: dict = {"role": message.role, "content": message.content or ""}
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


@dataclass
class Calls:
    """One choice's reply as text and calls: fed its text as it comes, it says what can go to
    the client now (``feed``), and at the end what is left (``finish``)."""

    use: ToolUse
    call_id: Any  # index -> a call id, the same on a replay (worker.api.replay)
    calls: list[dict] = field(default_factory=list)
    buffer: str = ""  # text not sent yet: a block in progress, or what may begin one

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(text to send, calls completed) after ``text`` more of the reply."""
        self.buffer += text
        if self.use.constrained:
            return "", []
        sent = ""
        done: list[dict] = []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = _partial_open(self.buffer)
                sent += self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep :]
                return sent, done
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                sent += self.buffer[:start]
                self.buffer = self.buffer[start:]
                return sent, done
            block = self.buffer[start + len(OPEN) : end]
            call = self._call(block)
            if call is None:  # not a call of a listed function: it stays text
                sent += self.buffer[: end + len(CLOSE)]
            else:
                sent += self.buffer[:start]
                done.append(call)
            self.buffer = self.buffer[end + len(CLOSE) :]

    def finish(self) -> tuple[str, list[dict]]:
        """(text left, calls left) at the end of the reply."""
        rest, self.buffer = self.buffer, ""
        if self.use.constrained:
            call = self._call(rest, forced=True)
            return ("", [call]) if call is not None else (rest, [])
        if rest.startswith(OPEN):  # a last block cut by its stop or the token limit
            call = self._call(rest[len(OPEN) :])
            if call is not None:
                return "", [call]
        return rest, []

    def _call(self, block: str, forced: bool = False) -> dict | None:
        try:
            doc = json.loads(block)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("name") not in self.use.names:
            return None
        arguments = doc.get("arguments", {})
        if not forced and (
            not isinstance(arguments, dict) or not self.use.fits(doc["name"], arguments)
        ):
            return None
        index = len(self.calls)
        call = {
            "id": self.call_id(index),
            "type": "function",
            "function": {"name": doc["name"], "arguments": json.dumps(arguments)},
        }
        self.calls.append(call)
        return call

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls else reason


def _partial_open(text: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``<tool_call>``."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0
