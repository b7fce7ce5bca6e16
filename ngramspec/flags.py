"""llama.cpp's command line, defined once (llama-cpp-python's `server/settings.py` style).

`FLAGS` is the one table of every flag the commands share: its names (short and
long aliases as llama.cpp spells them), type, default, help, destination, the
commands that take it and where its value goes:

- `model`: how the model and its llama.cpp context are loaded (`load_engine`);
- `sampling` / `request`: the defaults of every request (SamplingParams, n_predict);
- `spec`: the speculation config (generated from `config.SPEC_OPTIONS`);
- `server`: HTTP server behaviour (`ServerSettings`);
- `noop`: accepted silently: ngramspec already does what the flag asks (`--offline`:
  nothing is ever downloaded; `--cont-batching`: slots are always batched);
- `ignored`: llama-server flags with no meaning here (GPU split, mmproj, router,
  LoRA, ...): accepted, and one warning line on stderr says so.

Invariants:
- `options(command)` generates a command's click options from the table, so a flag
  is spelled, typed and documented once; `ServerSettings` gets its fields from the
  same table (`settings_fields`).
- `serve` accepts every flag llama-server has (common/arg.cpp, examples SERVER and
  COMMON), with llama.cpp's arity, so a llama-server command line parses unchanged
  (`--foo_bar` is `--foo-bar`, as in llama.cpp). Multi-letter short flags (`-fa`,
  `-np`, `-ngl`) are whole options: `-fa off` is never `-f a`.
- A flag whose value would break exactness is still accepted; `runtime.context_params`
  keeps exactness and says what it did (docs/exactness.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Callable, Iterable

import click

from . import strict_json
from .config import SPEC_OPTIONS, SpecConfig, spec_config_from_options, uses_draft_model, valid_types_text
from .errors import ConfigError
from .model import KV_TYPES, LOAD_MODES, kv_type_name

ALL = frozenset({"generate", "serve", "bench", "batch"})
GEN = frozenset({"generate", "serve", "batch"})  # commands that sample text for requests
SERVE = frozenset({"serve"})
#: click context settings of a command that takes llama.cpp flags
CONTEXT_SETTINGS = {"token_normalize_func": lambda name: name.replace("_", "-"),
                    "help_option_names": ["-h", "--help", "--usage"]}


@dataclass(frozen=True)
class Flag:
    """One flag. `names`: every spelling (first long name is canonical); `neg`: the
    spellings that turn an on/off flag off; `switch`: takes no value; `field`: the
    ServerSettings field (default: dest); `parse`: str -> value, applied by click and
    by ServerSettings; `defaults`: per-command default overrides; `note`: the warning
    printed when the flag is given and `warn(value)` holds."""

    names: tuple[str, ...]
    dest: str
    target: str
    type: Any = str
    default: Any = None
    help: str = ""
    commands: frozenset = SERVE
    neg: tuple[str, ...] = ()
    switch: bool = False
    field: str | None = None
    parse: Callable[[Any], Any] | None = None
    defaults: tuple[tuple[str, Any], ...] = ()
    note: str | None = None
    warn: Callable[[Any], bool] = lambda value: True
    envvar: tuple[str, ...] = ()
    multiple: bool = False
    join: bool = True  # a repeated flag reads as one comma list (False: a tuple of values)
    metavar: str | None = None
    nargs: int = 1

    @property
    def name(self) -> str:
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    @property
    def settings_field(self) -> str:
        return self.field or self.dest

    def default_for(self, command: str) -> Any:
        return dict(self.defaults).get(command, self.default)


# ------------------------------------------------------------------ value parsers


def csv(value: Any) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c') (llama.cpp's comma lists)."""
    if value is None:
        return ()
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


def csv_set(value: Any) -> tuple[str, ...]:
    """A comma list as llama.cpp keeps it in a std::set: unique, sorted ('b,a,b' -> ('a', 'b'))."""
    return tuple(sorted(set(csv(value))))


def gpu_layers(value: Any) -> int:
    """-ngl N | auto | all -> llama_model_params.n_gpu_layers (negative: all)."""
    if isinstance(value, int):
        return value
    v = str(value).strip().lower()
    if v in ("auto", "all"):
        return -1
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"-ngl/--n-gpu-layers takes a number, 'auto' or 'all', got {value!r}") from None


def json_object(value: Any) -> dict:
    if value is None or isinstance(value, dict):
        return value or {}
    obj = strict_json.loads(value, "--chat-template-kwargs")
    if not isinstance(obj, dict):
        raise ConfigError("--chat-template-kwargs must be a JSON object")
    return obj


def synth_rates(value: Any) -> tuple[float, ...]:
    """llama.cpp's --spec-synth-rates check: finite, in [0, 1], non-increasing."""
    from .synth import check_rates

    try:
        rates = tuple(float(x) for x in csv(value))
    except ValueError:
        raise ConfigError(f"--spec-synth-rates takes numbers like 0.8,0.6, got {value!r}") from None
    return check_rates(rates)


def directory(value: Any) -> str:
    """An existing directory (llama.cpp's --slot-save-path check), as given."""
    if not Path(str(value)).is_dir():
        raise ConfigError(f"not a directory: {value}")
    return str(value)


def load_mode(mode: str, mmap: bool | None, mlock: bool) -> int:
    """llama_model_params.load_mode from -lm, or from the older --[no-]mmap/--mlock."""
    if mode != "auto" or (mmap is None and not mlock):
        return LOAD_MODES[mode]
    if mmap is False:
        return LOAD_MODES["mlock" if mlock else "none"]
    return LOAD_MODES["mmap+mlock" if mlock else "mmap"]


