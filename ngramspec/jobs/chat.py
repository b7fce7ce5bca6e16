"""Chat messages -> prompt text: the GGUF's Jinja template, or Gemma's turn format.

The embedded Gemma 3 270M base model has no `tokenizer.chat_template`; then the
Gemma turn format is used (system text is prepended to the first user turn, as
Gemma's own template does). A GGUF template is rendered with jinja2 in a
sandbox, with `add_generation_prompt=True`.

llama-server's flags choose another template: `--chat-template-file FILE` or
`--chat-template NAME|JINJA` replace the GGUF's. A NAME of llama.cpp's built-in
templates (chatml, llama3, gemma, ...) is rendered by llama.cpp's
`llama_chat_apply_template`; with `--no-jinja` every template goes through it
(llama.cpp recognises a Jinja source by its markers, as llama-server does without
Jinja). `--chat-template-kwargs` adds variables to a Jinja render.
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


@lru_cache(maxsize=1)
def builtin_templates() -> tuple[str, ...]:
    """Names of llama.cpp's built-in chat templates."""
    import ctypes

    from ..llama.backend import _llama

    lc = _llama()
    n = lc.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * max(n, 1))()
    lc.llama_chat_builtin_templates(names, n)
    return tuple(names[i].decode() for i in range(n))


def render_builtin(template: str, messages: list[dict]) -> str:
    """llama.cpp's own rendering (`llama_chat_apply_template`) of a built-in template
    name, or of a template source it recognises; ConfigError if it recognises none."""
    import ctypes

    from ..llama.backend import _llama

    lc = _llama()
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (lc.llama_chat_message * len(keep))(*[lc.llama_chat_message(r, c) for r, c in keep])
    tmpl = template.encode()
    size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_chat_apply_template(tmpl, chat, len(keep), True, buf, size)
        if n < 0:
            shown = template if len(template) < 40 else template[:37] + "..."
            raise ConfigError(f"chat template {shown!r} is not one llama.cpp knows without "
                              f"Jinja; built-in names: {', '.join(builtin_templates())}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    raise ConfigError("llama_chat_apply_template kept growing its output")  # pragma: no cover


def render_chat(template: str | None, messages: list[dict], bos: str = "", eos: str = "",
                jinja: bool = True, extra: dict | None = None, continue_final: bool = False) -> str:
    """Prompt text for `messages` (without a leading BOS: tokenization adds it).

    `template`: None (Gemma's turn format), a built-in name, or a Jinja source;
    `jinja=False` renders every template with llama.cpp's built-in formats.
    continue_final: the last (assistant) message is left open for the model to go on
    with, no generation prompt after it (llama-server's assistant prefill)."""
    if not messages:
        raise ConfigError("'messages' must contain at least one message")
    if not template:
        if continue_final:
            return render_gemma(messages[:-1]) + messages[-1]["content"]
        return render_gemma(messages)
    if not jinja or template in builtin_templates():
        text = render_builtin(template, messages)
        return text[len(bos):] if bos and text.startswith(bos) else text
    try:
        text = _compile(template).render(**(extra or {}), messages=messages,
                                         add_generation_prompt=not continue_final,
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


def chat_prompt(model, messages, settings=None, continue_final: bool = False) -> str:
    """Prompt text for chat messages (objects with `role` and `content`) with the
    model's template, or the one the server's flags chose (`settings`: a
    ServerSettings): what /v1/chat/completions and a batch record's `messages` run."""
    msgs = [{"role": m.role, "content": message_text(m.content)} for m in messages]
    template, jinja, extra = model.chat_template, True, None
    if settings is not None:
        template = chosen_template(settings) or template
        jinja, extra = settings.jinja, settings.chat_template_kwargs
    return render_chat(template, msgs, bos=model.bos_text, eos=model.eos_text, jinja=jinja,
                       extra=extra, continue_final=continue_final)


def chosen_template(settings) -> str | None:
    """The template --chat-template-file / --chat-template name (None: the model's)."""
    if settings.chat_template_file:
        return _read_template(settings.chat_template_file)
    return settings.chat_template or None


@lru_cache(maxsize=4)
def _read_template(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read --chat-template-file {path}: {e.strerror}") from None


def check_template(settings) -> None:
    """Raise ConfigError now (at start-up, as llama-server) if the template chosen by
    --chat-template/-file cannot render a one-message chat."""
    template = chosen_template(settings)
    if template:
        render_chat(template, [{"role": "user", "content": "test"}], jinja=settings.jinja,
                    extra=settings.chat_template_kwargs)
