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


def render_chat(template: str | None, messages: list[dict], bos: str = "", eos: str = "",
                continue_final: bool = False) -> str:
    """Prompt text for `messages` (without a leading BOS: tokenization adds it).

    continue_final: the last (assistant) message is left open for the model to go on
    with, no generation prompt after it (llama-server's assistant prefill)."""
    if not messages:
        raise ConfigError("'messages' must contain at least one message")
    if not template:
        if continue_final:
            return render_gemma(messages[:-1]) + messages[-1]["content"]
        return render_gemma(messages)
    try:
        text = _compile(template).render(messages=messages, add_generation_prompt=not continue_final,
                                         bos_token=bos, eos_token=eos)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"cannot apply the model's chat template: {e}") from None
    if bos and text.startswith(bos):
        text = text[len(bos):]
    if continue_final:  # cut the template's end-of-turn after the last message's text
        last = messages[-1]["content"].rstrip()
        at = text.rfind(last) if last else -1
        if at >= 0:
            text = text[:at + len(last)]
    return text


def continues_final(roles: list[str], add_generation_prompt: bool | None,
                    continue_final_message: bool | None) -> bool:
    """Whether the prompt continues the last message, by llama-server's rules: a trailing
    assistant message is a prefill unless the request says otherwise; two trailing
    assistant messages, or both flags true, are a client error."""
    if continue_final_message is None and roles and roles[-1] == "assistant":
        if len(roles) >= 2 and roles[-2] == "assistant":
            raise ConfigError("Cannot have 2 or more assistant messages at the end of the list.")
        return True
    if continue_final_message and add_generation_prompt:
        raise ConfigError("Cannot set both add_generation_prompt and continue_final_message "
                          "to true.")
    if continue_final_message and (not roles or roles[-1] != "assistant"):
        raise ConfigError("continue_final_message needs an assistant message last")
    return bool(continue_final_message)


def chat_prompt(model, messages, continue_final: bool = False) -> str:
    """Prompt text for chat messages (objects with `role` and `content`) with the
    model's template: what /v1/chat/completions and a batch record's `messages` run."""
    msgs = [{"role": m.role, "content": message_text(m.content)} for m in messages]
    return render_chat(model.chat_template, msgs, bos=model.bos_text, eos=model.eos_text,
                       continue_final=continue_final)
