"""Request bodies (pydantic). Unknown fields are ignored, as llama-server does;
wrong types and out-of-range values are 400s through `errors.to_api_error`."""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

MAX_CHOICES = 128
SPEC_FIELDS = ("type", "n_max", "n_min", "ngram_size_n", "ngram_size_m")


class SpeculativeParams(BaseModel):
    """`speculative: {...}` (or llama.cpp's flat `"speculative.n_max"` keys)."""

    model_config = ConfigDict(extra="forbid")
    type: StrictStr | None = None  # a spec type, a comma list, or "none"
    n_max: StrictInt | None = None  # cap on draft length (clamped to >= 0)
    n_min: StrictInt | None = None  # shorter drafts are dropped (clamped to [0, n_max])
    ngram_size_n: StrictInt | None = None  # key length (clamped to [1, 1024])
    ngram_size_m: StrictInt | None = None  # drafted length (clamped to [1, 1024])


class Prediction(BaseModel):
    """OpenAI's predicted output: text the answer is expected to repeat (drafts first).
    Token ids are accepted too, as in llama.cpp prompts."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["content"] = "content"
    content: Union[StrictStr, list["ContentPart"], list[StrictInt]]


class _Generation(BaseModel):
    """Fields shared by every generation endpoint (llama-server and OpenAI names)."""

    model_config = ConfigDict(extra="ignore")
    temperature: float | None = None
    top_k: StrictInt | None = Field(None, ge=0)
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: StrictInt | None = Field(None, ge=-1)
    seed: StrictInt | None = Field(None, ge=-1)
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    grammar: StrictStr | None = None
    json_schema: dict[str, Any] | None = None
    speculative: SpeculativeParams | None = None
    cache_prompt: StrictBool = True  # reuse the slot's cached prompt prefix (llama-server)
    prediction: Prediction | None = None
    # [[token|string, bias|false], ...] or {"token id"|string: bias|false} (llama-server, OpenAI)
    logit_bias: list[Any] | dict[str, Any] | None = None
    ignore_eos: StrictBool = False  # bans every end-of-generation token (a -inf logit bias)
    n_probs: StrictInt | None = Field(None, ge=0)  # top-N probabilities per generated token
    post_sampling_probs: StrictBool = False  # probabilities after the sampler chain

    @model_validator(mode="before")
    @classmethod
    def _fold_dotted_speculative(cls, data: Any) -> Any:
        """llama.cpp's `"speculative.n_max": 8` -> `speculative: {"n_max": 8}`."""
        if isinstance(data, dict) and any(isinstance(k, str) and k.startswith("speculative.")
                                          for k in data):
            data = dict(data)
            spec = data.get("speculative")
            spec = dict(spec) if isinstance(spec, dict) else ({} if spec is None else spec)
            if isinstance(spec, dict):
                for k in [k for k in data if isinstance(k, str) and k.startswith("speculative.")]:
                    spec[k.split(".", 1)[1]] = data.pop(k)
                data["speculative"] = spec
        return data

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # llama-server's shortcut


class _OpenAI(_Generation):
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=-1)
    n: StrictInt = Field(1, ge=1, le=MAX_CHOICES)  # independent choices, one job (slot) each
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None


class CompletionRequest(_OpenAI):
    """POST /v1/completions"""

    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0)  # OpenAI: top-N log probabilities per token


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None


class ChatCompletionRequest(_OpenAI):
    """POST /v1/chat/completions"""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=-1)
    tools: list[Any] | None = None
    logprobs: StrictBool | None = None  # OpenAI: return log probabilities of the output tokens
    top_logprobs: StrictInt | None = Field(None, ge=0)  # with logprobs: N most likely per token


class NativeCompletionRequest(_Generation):
    """POST /completion (llama.cpp native)"""

    prompt: Union[StrictStr, list[Union[StrictInt, StrictStr]]]
    n_predict: StrictInt | None = Field(None, ge=-1)
    return_tokens: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0)  # llama-server: n_probs when that is unset
    response_format: ResponseFormat | None = None


Prediction.model_rebuild()
