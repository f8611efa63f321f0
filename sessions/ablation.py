"""Counterfactual reruns: a recorded call's request parts, as recorded or with sections changed.

Pure: a :class:`~sessions.replay.Replay` and an :class:`Ablation` in, request parts out; no I/O,
no clocks. :func:`ablate` rebuilds a system prompt from a recorded prompt version's sections
with some dropped or their text replaced, through :meth:`Prompt.from_sections`, so it uses the
live joiner and the live rule that an empty section is left out: the ablated prompt is exactly
what the gateway would have built from those sections. :func:`rerun_request` gathers everything
else the recorded call sent (the window of messages, tools, model, params) unchanged.

A v1/v2 prompt has no named sections; replay gives it a single section named ``prompt``, which
can be dropped or replaced as a whole. A call without a recorded prompt cannot be ablated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as evolve
from typing import Any

from sessions.records import (
    CachePlan,
    CallRequest,
    Injected,
    MessageDict,
    Prompt,
    Section,
    ToolSchema,
)
from sessions.replay import Call, PromptVersion, Replay

REASON_RERUN = "rerun"
REASON_ABLATED = "rerun:ablated"


class RerunError(ValueError):
    """The rerun cannot be built as asked. ``available`` names the sections one could use."""

    def __init__(self, message: str, available: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.available = available


@dataclass(frozen=True, slots=True)
class Ablation:
    """Which sections to leave out (``drop``) and which to swap for new text (``replace``)."""

    drop: tuple[str, ...] = ()
    replace: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.drop and not self.replace


@dataclass(frozen=True, slots=True)
class RerunParts:
    """A recorded call's request, ready to send again, in provider-neutral form.

    ``model`` and ``params`` are ``None`` when the log did not record them (v1/v2 logs keep no
    params; a v1 header may not name a model); the caller then supplies its provider's own.
    """

    call: int
    prompt: Prompt
    recorded_fingerprint: str | None
    recorded_text: str | None
    recorded_sections: tuple[str, ...]
    messages: tuple[MessageDict, ...]
    tools: tuple[ToolSchema, ...]
    model: str | None
    params: Mapping[str, Any] | None
    provider: str | None
    dropped: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    cache: CachePlan | None = None
    """The recorded prompt-cache plan, its stable prefix cut to the sections sent."""

    @property
    def changed(self) -> bool:
        """True when the prompt to send differs from the recorded one (or none was recorded)."""
        return self.recorded_text is None or self.prompt.text != self.recorded_text

    def call_request(self, provider: str, model: str, params: Mapping[str, Any],
                     messages: Sequence[MessageDict] | None = None,
                     endpoint: str | None = None) -> CallRequest:
        """The parts as the agent loop hands them to the store, for a rerun log of its own
        (``messages``: what a later call of the rerun sends, after tool rounds; ``endpoint``:
        where it goes, recorded beside the request).

        The messages sent ride in the call entry as ``injected`` messages (sent, but not message
        entries of that log) with an empty window: written as message entries, every assistant
        message among them would close a call of its own, and the rerun would not be call 1.
        """
        return CallRequest(
            prompt=self.prompt,
            reason=REASON_ABLATED if self.dropped or self.replaced else REASON_RERUN,
            tools=self.tools,
            provider=provider,
            model=model,
            params=params,
            window=(),
            injected=tuple(Injected(i, m) for i, m in enumerate(
                self.messages if messages is None else messages)),
            cache=self.cache,
            endpoint=endpoint,
        )


def section_names(version: PromptVersion) -> tuple[str, ...]:
    """Names of a prompt version's sections, in order, each once."""
    return tuple(dict.fromkeys(ref.name for ref in version.sections))


