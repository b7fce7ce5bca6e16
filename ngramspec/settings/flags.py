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

from dataclasses import field as dc_field
from dataclasses import fields as dc_fields
from typing import Any, Callable, Iterable

import click

from .config import SPEC_OPTIONS, valid_types_text
from .flag import (
    ALL,
    GEN,
    Flag,
    on_off,
    csv,
    csv_set,
    directory,
    gpu_layers,
    json_object,
)
from .llama_values import KV_TYPES, LOAD_MODES, kv_type_name
from .sampling import SamplingParams


# ------------------------------------------------------------------ the table

_M, _S, _R, _V = "model", "sampling", "request", "server"

#: SamplingParams' fields and their defaults: the sampling flags' types and defaults
SAMPLING_DEFAULTS = {f.name: f.default for f in dc_fields(SamplingParams)}
_FIELDS_OWN = object()  # `_sampler`'s default: the field's own


def _sampler(names: tuple[str, ...], field: str, dest: str | None = None, *,
             default: Any = _FIELDS_OWN, help: str, **kw) -> Flag:
    """The flag of SamplingParams.<field>: typed and defaulted as the field is (`default`
    only where llama.cpp's command line differs: --temp 0.8, --seed -1); its value goes
    to that field (`sampling_fields`), its range is SamplingParams' (`sampling.RANGES`)."""
    value = SAMPLING_DEFAULTS[field] if default is _FIELDS_OWN else default
    return Flag(names, dest or field, _S, type(SAMPLING_DEFAULTS[field]), value, help=help,
                commands=GEN, field=field, **kw)


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
    Flag(("-fa", "--flash-attn"), "flash_attn", _M, str, "auto", commands=ALL, parse=on_off,
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
    _sampler(("--temp", "--temperature"), "temperature", "temp", default=0.8,
             defaults=(("batch", 0.0),),
             help="temperature; 0 = greedy (exactly reproduces spec-off output)"),
    _sampler(("--top-k",), "top_k", help="top-k sampling (0: off)"),
    _sampler(("--top-p",), "top_p", help="top-p sampling (1.0: off)"),
    _sampler(("--min-p",), "min_p", help="min-p sampling (0.0: off)"),
    _sampler(("--repeat-penalty",), "repeat_penalty", help="penalty for repeated tokens (1.0: off)"),
    _sampler(("--repeat-last-n",), "repeat_last_n",
             help="tokens the repeat, frequency and presence penalties look back over"),
    _sampler(("--frequency-penalty",), "frequency_penalty",
             help="OpenAI's frequency penalty, -2..2 (0.0: off)"),
    _sampler(("--presence-penalty",), "presence_penalty",
             help="OpenAI's presence penalty, -2..2 (0.0: off)"),
    _sampler(("--dry-multiplier",), "dry_multiplier",
             help="DRY repetition penalty multiplier (0.0: off)"),
    _sampler(("--dry-base",), "dry_base", help="DRY base (values below 1.0 give the default 1.75)"),
    _sampler(("--dry-allowed-length",), "dry_allowed_length",
             help="DRY: repeats longer than this are penalized"),
    _sampler(("--dry-penalty-last-n",), "dry_penalty_last_n",
             help="tokens DRY scans for repeats (0: off; -1: the context)"),
    Flag(("--dry-sequence-breaker",), "dry_sequence_breaker", _S, str, None, commands=GEN,
         multiple=True, join=False,
         help="a DRY sequence breaker, repeatable (replaces the default \\n : \" *; "
              "'none': no breakers)"),
    _sampler(("--xtc-probability",), "xtc_probability",
             help="XTC: chance to remove the top tokens (0.0: off)"),
    _sampler(("--xtc-threshold",), "xtc_threshold",
             help="XTC: least probability of a removed token (above 0.5: off)"),
    _sampler(("--typical", "--typical-p"), "typical_p", help="locally typical sampling p (1.0: off)"),
    _sampler(("--top-nsigma", "--top-n-sigma"), "top_n_sigma",
             help="keep tokens within n standard deviations of the top logit (<= 0: off)"),
    _sampler(("--mirostat",), "mirostat",
             help="Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces the other samplers)"),
    _sampler(("--mirostat-lr",), "mirostat_eta", help="Mirostat learning rate eta"),
    _sampler(("--mirostat-ent",), "mirostat_tau", help="Mirostat target entropy tau"),
    _sampler(("--dynatemp-range",), "dynatemp_range", help="dynamic temperature range (0.0: off)"),
    _sampler(("--dynatemp-exp",), "dynatemp_exponent", help="dynamic temperature exponent"),
    Flag(("--samplers",), "samplers", _S, str, None, commands=GEN,
         help="sampler order, names separated by ';' (default: "
              "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    Flag(("--sampler-seq", "--sampling-seq"), "sampler_seq", _S, str, None, commands=GEN,
         help="sampler order as letters (default: edskypmxt)"),
    _sampler(("--ignore-eos",), "ignore_eos", switch=True,
             help="generate past end-of-generation tokens (each gets a -inf logit bias)"),
    Flag(("-l", "--logit-bias"), "logit_bias", _S, str, None, commands=GEN, multiple=True,
         join=False, metavar="TOKEN(+|-)BIAS",
         help="add a bias to a token's logit, repeatable: e.g. 15043+1, 15043-inf bans it"),
    _sampler(("-s", "--seed"), "seed", default=-1, help="RNG seed (-1: random)"),
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
         help="cost: draft lengths from measured verify cost and acceptance; fixed: llama.cpp's "
              "(with auto: llama.cpp's chain of auto's drafters)"),
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
    "ignored", "synthetic draft acceptance (llama-server's benchmarking mode) is not built: "
    "ngramspec only ever emits the model's own tokens",
    "--spec-synth-len=", "--spec-synth-rates=",
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


def sampling_fields() -> dict[str, str]:
    """{flag dest: SamplingParams field} of the flags that give a field its value as it is
    (`_sampler`'s); the others (grammar, schema, logit bias, breakers, order) are read by
    settings/sampling_flags.py."""
    return {f.dest: f.field for f in FLAGS if f.target == _S and f.field in SAMPLING_DEFAULTS}


def settings_values(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop serve's model/request/server values, keyed by ServerSettings field."""
    return {f.settings_field: kw.pop(f.dest) for f in for_command("serve", ("model", "request",
                                                                             "server"))
            if f.dest in kw}


def parsers() -> dict[str, Callable[[Any], Any]]:
    """{ServerSettings field: parse} for fields whose flag value is parsed (e.g. csv)."""
    return {f.settings_field: f.parse for f in for_command("serve", ("model", "request", "server"))
            if f.parse is not None}
