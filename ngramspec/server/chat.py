"""Chat messages -> prompt text: the GGUF's Jinja template, or Gemma's turn format.

The embedded Gemma 3 270M base model has no `tokenizer.chat_template`; then the
Gemma turn format is used (system text is prepended to the first user turn, as
Gemma's own template does). A GGUF template is rendered with jinja2 in a
sandbox, with `add_generation_prompt=True`.
"""
from __future__ import annotations

from functools import lru_cache

from ..errors import ConfigError

GEMMA_FALLBACK = "gemma-turns"


def message_text(content) -> str:
    """A message's content (a string or OpenAI content parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if p.type != "text":
            raise ConfigError(f"message content part of type {p.type!r} is not supported "
                              "(text only: this model has no vision or audio input)")
        parts.append(p.text or "")
    return "".join(parts)


def render_gemma(messages: list[dict]) -> str:
    out, system = [], ""
    for m in messages:
        role, text = m["role"], m["content"]
        if role in ("system", "developer"):
            system += text + "\n\n"
            continue
        turn = "model" if role == "assistant" else "user"
        if turn == "user" and system:
            text, system = system + text, ""
        out.append(f"<start_of_turn>{turn}\n{text.strip() if turn == 'model' else text}<end_of_turn>\n")
    if system:  # only system messages
        out.append(f"<start_of_turn>user\n{system.rstrip()}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return "".join(out)


@lru_cache(maxsize=4)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise ConfigError(f"chat template: {msg}")

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], bos: str = "", eos: str = "") -> str:
    """Prompt text for `messages` (without a leading BOS: tokenization adds it)."""
    if not messages:
        raise ConfigError("'messages' must contain at least one message")
    if not template:
        return render_gemma(messages)
    try:
        text = _compile(template).render(messages=messages, add_generation_prompt=True,
                                         bos_token=bos, eos_token=eos)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"cannot apply the model's chat template: {e}") from None
    if bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def chat_prompt(model, messages) -> str:
    """Prompt text for chat messages (objects with `role` and `content`) with the
    model's template: what /v1/chat/completions and a batch record's `messages` run."""
    msgs = [{"role": m.role, "content": message_text(m.content)} for m in messages]
    return render_chat(model.chat_template, msgs, bos=model.bos_text, eos=model.eos_text)