def _on_off(value: Any) -> str:
    v = str(value).strip().lower()
    for canon, spellings in (("on", ("on", "enabled", "true", "1", "yes")),
                             ("off", ("off", "disabled", "false", "0", "no")),
                             ("auto", ("auto", "-1"))):
        if v in spellings:
            return canon
    raise ConfigError(f"-fa/--flash-attn takes on, off or auto, got {value!r}")


# ------------------------------------------------------------------ the table

_M, _S, _R, _V = "model", "sampling", "request", "server"

_FLAGS: list[Flag] = [
    # model and context
    Flag(("-m", "--model"), "model", _M, commands=ALL, envvar=("LLAMA_ARG_MODEL",),
         help="GGUF model path (default: the embedded Gemma 3 270M Q4_K_M)"),
    Flag(("-md", "--model-draft", "--spec-draft-model"), "model_draft", _M, commands=ALL,
         help="draft model GGUF (same vocabulary); drafts when the n-gram chain has nothing"),
    Flag(("-c", "--ctx-size"), "ctx_size", _M, int, 4096, commands=ALL, field="n_ctx",
         defaults=(("batch", 16384),), envvar=("LLAMA_ARG_CTX_SIZE",),
         help="context size in tokens (serve, batch: one context shared by the -np slots)"),
    Flag(("-t", "--threads"), "threads", _M, int, None, commands=ALL,
         help="CPU threads (default: all cores)"),
    Flag(("-tb", "--threads-batch"), "threads_batch", _M, int, None, commands=ALL,
         help="CPU threads for prompt processing (default: -t)"),
    Flag(("-b", "--batch-size"), "batch_size", _M, int, 512, field="n_batch", commands=ALL,
         help="logical batch: most tokens in one llama_decode (at least 64 for exactness)"),
    Flag(("-ub", "--ubatch-size"), "ubatch_size", _M, int, 512, field="n_ubatch", commands=ALL,
         help="physical batch (ubatch) size, at most -b (at least 64 for exactness)"),
    Flag(("-fa", "--flash-attn"), "flash_attn", _M, str, "auto", commands=ALL, parse=_on_off,
         metavar="on|off|auto", help="flash attention (exact mode keeps it on; llama.cpp's "
                                     "spellings: enabled/disabled, true/false, 1/0)"),
    Flag(("-kvu", "--kv-unified"), "kv_unified", _M, bool, None, neg=("-no-kvu", "--no-kv-unified"), commands=ALL,
         help="one KV buffer for all slots (exact mode keeps one stream per slot)"),
    Flag(("-ngl", "--gpu-layers", "--n-gpu-layers"), "n_gpu_layers", _M, str, "0", commands=ALL,
         parse=gpu_layers, metavar="N|auto|all",
         help="layers to offload to a GPU (passed to llama.cpp; a CPU build has none)"),
    Flag(("-lm", "--load-mode"), "load_mode", _M, click.Choice(list(LOAD_MODES)), "auto", commands=ALL,
         help="model loading: auto, none, mmap, mlock, mmap+mlock or dio (llama.cpp's)"),
    Flag(("--mmap",), "mmap", _M, bool, None, neg=("--no-mmap",), commands=ALL,
         help="memory-map the model file (older spelling of --load-mode)"),
    Flag(("--mlock",), "mlock", _M, bool, False, switch=True, commands=ALL,
         help="keep the model in RAM (older spelling of --load-mode)"),
    Flag(("--repack",), "repack", _M, bool, True, neg=("-nr", "--no-repack"), commands=ALL,
         help="repacked weights for prompt processing (exact mode: prompts of 64+ tokens "
              "only; off on CPUs that advertise AMX)"),
    Flag(("--swa-full",), "swa_full", _M, bool, False, switch=True, commands=ALL,
         help="full-size cache for sliding-window layers (default: llama.cpp's window size "
              "where a prefill twin evaluates the prompts; on with --context-shift)"),
    Flag(("-ctk", "--cache-type-k"), "cache_type_k", _M, str, "f16", commands=ALL,
         parse=kv_type_name, metavar="|".join(KV_TYPES),
         help="KV cache type for K (exact with speculation: docs/exactness.md; any K/V "
              "pair but f16/f16 also makes one-token steps faster)"),
    Flag(("-ctv", "--cache-type-v"), "cache_type_v", _M, str, "f16", commands=ALL,
         parse=kv_type_name, metavar="|".join(KV_TYPES),
         help="KV cache type for V (quantized types need flash attention)"),
    Flag(("--no-batch-invariance",), "no_batch_invariance", _M, bool, False, switch=True,
         commands=frozenset({"generate", "serve", "bench"}),
         help="llama.cpp's fastest kernels; output may differ from spec-off (not exact). "
              "Also set GGML_CPU_TILED_MM=1 in the environment for the tiled matmul"),
    Flag(("--draft-p-min", "--spec-draft-p-min"), "draft_p_min", _M, float, 0.0, commands=GEN,
         help="draft model: stop drafting below this greedy probability"),
    # request defaults
    Flag(("-n", "--n-predict", "--predict"), "n_predict", _R, int, 256, commands=ALL,
         defaults=(("serve", -1),),
         help="tokens to generate (-1: until end of text or the context/slot is full)"),
    Flag(("--temp", "--temperature"), "temp", _S, float, 0.8, commands=GEN,
         defaults=(("batch", 0.0),),
         help="temperature; 0 = greedy (exactly reproduces spec-off output)"),
    Flag(("--top-k",), "top_k", _S, int, 40, commands=GEN, help="top-k sampling (0: off)"),
    Flag(("--top-p",), "top_p", _S, float, 0.95, commands=GEN, help="top-p sampling (1.0: off)"),
    Flag(("--min-p",), "min_p", _S, float, 0.05, commands=GEN, help="min-p sampling (0.0: off)"),
    Flag(("--repeat-penalty",), "repeat_penalty", _S, float, 1.0, commands=GEN,
         help="penalty for repeated tokens (1.0: off)"),
    Flag(("--repeat-last-n",), "repeat_last_n", _S, int, 64, commands=GEN,
         help="tokens the repeat, frequency and presence penalties look back over"),
    Flag(("--frequency-penalty",), "frequency_penalty", _S, float, 0.0, commands=GEN,
         help="OpenAI's frequency penalty, -2..2 (0.0: off)"),
    Flag(("--presence-penalty",), "presence_penalty", _S, float, 0.0, commands=GEN,
         help="OpenAI's presence penalty, -2..2 (0.0: off)"),
    Flag(("--dry-multiplier",), "dry_multiplier", _S, float, 0.0, commands=GEN,
         help="DRY repetition penalty multiplier (0.0: off)"),
    Flag(("--dry-base",), "dry_base", _S, float, 1.75, commands=GEN,
         help="DRY base (values below 1.0 give the default 1.75)"),
    Flag(("--dry-allowed-length",), "dry_allowed_length", _S, int, 2, commands=GEN,
         help="DRY: repeats longer than this are penalized"),
    Flag(("--dry-penalty-last-n",), "dry_penalty_last_n", _S, int, 64, commands=GEN,
         help="tokens DRY scans for repeats (0: off; -1: the context)"),
    Flag(("--dry-sequence-breaker",), "dry_sequence_breaker", _S, str, None, commands=GEN,
         multiple=True, join=False,
         help="a DRY sequence breaker, repeatable (replaces the default \\n : \" *; "
              "'none': no breakers)"),
    Flag(("--xtc-probability",), "xtc_probability", _S, float, 0.0, commands=GEN,
         help="XTC: chance to remove the top tokens (0.0: off)"),
    Flag(("--xtc-threshold",), "xtc_threshold", _S, float, 0.1, commands=GEN,
         help="XTC: least probability of a removed token (above 0.5: off)"),
    Flag(("--typical", "--typical-p"), "typical_p", _S, float, 1.0, commands=GEN,
         help="locally typical sampling p (1.0: off)"),
    Flag(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", _S, float, -1.0, commands=GEN,
         help="keep tokens within n standard deviations of the top logit (<= 0: off)"),
    Flag(("--mirostat",), "mirostat", _S, int, 0, commands=GEN,
         help="Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces the other samplers)"),
    Flag(("--mirostat-lr",), "mirostat_eta", _S, float, 0.1, commands=GEN,
         help="Mirostat learning rate eta"),
    Flag(("--mirostat-ent",), "mirostat_tau", _S, float, 5.0, commands=GEN,
         help="Mirostat target entropy tau"),
    Flag(("--dynatemp-range",), "dynatemp_range", _S, float, 0.0, commands=GEN,
         help="dynamic temperature range (0.0: off)"),
    Flag(("--dynatemp-exp",), "dynatemp_exponent", _S, float, 1.0, commands=GEN,
         help="dynamic temperature exponent"),
    Flag(("--samplers",), "samplers", _S, str, None, commands=GEN,
         help="sampler order, names separated by ';' (default: "
              "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    Flag(("--sampler-seq", "--sampling-seq"), "sampler_seq", _S, str, None, commands=GEN,
         help="sampler order as letters (default: edskypmxt)"),
    Flag(("--ignore-eos",), "ignore_eos", _S, bool, False, switch=True, commands=GEN,
         help="generate past end-of-generation tokens (each gets a -inf logit bias)"),
    Flag(("-l", "--logit-bias"), "logit_bias", _S, str, None, commands=GEN, multiple=True,
         join=False, metavar="TOKEN(+|-)BIAS",
         help="add a bias to a token's logit, repeatable: e.g. 15043+1, 15043-inf bans it"),
    Flag(("-s", "--seed"), "seed", _S, int, -1, commands=GEN, help="RNG seed (-1: random)"),
    Flag(("--grammar",), "grammar", _S, commands=GEN, help="GBNF grammar constraining the output"),
    Flag(("--grammar-file",), "grammar_file", _S, click.Path(dir_okay=False), commands=GEN,
         help="read the GBNF grammar from a file"),
    Flag(("-j", "--json-schema"), "json_schema", _S, commands=GEN,
         help="JSON schema constraining the output ('{}': any JSON object)"),
    Flag(("-jf", "--json-schema-file"), "json_schema_file", _S, click.Path(dir_okay=False),
         commands=GEN, help="read the JSON schema from a file"),
    # logging
    Flag(("-v", "--verbose", "--log-verbose"), "verbose", _V, bool, False, switch=True,
         commands=ALL, help="tracebacks, llama.cpp logs (serve: also the access log)"),
    Flag(("--log-disable",), "log_disable", _V, bool, False, switch=True,
         help="log errors only"),
    # HTTP server
    Flag(("--host",), "host", _V, str, "127.0.0.1", parse=csv, envvar=("LLAMA_ARG_HOST",),
         help="address(es) to listen on, comma-separated (e.g. 127.0.0.1,::1)"),
    Flag(("--port",), "port", _V, int, 8080, envvar=("LLAMA_ARG_PORT",),
         help="port to listen on (0: any free port)"),
    Flag(("--reuse-port",), "reuse_port", _V, bool, False, switch=True,
         help="let several processes listen on the port (SO_REUSEPORT)"),
    Flag(("-np", "--parallel"), "parallel", _V, int, 1, field="n_parallel",
         commands=frozenset({"serve", "batch"}), defaults=(("batch", 4),),
         envvar=("LLAMA_ARG_N_PARALLEL",),
         help="slots: requests decoded together, each a llama.cpp sequence of one context"),
    Flag(("--queue-size",), "queue_size", _V, int, 64,
         help="requests that may wait for a free slot; beyond that 503 unavailable_error"),
    Flag(("--api-key",), "api_key", _V, envvar=("LLAMA_API_KEY", "NGRAMSPEC_API_KEY"),
         help="require 'Authorization: Bearer KEY'; comma-separate several keys"),
    Flag(("--api-key-file",), "api_key_file", _V, click.Path(dir_okay=False),
         help="file of API keys, one per line ('#' starts a comment)"),
    Flag(("-to", "--timeout"), "timeout", _V, int, 3600,
         help="seconds an idle HTTP connection is kept open"),
    Flag(("--metrics",), "metrics", _V, bool, False, switch=True,
         help="enable GET /metrics (Prometheus text)"),
    Flag(("--slots",), "slots", _V, bool, True, neg=("--no-slots",),
         help="expose GET /slots (off: 501 not_supported_error)"),
    Flag(("--props",), "props", _V, bool, False, switch=True,
         help="enable POST /props (answers success and, as llama-server, changes nothing)"),
    Flag(("-a", "--alias"), "alias", _V, parse=csv_set, envvar=("LLAMA_ARG_ALIAS",),
         help="model name(s), comma-separated: kept sorted and unique as in llama-server, the "
              "first in sort order is the id in /v1/models, /props and responses"),
    Flag(("--tags",), "tags", _V, parse=csv_set, envvar=("LLAMA_ARG_TAGS",),
         help="model tags, comma-separated (informational; kept sorted and unique)"),
    Flag(("--chat-template",), "chat_template", _V, metavar="NAME|JINJA",
         help="a built-in template name (chatml, llama3, gemma, ...) or a Jinja template"),
    Flag(("--chat-template-file",), "chat_template_file", _V, click.Path(dir_okay=False),
         help="read the chat template (Jinja) from a file"),
    Flag(("--chat-template-kwargs",), "chat_template_kwargs", _V, parse=json_object,
         help="JSON object of extra variables for the chat template"),
    Flag(("--jinja",), "jinja", _V, bool, True, neg=("--no-jinja",),
         help="render chat templates with Jinja (off: llama.cpp's built-in templates)"),
    Flag(("--cache-prompt",), "cache_prompt", _V, bool, True, neg=("--no-cache-prompt",),
         commands=frozenset({"serve", "batch"}),
         help="requests (records) reuse a slot's cached prompt prefix unless they say "
              "cache_prompt: false"),
    Flag(("--cache-reuse",), "cache_reuse", _V, int, 0, warn=lambda v: v > 0,
         note="chunk reuse by KV shifting is not supported; the longest cached prefix is reused"),
    Flag(("--context-shift",), "context_shift", _V, bool, False, neg=("--no-context-shift",),
         help="when a slot is full, drop half of the tokens after --keep and go on generating "
              "(llama-server's shift; off: stop with finish_reason 'length')"),
    Flag(("--keep",), "keep", _V, int, 0,
         help="prompt tokens a context shift keeps (-1: all); a request's n_keep overrides it"),
    Flag(("--slot-save-path",), "slot_save_path", _V, parse=directory, metavar="DIR",
         help="directory for POST /slots/ID?action=save|restore (off: 501)"),
    Flag(("--embedding", "--embeddings"), "embedding", _V, bool, False, switch=True,
         help="serve /embedding and /v1/embeddings (llama.cpp embeddings, own context)"),
    Flag(("--pooling",), "pooling", _V, click.Choice(["none", "mean", "cls", "last", "rank"]),
         help="embedding pooling (default: the model's)"),
    Flag(("--embd-normalize",), "embd_normalize", _V, int, 2,
         help="embedding normalisation: -1 none, 0 max-abs, 1 taxicab, 2 euclidean, >2 p-norm"),
    Flag(("--ui", "--webui"), "webui", _V, bool, None, neg=("--no-ui", "--no-webui"),
         warn=bool, note="there is no web UI"),
    # CORS (server/cors.py) and what llama-server ties to it
    Flag(("--cors-origins",), "cors_origins", _V, metavar="ORIGINS",
         envvar=("LLAMA_ARG_CORS_ORIGINS",),
         help="Access-Control-Allow-Origin: '*' (echo the request's Origin), 'localhost' (echo "
              "it only for a localhost Origin) or a value sent as is (default: '*'; "
              "'localhost' when --tools, --mcp-servers-* or --agent is given)"),
    Flag(("--cors-methods",), "cors_methods", _V, str, "GET, POST, DELETE, OPTIONS",
         envvar=("LLAMA_ARG_CORS_METHODS",), help="Access-Control-Allow-Methods of a preflight"),
    Flag(("--cors-headers",), "cors_headers", _V, str, "*", envvar=("LLAMA_ARG_CORS_HEADERS",),
         help="Access-Control-Allow-Headers of a preflight"),
    Flag(("--cors-credentials",), "cors_credentials", _V, bool, True,
         neg=("--no-cors-credentials",),
         help="Access-Control-Allow-Credentials; with --cors-origins '*' the Origin is echoed "
              "(off: '*' is sent as is)"),
    Flag(("--ui-mcp-proxy", "--webui-mcp-proxy"), "ui_mcp_proxy", _V, bool, None,
         neg=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
         help="serve GET/POST /cors-proxy?url=URL (forwards only x-llama-server-proxy-header-* "
              "headers; do not enable in untrusted environments); off: 403. --agent turns it on"),
    Flag(("--tools",), "tools", _V, parse=csv, envvar=("LLAMA_ARG_TOOLS",), metavar="TOOL,...",
         note="there are no built-in tools here; as in llama-server, --cors-origins defaults "
              "to localhost"),
    Flag(("--mcp-servers-config",), "mcp_servers_config", _V, metavar="PATH",
         envvar=("LLAMA_ARG_MCP_SERVERS_CONFIG",),
         note="MCP servers are not run here; as in llama-server, --cors-origins defaults to "
              "localhost"),
    Flag(("--mcp-servers-json",), "mcp_servers_json", _V, metavar="JSON",
         envvar=("LLAMA_ARG_MCP_SERVERS_JSON",),
         note="MCP servers are not run here; as in llama-server, --cors-origins defaults to "
              "localhost"),
    Flag(("-ag", "--agent"), "agent", _V, bool, False, neg=("-no-ag", "--no-agent"), warn=bool,
         note="there are no built-in tools here: only the CORS proxy (--ui-mcp-proxy) is "
              "turned on; --cors-origins defaults to localhost"),
    Flag(("--spec-synth-len",), "spec_synth_len", _V, float, None,
         help="benchmarking: accept drafts at random for this mean tokens per step "
              "(output is not the model's)"),
    Flag(("--spec-synth-rates",), "spec_synth_rates", _V, parse=synth_rates, metavar="P0,P1,...",
         help="benchmarking: per-position draft acceptance probabilities, one per draft "
              "token (output is not the model's)"),
]