def ablate(
    version: PromptVersion | None,
    drop: Iterable[str] = (),
    replace: Mapping[str, str] | None = None,
) -> Prompt:
    """``version``'s prompt with the sections named in ``drop`` left out and those named in
    ``replace`` given new text. A name matches every section of that name (in practice one).

    Raises :class:`RerunError` for a missing prompt, an unknown name (with the available ones),
    a name both dropped and replaced, or a section whose text the log does not hold.
    """
    dropped = tuple(drop)
    swaps = dict(replace or {})
    if version is None:
        raise RerunError("this call has no recorded system prompt, so it has no sections to "
                         "drop or replace")
    available = section_names(version)
    unknown = [n for n in (*dropped, *swaps) if n not in available]
    if unknown:
        raise RerunError(
            f"unknown section {', '.join(repr(n) for n in dict.fromkeys(unknown))}; "
            f"available: {', '.join(available) or '(none)'}",
            available,
        )
    both = sorted(set(dropped) & set(swaps))
    if both:
        raise RerunError(f"section {', '.join(both)} is both dropped and replaced", available)
    sections: list[Section] = []
    for ref in version.sections:
        if ref.name in dropped:
            continue
        if ref.name in swaps:
            sections.append(Section(ref.name, swaps[ref.name]))
            continue
        if ref.text is None:
            raise RerunError(f"the text of section {ref.name!r} ({ref.hash}) is not in the log",
                             available)
        sections.append(Section(ref.name, ref.text))
    return Prompt.from_sections(sections)


def _recorded_prompt(version: PromptVersion | None) -> Prompt:
    """The prompt a call was sent with, as a :class:`Prompt` whose sections rebuild its text."""
    if version is None:
        # A v1/v2 call before any prompt entry: the rerun sends none (the caller says so).
        return Prompt.from_sections([])
    if version.text is None:
        raise RerunError(f"prompt #{version.number} could not be rebuilt from the log (a "
                         "section is missing); see `gateway replay` problems")
    rebuilt = ablate(version)
    if rebuilt.text == version.text:
        return rebuilt
    # A foreign log joined its sections differently: keep the recorded text byte for byte, as
    # one section, so a saved rerun still rebuilds exactly what was sent.
    return Prompt.from_sections([Section("prompt", version.text)])


def rerun_request(
    replay: Replay,
    call: Call,
    ablation: Ablation | None = None,
    model: str | None = None,
) -> RerunParts:
    """Call ``call``'s recorded request parts, with ``ablation`` applied to its prompt and
    ``model`` (when given) in place of the recorded model."""
    if call.window is None:
        raise RerunError(f"call {call.index}'s request was not recorded "
                         f"({call.prompt_notice or 'no call entry'}); it cannot be rerun")
    if call.prompt is None and replay.version >= 3:
        # Every v3 call names its prompt; a missing one is a gap in the log, not "no prompt".
        raise RerunError(f"call {call.index}'s system prompt is missing from the log "
                         f"({call.prompt_notice}); it cannot be rerun as recorded")
    tools: tuple[ToolSchema, ...] = ()
    if call.tools_fingerprint is not None:
        found = replay.tools_of(call)
        if found is None:
            raise RerunError(f"call {call.index} names tool set {call.tools_fingerprint}, "
                             "which is not in the log")
        tools = tuple(found)
    spec = ablation or Ablation()
    if spec.empty:
        prompt = _recorded_prompt(call.prompt)
    else:
        prompt = ablate(call.prompt, spec.drop, spec.replace)
    version = call.prompt
    header_model = replay.header.get("model")
    recorded_model = call.model or (header_model if isinstance(header_model, str) else None)
    return RerunParts(
        call=call.index,
        prompt=prompt,
        recorded_fingerprint=version.fingerprint if version is not None else None,
        recorded_text=version.text if version is not None else None,
        recorded_sections=tuple(r.name for r in version.sections) if version else (),
        messages=tuple(replay.sent(call)),
        tools=tools,
        model=model or recorded_model or None,
        params=dict(call.params) if call.params is not None else None,
        provider=call.provider,
        dropped=tuple(dict.fromkeys(spec.drop)),
        replaced=tuple(spec.replace),
        cache=(None if call.cache is None
               else evolve(call.cache, system=min(call.cache.system, len(prompt.sections)))),
    )
