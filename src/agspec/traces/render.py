"""Render calls to token ids: one chat template (ChatML, as Qwen2.5 uses) for every drafter.

The prompt of a call with messages `m_1 .. m_k` is

    <|im_start|>{m_1.role}\\n{m_1.content}<|im_end|>\\n
    ...
    <|im_start|>{m_k.role}\\n{m_k.content}<|im_end|>\\n
    <|im_start|>assistant\\n

(written here on several lines; the ids are one sequence, and `\\n` is a newline)

with `<|im_start|>` / `<|im_end|>` inserted as their ids (never encoded from text: a trace
that quotes them is encoded as text) and each text segment between them, `{role}\\n{content}`
and `\\n`, encoded as ordinary text, exactly as a Hugging Face ChatML template tokenizes it.
No system message is added when the call has none. The output ids are the ordinary-text
ids of `call.output`; with `end_token=True` the model's final `<|im_end|>` is appended.

Segments are cached per tokenizer (keyed by text, bounded by `max_cached_tokens`, least
recently used dropped first): agents resend their history, so most of every prompt is a
cache hit.

>>> from agspec.traces.schema import Call, Message
>>> call = Call("agent", "code", 0, [Message("system", "Be brief."), Message("user", "hi")], "ok")
>>> prompt_ids, output_ids = render_call(call, "qwen2.5")
>>> prompt_ids[:3], prompt_ids[-3:], output_ids
([151644, 8948, 198], [151644, 77091, 198], [562])
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

from agspec.tokenizers import Tokenizer, get_tokenizer
from agspec.traces.schema import Artifact, Call, Message

__all__ = ["Renderer", "render_call", "render_artifacts", "get_renderer"]


class Renderer:
    """ChatML rendering with a per-text token cache for one tokenizer."""

    def __init__(
        self, tokenizer: Tokenizer | str = "qwen2.5", *, max_cached_tokens: int = 20_000_000
    ):
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self.tokenizer = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.max_cached_tokens = max_cached_tokens
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._cached_tokens = 0
        self._newline = array("i", self.tokenizer.encode("\n"))
        self._assistant_head = array("i", self.tokenizer.encode("assistant\n"))

    def encode(self, text: str) -> array[int]:
        """Ordinary-text ids of `text`, from the cache when seen before (do not mutate)."""
        ids = self._cache.get(text)
        if ids is not None:
            self._cache.move_to_end(text)
            return ids
        ids = array("i", self.tokenizer.encode(text))
        if len(ids) <= self.max_cached_tokens:
            self._cache[text] = ids
            self._cached_tokens += len(ids)
            while self._cached_tokens > self.max_cached_tokens:
                _, old = self._cache.popitem(last=False)
                self._cached_tokens -= len(old)
        return ids

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """ChatML prompt ids of `messages`, ending with `<|im_start|>assistant\\n`."""
        tok = self.tokenizer
        out = array("i")
        for m in messages:
            out.append(tok.im_start_id)
            out.extend(self.encode(f"{m.role}\n{m.content}"))
            out.append(tok.im_end_id)
            out.extend(self._newline)
        out.append(tok.im_start_id)
        out.extend(self._assistant_head)
        return out.tolist()

    def render_call(self, call: Call, *, end_token: bool = False) -> tuple[list[int], list[int]]:
        """`(prompt_ids, output_ids)` of a call."""
        output = self.tokenizer.encode(call.output)
        if end_token:
            output.append(self.tokenizer.im_end_id)
        return self.prompt_ids(call.messages), output

    def count_call(self, call: Call) -> tuple[int, int]:
        """`(num_prompt_tokens, num_output_tokens)` without building the id lists."""
        per_message = 2 + len(self._newline)
        n = sum(len(self.encode(f"{m.role}\n{m.content}")) + per_message for m in call.messages)
        return n + 1 + len(self._assistant_head), len(self.tokenizer.encode(call.output))

    def artifact_ids(self, artifacts: Sequence[Artifact]) -> list[tuple[str, list[int]]]:
        """`(path, ordinary-text ids of the artifact's text)` for each artifact."""
        return [(a.path, self.encode(a.text).tolist()) for a in artifacts]


_renderers: dict[str, Renderer] = {}


def get_renderer(tokenizer: Tokenizer | str = "qwen2.5") -> Renderer:
    """The shared cached `Renderer` of a tokenizer (by name or object)."""
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    r = _renderers.get(tok.name)
    if r is None or r.tokenizer is not tok:
        r = _renderers[tok.name] = Renderer(tok)
    return r


def render_call(
    call: Call, tokenizer: Tokenizer | str = "qwen2.5", *, end_token: bool = False
) -> tuple[list[int], list[int]]:
    """`(prompt_ids, output_ids)` of `call` under the ChatML template (see module docstring)."""
    return get_renderer(tokenizer).render_call(call, end_token=end_token)


def render_artifacts(
    call: Call, tokenizer: Tokenizer | str = "qwen2.5"
) -> list[tuple[str, list[int]]]:
    """`(path, token ids)` of each artifact the call opened."""
    return get_renderer(tokenizer).artifact_ids(call.artifacts)