# speculation: the flags of config.SPEC_OPTIONS, plus the chain, pool and policy
_SPEC_CMDS = ALL | {"replay"}
_FLAGS += [
    Flag(("--spec-type",), "spec_type", "spec", str, "auto", commands=_SPEC_CMDS, multiple=True,
         envvar=("LLAMA_ARG_SPEC_TYPE",),
         defaults=(("bench", "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,auto"),
                   ("replay", "ngram-mod")),
         help=f"comma list of speculation types, first draft wins ({valid_types_text()}; "
              "draft-*: the -md model)"),
    Flag(("--spec-pool-mib",), "spec_pool_mib", "spec", int, None, commands=_SPEC_CMDS,
         help="shared hash pool size in MiB, a power of two (default: 16)"),
    Flag(("--draft-policy",), "draft_policy", "spec", click.Choice(["cost", "fixed"]), "cost",
         commands=_SPEC_CMDS, defaults=(("replay", "fixed"),),
         help="cost: draft lengths from measured verify cost and acceptance; fixed: llama.cpp's"),
] + [Flag(o.flags, o.dest, "spec", int, None, commands=_SPEC_CMDS, help=o.help)
     for o in SPEC_OPTIONS]


def _accepted(target: str, note: str | None, *specs: str) -> list[Flag]:
    """Flags serve accepts without using them. Each spec is 'NAMES[=]': space-separated
    spellings ('|' before the off spellings of an on/off flag), '=' if it takes a value."""
    out = []
    for spec in specs:
        takes = spec.endswith("=")
        on, _, off = spec.rstrip("=").partition("|")
        names, neg = tuple(on.split()), tuple(off.split())
        canon = next((n for n in names if n.startswith("--")), names[0])
        dest = "x_" + "".join(c if c.isalnum() else "_" for c in canon.lstrip("-"))
        out.append(Flag(names, dest, target, str if takes else bool, None, neg=neg,
                        switch=not takes and not neg, note=note,
                        help=note or "accepted for llama-server compatibility (no effect needed)"))
    return out


