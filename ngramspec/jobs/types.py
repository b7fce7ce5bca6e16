"""Request bodies (pydantic). Unknown fields are ignored, as llama-server does;
wrong types and out-of-range values are 400s through `errors.to_api_error`."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from ..settings.config import SpecConfig, check_draft_model
from ..settings.sampling import bounds

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on `top_logprobs`
#: more candidates per token than this is refused (llama-server clamps to the vocabulary;
#: thousands of entries per generated token only make the response huge)
MAX_N_PROBS = 1024
#: llama-server reads integer fields as int32: a larger value is a 400, not a wrap-around
Int32 = Annotated[StrictInt, Field(ge=-(1 << 31), le=(1 << 31) - 1)]
SPEC_FIELDS = ("type", "n_max", "n_min", "p_min", "ngram_size_n", "ngram_size_m", "ngram_min_hits")


class SpeculativeParams(BaseModel):
    """`speculative: {...}` (or llama.cpp's flat `"speculative.n_max"` keys)."""

    model_config = ConfigDict(extra="forbid")
    type: StrictStr | None = None  # a spec type, a comma list, or "none"
    n_max: Int32 | None = None  # cap on draft length (clamped to >= 0)
    n_min: Int32 | None = None  # shorter drafts are dropped (clamped to [0, n_max])
    p_min: float | None = Field(None, ge=0.0, le=1.0)  # -md model: least top probability to draft
    ngram_size_n: Int32 | None = None  # key length (clamped to [1, 1024])
    ngram_size_m: Int32 | None = None  # drafted length (clamped to [1, 1024])
    ngram_min_hits: Int32 | None = None  # map-k/-k4v: key hits before drafting ([1, 65535])

    def apply(self, base: SpecConfig, has_draft_model: bool) -> SpecConfig:
        """`base` with these fields applied (SpecConfig.override); ConfigError for a
        draft-model type on an engine without a draft model (config.check_draft_model).
        The one reading of a request's or record's `speculative` object."""
        check_draft_model(self.type, has_draft_model)
        return base.override(**self.model_dump(exclude_none=True))


class Prediction(BaseModel):
    """OpenAI's predicted output: text the answer is expected to repeat (drafts first).
    Token ids are accepted too, as in llama.cpp prompts."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["content"] = "content"
    content: Union[StrictStr, list["ContentPart"], list[StrictInt]]


class PromptObject(BaseModel):
    """llama-server's `{"prompt_string": ...}` element of a batch of prompts."""

    model_config = ConfigDict(extra="ignore")
    prompt_string: Union[StrictStr, list[Union[StrictInt, StrictStr]]]
    multimodal_data: list[Any] | None = None  # refused: this server has no media input


#: a string, token ids, a mixed list of both, an object, or a batch (a list of those)
Prompt = Union[StrictStr, PromptObject,
               list[Union[StrictInt, StrictStr, list[Union[StrictInt, StrictStr]], PromptObject]]]


class OtherSamplers(BaseModel):
    """llama-server's other samplers, as request fields (None: the default; the ranges
    are SamplingParams' own, `settings/sampling.RANGES`): every generation endpoint and
    every batch record take them (`jobs/samplers.other_samplers` reads them)."""

    dry_multiplier: float | None = None
    dry_base: float | None = None  # below 1.0: the default
    dry_allowed_length: Int32 | None = Field(None, **bounds("dry_allowed_length"))
    dry_penalty_last_n: Int32 | None = Field(None, **bounds("dry_penalty_last_n"))  # -1: all
    dry_sequence_breakers: list[StrictStr] | None = Field(None, min_length=1)
    xtc_probability: float | None = Field(None, **bounds("xtc_probability"))
    xtc_threshold: float | None = Field(None, **bounds("xtc_threshold"))
    typical_p: float | None = None
    top_n_sigma: float | None = None
    mirostat: Int32 | None = Field(None, **bounds("mirostat"))
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    min_keep: Int32 | None = Field(None, **bounds("min_keep"))
    samplers: list[StrictStr] | StrictStr | None = None  # names, or a string of letters


class _Generation(OtherSamplers):
    """Fields shared by every generation endpoint (llama-server and OpenAI names)."""

    model_config = ConfigDict(extra="ignore")
    temperature: float | None = None
    top_k: Int32 | None = Field(None, **bounds("top_k"))
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = Field(None, **bounds("frequency_penalty"))
    presence_penalty: float | None = Field(None, **bounds("presence_penalty"))
    repeat_last_n: Int32 | None = Field(None, **bounds("repeat_last_n"))
    penalty_last_n: Int32 | None = Field(None, **bounds("repeat_last_n"))  # llama.cpp's name
    seed: StrictInt | None = Field(None, ge=-1, le=0xFFFFFFFF)  # uint32; -1: random
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    grammar: StrictStr | None = None
    json_schema: dict[str, Any] | None = None
    speculative: SpeculativeParams | None = None
    cache_prompt: StrictBool | None = None  # reuse the slot's cached prefix (None: --cache-prompt)
    prediction: Prediction | None = None
    timings_per_token: StrictBool = False  # `timings` in every streamed chunk
    return_progress: StrictBool = False  # `prompt_progress` chunks while streaming
    verbose: StrictBool | None = None  # `__verbose` (the native result); default: --verbose
    id_slot: Int32 = Field(-1, ge=-1)  # run in this slot (modulo the slot count); -1: any
    n_keep: Int32 | None = Field(None, ge=-1)  # context shift: tokens kept (None: --keep)
    n_discard: Int32 = Field(0, ge=0)  # context shift: tokens dropped (0: half the rest)
    # [[token|string, bias|false], ...] or {"token id"|string: bias|false} (llama-server, OpenAI)
    logit_bias: list[Any] | dict[str, Any] | None = None
    ignore_eos: StrictBool | None = None  # bans every EOG token (a -inf bias); None: --ignore-eos
    # top-N probabilities of every generated token (0: none; clamped to the vocabulary)
    n_probs: Int32 | None = Field(None, ge=0, le=MAX_N_PROBS)
    post_sampling_probs: StrictBool = False  # probabilities after the sampler chain
    # independent choices, one job (slot) each: llama-server's `n_cmpl`, or OpenAI's `n`
    n_cmpl: Int32 | None = None
    n: Int32 | None = None

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
    max_tokens: Int32 | None = Field(None, ge=-1)
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None


class CompletionRequest(_OpenAI):
    """POST /v1/completions"""

    prompt: Prompt
    echo: StrictBool = False
    logprobs: StrictInt | StrictBool | None = None  # OpenAI's legacy form: n_probs


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
    max_completion_tokens: Int32 | None = Field(None, ge=-1)
    tools: list[Any] | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None  # vLLM's name for the assistant prefill
    logprobs: StrictBool | None = None  # report probabilities (n_probs = top_logprobs or 20)
    top_logprobs: Int32 | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs


class NativeCompletionRequest(_Generation):
    """POST /completion (llama.cpp native)"""

    prompt: Prompt
    n_predict: Int32 | None = Field(None, ge=-1)
    return_tokens: StrictBool = False
    response_fields: list[StrictStr] | None = None  # only these fields ('/' paths)
    response_format: ResponseFormat | None = None
    logprobs: StrictInt | StrictBool | None = None  # llama-server's alias of n_probs


Prediction.model_rebuild()


class TokenizeRequest(BaseModel):
    """POST /tokenize: `content` is text or llama.cpp's mixed list of text and token ids."""

    model_config = ConfigDict(extra="ignore")
    content: Union[StrictStr, list[Union[StrictInt, StrictStr]]] | None = None
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(BaseModel):
    """POST /detokenize"""

    model_config = ConfigDict(extra="ignore")
    tokens: list[StrictInt] = Field(default_factory=list)