_FLAGS += _accepted(
    "noop", None,
    "--offline", "-cb --cont-batching", "--warmup | --no-warmup", "--perf | --no-perf",
    "-bs --backend-sampling", "--spec-draft-backend-sampling | --no-spec-draft-backend-sampling",
    "--threads-http=", "--log-colors=", "--log-prefix | --no-log-prefix",
    "--log-timestamps | --no-log-timestamps", "-lv --verbosity --log-verbosity=",
    "--sse-ping-interval=", "--check-tensors", "-e --escape | --no-escape",
    "-kvo --kv-offload | -nkvo --no-kv-offload",
    "--op-offload | --no-op-offload", "--no-host", "--mmproj-auto | --no-mmproj --no-mmproj-auto",
    "--cache-idle-slots | --no-cache-idle-slots", "--models-autoload | --no-models-autoload",
)
_FLAGS += _accepted(
    "ignored", "has no meaning on this CPU build (no GPU or other device to use)",
    "-sm --split-mode=", "-ts --tensor-split=", "-mg --main-gpu=", "-dev --device=",
    "--list-devices", "--rpc=", "-ot --override-tensor=", "-cmoe --cpu-moe", "-ncmoe --n-cpu-moe=",
    "-ncffn --n-cpu-ffn=", "-fit --fit=", "-fitt --fit-target=", "-fitc --fit-ctx=",
    "--spec-draft-device -devd --device-draft=", "--spec-draft-ngl -ngld --gpu-layers-draft "
    "--n-gpu-layers-draft=", "--spec-draft-override-tensor -otd --override-tensor-draft=",
    "--spec-draft-cpu-moe -cmoed --cpu-moe-draft", "--spec-draft-n-cpu-moe --spec-draft-ncmoe "
    "-ncmoed --n-cpu-moe-draft=", "-lzm --lazy-mode=", "--numa=",
)
_FLAGS += _accepted(
    "ignored", "CPU affinity and priority are left to the OS",
    "-C --cpu-mask=", "-Cr --cpu-range=", "--cpu-strict=", "--prio=", "--poll=",
    "-Cb --cpu-mask-batch=", "-Crb --cpu-range-batch=", "--cpu-strict-batch=", "--prio-batch=",
    "--poll-batch=", "--spec-draft-threads -td --threads-draft=",
    "--spec-draft-threads-batch -tbd --threads-batch-draft=",
    "--spec-draft-cpu-mask -Cd --cpu-mask-draft=", "--spec-draft-cpu-range -Crd --cpu-range-draft=",
    "--spec-draft-cpu-strict --cpu-strict-draft=", "--spec-draft-prio --prio-draft=",
    "--spec-draft-poll --poll-draft=", "--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft=",
    "--spec-draft-cpu-strict-batch --cpu-strict-batch-draft=",
    "--spec-draft-prio-batch --prio-batch-draft=", "--spec-draft-poll-batch --poll-batch-draft=",
)
_FLAGS += _accepted(
    "ignored", "models are never downloaded here; pass -m FILE.gguf",
    "-mu --model-url=", "-dr --docker-repo=", "-hf -hfr --hf-repo=", "-hff --hf-file=",
    "-hft --hf-token=", "--spec-draft-hf -hfd -hfrd --hf-repo-draft=", "-cl --cache-list",
    "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default",
    "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default",
    "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
    "--vision-gemma-12b-default", "--spec-default",
)
_FLAGS += _accepted(
    "ignored", "text only: no multimodal projector, images, audio or video",
    "-mm --mmproj=", "-mmu --mmproj-url=", "--mmproj-offload | --no-mmproj-offload",
    "--image-min-tokens=", "--image-max-tokens=", "--mtmd-batch-max-tokens=", "--video-fps=",
    "--video-timestamp-interval=", "--video-ffmpeg-dir=", "--media-path=",
)
_FLAGS += _accepted(
    "ignored", "one model per server: no router mode",
    "--models-dir=", "--models-preset=", "--models-max=", "--sleep-idle-seconds=",
)
_FLAGS += _accepted(
    "ignored", "LoRA adapters, control vectors and metadata overrides are not supported",
    "--lora=", "--lora-scaled=", "--lora-init-without-apply", "--control-vector=",
    "--control-vector-scaled=", "--override-kv=",
)
_FLAGS += _accepted(
    "ignored", "the draft model's KV cache (f16), the defrag threshold and the RoPE settings "
               "stay the defaults (exactness is verified for them only)",
    "--spec-draft-type-k -ctkd "
    "--cache-type-k-draft=", "--spec-draft-type-v -ctvd --cache-type-v-draft=", "-dt --defrag-thold=",
    "--rope-scaling=", "--rope-scale=", "--rope-freq-base=", "--rope-freq-scale=", "--yarn-orig-ctx=",
    "--yarn-ext-factor=", "--yarn-attn-factor=", "--yarn-beta-slow=", "--yarn-beta-fast=",
    "--kv-unified-per-slot=", "-ctxcp --ctx-checkpoints --swa-checkpoints=",
    "-cms --checkpoint-min-step=", "-cram --cache-ram=",
)
_FLAGS += _accepted(
    "ignored", "this setting is not supported as a server default",
    "-r --reverse-prompt=", "-sp --special", "--spm-infill",
)
_FLAGS += _accepted(
    "ignored", "the adaptive-p sampler is not built here (no request field sets it either)",
    "--adaptive-target=", "--adaptive-decay=",
)
_FLAGS += _accepted(
    "ignored", "not supported by this server",
    "--path=", "--api-prefix=", "--ssl-key-file=", "--ssl-cert-file=",
    "--ui-config --webui-config=", "--ui-config-file --webui-config-file=", "--tools-runtime=",
    "--rerank --reranking", "-sps --slot-prompt-similarity=",
    "--reasoning-format=", "-rea --reasoning=", "--reasoning-effort=", "--reasoning-budget=",
    "--reasoning-budget-message=", "--reasoning-preserve | --no-reasoning-preserve",
    "--skip-chat-parsing | --no-skip-chat-parsing", "--prefill-assistant | --no-prefill-assistant",
    "--log-file=", "--log-jsonl | --no-log-jsonl", "--log-prompts-dir=", "-lcs --lookup-cache-static=",
    "-lcd --lookup-cache-dynamic=", "--spec-draft-p-split --draft-p-split=", "--completion-bash",
    "-nocb --no-cont-batching", "-gan --grp-attn-n=", "-gaw --grp-attn-w=",
)
_FLAGS.append(Flag(("--control-vector-layer-range",), "x_control_vector_layer_range", "ignored",
                   nargs=2, note="LoRA adapters, control vectors and metadata overrides are not "
                                 "supported", help="accepted for llama-server compatibility"))

FLAGS: tuple[Flag, ...] = tuple(_FLAGS)


# ------------------------------------------------------------------ click options


def for_command(command: str, targets: Iterable[str] | None = None) -> list[Flag]:
    """The flags a command takes (in table order), optionally only some targets."""
    return [f for f in FLAGS if command in f.commands and (targets is None or f.target in targets)]


def _click_option(f: Flag, command: str) -> Callable:
    default = f.default_for(command)
    kw: dict[str, Any] = {"help": f.help or f"accepted; {f.note}", "envvar": list(f.envvar) or None, "metavar": f.metavar,
                          "hidden": f.target in ("noop", "ignored")}  # docs/server-flags.md
    if f.neg:
        return click.option(*_pair_decls(f.names, f.neg), f.dest, default=default, cls=_Toggle,
                            **kw)
    if f.switch:
        return click.option(*f.names, f.dest, is_flag=True, default=bool(default), **kw)
    if f.multiple:
        return click.option(*f.names, f.dest, type=f.type, multiple=True,
                            default=(default,) if default is not None else (),
                            callback=_join_multiple if f.join else None,
                            show_default=default is not None, **kw)
    callback = None
    if f.parse is not None and f.type is str:
        callback = _checked(f)
    return click.option(*f.names, f.dest, type=f.type, default=default, nargs=f.nargs,
                        callback=callback, show_default=default is not None, **kw)


def _pair_decls(on: tuple[str, ...], off: tuple[str, ...]) -> list[str]:
    """click declarations for an on/off flag: 'on/off' pairs; a spelling one side has
    more of is paired with that side's partner's first spelling (`_Toggle` drops the
    repeat)."""
    n = max(len(on), len(off))
    return [f"{on[min(i, len(on) - 1)]}/{off[min(i, len(off) - 1)]}" for i in range(n)]


class _Toggle(click.Option):
    """An on/off option whose declarations may repeat a spelling (see _pair_decls)."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.opts = list(dict.fromkeys(self.opts))
        self.secondary_opts = list(dict.fromkeys(self.secondary_opts))


def _join_multiple(ctx: click.Context, param: click.Parameter, value: tuple) -> str | None:
    """A repeated flag (--spec-type a --spec-type b) reads as one comma list, as in llama.cpp."""
    return ",".join(value) if value else None


def _checked(f: Flag) -> Callable:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            try:
                f.parse(value)
            except ConfigError as e:
                raise click.BadParameter(str(e), ctx=ctx, param=param) from None
        return value
    return callback


def options(command: str) -> Callable:
    """Decorator adding every table flag of `command` as a click option."""

    def decorate(fn: Callable) -> Callable:
        for f in reversed(for_command(command)):
            fn = _click_option(f, command)(fn)
        return fn

    return decorate


def given(ctx: click.Context, dest: str) -> bool:
    """Whether the user set a flag (command line or environment), not its default."""
    src = ctx.get_parameter_source(dest)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


#: flags of ngramspec's own (llama-server has no such flag): `given_argv(..., peer=True)`
#: leaves them out of a llama-server command line
OWN_FLAGS = frozenset({"draft_policy", "spec_pool_mib", "no_batch_invariance"})


def given_argv(ctx: click.Context, command: str, targets: Iterable[str],
               skip: Iterable[str] = (), peer: bool = False) -> list[str]:
    """The flags of `targets` the user gave to `command`, as a command line again (their
    canonical spelling, the value as given): what `bench --parallel` passes on to the
    servers it starts. `skip`: dests passed some other way; `peer`: for llama-server
    (OWN_FLAGS left out)."""
    out: list[str] = []
    leave = set(skip) | (OWN_FLAGS if peer else set())
    for f in for_command(command, targets):
        if f.dest in leave or not given(ctx, f.dest):
            continue
        value = ctx.params.get(f.dest)
        if f.neg:
            out.append(f.name if value else f.neg[-1])
        elif f.switch:
            out += [f.name] if value else []
        elif value is not None:
            out += [f.name, str(value)]
    return out


def warnings_for(ctx: click.Context, command: str, values: dict[str, Any]) -> list[str]:
    """One line per flag that was given but has no effect here (or only part of it)."""
    lines = []
    for f in for_command(command):
        if f.note is None or not given(ctx, f.dest) or not f.warn(values.get(f.dest)):
            continue
        lines.append(f"warning: {f.name}: {f.note}")
    return lines


def pop_unused(values: dict[str, Any]) -> None:
    """Drop the values of flags that are accepted but unused (noop, ignored)."""
    for f in FLAGS:
        if f.target in ("noop", "ignored"):
            values.pop(f.dest, None)


# ------------------------------------------------------------------ building values


def spec_from_values(kw: dict[str, Any], model_draft: str | None = None,
                     need_draft: bool = True) -> SpecConfig:
    """Pop the speculation flags out of a command's values into one SpecConfig.

    A llama.cpp draft-model type (draft-simple, ...) without -md is an error that
    names the fix (`need_draft`)."""
    opts = {o.dest: kw.pop(o.dest) for o in SPEC_OPTIONS if o.dest in kw}
    mib = kw.pop("spec_pool_mib", None)
    pool = None
    if mib is not None:
        if mib < 1:
            raise ConfigError(f"--spec-pool-mib must be >= 1, got {mib}")
        pool = mib << 20
    spec_type = kw.pop("spec_type", None)
    if need_draft and model_draft is None and uses_draft_model(spec_type):
        raise ConfigError(f"--spec-type {spec_type} drafts with a draft model: add "
                          "-md/--model-draft FILE.gguf (or use an ngram-* type or auto)")
    return spec_config_from_options(spec_type=spec_type, pool_bytes=pool,
                                    policy=kw.pop("draft_policy", None), **opts)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None


def sampling_from_values(kw: dict[str, Any]):
    """Pop the sampling flags into SamplingParams (grammar from --grammar/-file, -j/-jf)."""
    from .sampling import SamplingParams, schema_grammar, seed_or_random

    grammar, gfile = kw.pop("grammar", None), kw.pop("grammar_file", None)
    schema, sfile = kw.pop("json_schema", None), kw.pop("json_schema_file", None)
    if sum(x is not None for x in (grammar, gfile, schema, sfile)) > 1:
        raise ConfigError("use only one of --grammar, --grammar-file, --json-schema and "
                          "--json-schema-file")
    if gfile is not None:
        grammar = _read(gfile, "--grammar-file")
    if sfile is not None:
        schema = _read(sfile, "--json-schema-file")
    if schema is not None:
        parsed = strict_json.loads(schema, "--json-schema")
        grammar = schema_grammar(parsed if parsed else {"type": "object"})
    seed = kw.pop("seed", -1)
    return SamplingParams(temperature=kw.pop("temp"), top_k=kw.pop("top_k"), top_p=kw.pop("top_p"),
                          min_p=kw.pop("min_p"), repeat_penalty=kw.pop("repeat_penalty"),
                          repeat_last_n=kw.pop("repeat_last_n"),
                          frequency_penalty=kw.pop("frequency_penalty"),
                          presence_penalty=kw.pop("presence_penalty"),
                          seed=seed_or_random(seed), grammar=grammar, **_samplers_from_values(kw))


#: flags whose value is SamplingParams' field of the same name (`_samplers_from_values`)
_SAMPLER_FIELDS = ("dry_multiplier", "dry_allowed_length", "dry_penalty_last_n",
                   "xtc_probability", "xtc_threshold", "typical_p", "top_n_sigma", "mirostat",
                   "mirostat_eta", "mirostat_tau", "dynatemp_range", "dynatemp_exponent")


def _token_bias(value: str) -> tuple[int, float]:
    """llama.cpp's -l value TOKEN(+|-)BIAS: a token id, then a signed bias (inf allowed)."""
    m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:inf|[0-9.]+(?:e[+-]?\d+)?))\s*", value, re.I)
    if m is None:
        raise ConfigError(f"-l/--logit-bias takes TOKEN(+|-)BIAS, e.g. 15043+1 or 15043-inf; "
                          f"got {value!r}")
    return int(m.group(1)), float(m.group(2).replace(" ", ""))


def _samplers_from_values(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop llama-server's other sampler flags into SamplingParams fields: DRY's base
    below 1 is the default (as llama.cpp), given breakers replace the default ('none':
    no breakers); --samplers or --sampler-seq set the order (sampler_chain.parse_order)."""
    from .sampler_chain import DEFAULT_ORDER, parse_order
    from .sampling import SamplingParams

    out = {k: kw.pop(k) for k in _SAMPLER_FIELDS if k in kw}
    out["ignore_eos"] = bool(kw.pop("ignore_eos", False))
    out["logit_bias"] = tuple(_token_bias(v) for v in kw.pop("logit_bias", ()) or ())
    base = kw.pop("dry_base", None)
    out["dry_base"] = SamplingParams.dry_base if base is None or base < 1.0 else base
    breakers = kw.pop("dry_sequence_breaker", ())
    if breakers:
        out["dry_sequence_breakers"] = tuple(b for b in breakers if b != "none")
    names, seq = kw.pop("samplers", None), kw.pop("sampler_seq", None)
    if names is not None and seq is not None:
        raise ConfigError("use only one of --samplers and --sampler-seq")
    order = names if names is not None else seq
    out["samplers"] = DEFAULT_ORDER if order is None else parse_order(order)
    return {k: v for k, v in out.items() if v is not None}


#: the flags of runtime.LoadOptions (llama.cpp's load and context settings)
_LOAD = ("batch_size", "ubatch_size", "flash_attn", "kv_unified", "threads_batch",
         "n_gpu_layers", "load_mode", "mmap", "mlock", "repack", "swa_full", "cache_type_k",
         "cache_type_v")


def load_options(kw: dict[str, Any]):
    """Pop -b, -ub, -fa, -kvu, -tb, -ngl, -lm/--[no-]mmap/--mlock, --[no-]repack,
    --swa-full, -ctk/-ctv into runtime.LoadOptions."""
    from .runtime import LoadOptions

    v = {d: kw.pop(d) for d in _LOAD}
    return LoadOptions(n_batch=v["batch_size"], n_ubatch=v["ubatch_size"],
                       flash_attn=_on_off(v["flash_attn"]), kv_unified=v["kv_unified"],
                       threads_batch=v["threads_batch"], n_gpu_layers=gpu_layers(v["n_gpu_layers"]),
                       load_mode=load_mode(v["load_mode"], v["mmap"], v["mlock"]),
                       repack=v["repack"], swa_full=bool(v["swa_full"]),
                       cache_type_k=kv_type_name(v["cache_type_k"] or "f16"),
                       cache_type_v=kv_type_name(v["cache_type_v"] or "f16"))


def engine_settings(kw: dict[str, Any], n_seq: int = 1, verbose: bool = False,
                    spec: SpecConfig | None = None):
    """Pop a command's model, load and speculation flags (-m, -md, -c, -t,
    --draft-p-min, --no-batch-invariance, `load_options`' and `spec_from_values`')
    into the one runtime.EngineSettings (`spec`: one built already)."""
    from .runtime import EngineSettings

    model_draft = kw.pop("model_draft", None)
    return EngineSettings(
        model=kw.pop("model", None), model_draft=model_draft,
        n_ctx=kw.pop("ctx_size"), threads=kw.pop("threads", None),
        spec=spec if spec is not None else spec_from_values(kw, model_draft),
        n_seq=n_seq, draft_p_min=kw.pop("draft_p_min", 0.0) or 0.0,
        batch_invariant=not kw.pop("no_batch_invariance", False),
        options=load_options(kw), verbose=verbose)


def defaults(command: str, targets: Iterable[str] | None = None) -> dict[str, Any]:
    """{dest: default} of a command's flags (what an empty command line gives)."""
    return {f.dest: f.default_for(command) for f in for_command(command, targets)}


def settings_fields() -> list[tuple[str, Any, Any]]:
    """(field, type, dataclasses.field) of every model/request/server flag of serve, for
    ServerSettings: its fields and defaults are the table's."""
    out = []
    for f in for_command("serve", ("model", "request", "server")):
        py = f.type if isinstance(f.type, type) else str
        out.append((f.settings_field, Any if f.parse else py | None,
                    dc_field(default=f.default_for("serve"))))
    return out


def settings_values(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop serve's model/request/server values, keyed by ServerSettings field."""
    return {f.settings_field: kw.pop(f.dest) for f in for_command("serve", ("model", "request",
                                                                             "server"))
            if f.dest in kw}


def parsers() -> dict[str, Callable[[Any], Any]]:
    """{ServerSettings field: parse} for fields whose flag value is parsed (e.g. csv)."""
    return {f.settings_field: f.parse for f in for_command("serve", ("model", "request", "server"))
            if f.parse is not None}
