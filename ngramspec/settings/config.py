"""One typed configuration for speculation, and the flags generated from it.

Invariants:
- Every setting has exactly one definition here (`SPEC_OPTIONS`): its flags, its
  type, its default and its valid range. The CLI, the server and the library all
  build a `SpecConfig` through `spec_config_from_options`, so a setting cannot mean
  different things in different places.
- A `SpecConfig` that exists has been validated; bad values raise `ConfigError`
  naming the valid values.
- Defaults are llama.cpp's (common/common.h): ngram-simple/-map-k/-map-k4v n=12,
  m=48, min-hits=1; ngram-mod n_match=24, n_min=48, n_max=64.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import Any, Sequence

from ..errors import ConfigError

#: Pseudo-types accepted by `--spec-type`: "none" disables speculation; "auto" lets
#: the engine pick drafters and lengths from measured cost and acceptance.
OFF_TYPES = ("none",)
AUTO = "auto"
#: llama.cpp's draft-model speculation types (common/speculative.cpp). Here each one
#: means "draft with the -md/--model-draft model" (a plain draft model: no EAGLE-3,
#: MTP or DFlash heads); they add no n-gram drafter to the chain.
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
POLICIES = ("fixed", "cost")
NGRAM_LIMIT = 1024  # llama.cpp's bound for every n-gram size (inclusive)
DEFAULT_POOL_BYTES = 16 << 20


@dataclass(frozen=True)
class NgramMapParams:
    """Parameters of ngram-simple, ngram-map-k and ngram-map-k4v."""

    size_n: int = 12  # length of the key n-gram looked up in the history
    size_m: int = 48  # length of the drafted m-gram that followed the key
    min_hits: int = 1  # times a key must be found before it drafts (map-k, map-k4v)


@dataclass(frozen=True)
class NgramModParams:
    """Parameters of ngram-mod."""

    n_match: int = 24  # length of the hashed n-gram
    n_min: int = 48  # drafts shorter than this are discarded
    n_max: int = 64  # longest draft


@dataclass(frozen=True)
class SpecType:
    """One draftless spec type: where its parameters live in SpecConfig, and which of
    them a type-independent setting (`--spec-ngram-size-n`, a request's
    `speculative.ngram_size_n`, props) means for it."""

    name: str  # llama.cpp's name
    params: type  # its parameters' dataclass (each field a --spec-NAME-FIELD flag)
    field: str  # the SpecConfig attribute holding them
    key: str  # the key n-gram length (ngram_size_n)
    length: str  # the drafted length (ngram_size_m)
    hits: str | None  # key hits before drafting (ngram_min_hits); None: not a setting of it


#: THE spec-type table, in llama.cpp's order: every other view (SPEC_TYPES, the generic
#: flags' targets, validation, SpecConfig.override, props, the drafter registry) is
#: derived from it.
SPEC_TYPE_TABLE: tuple[SpecType, ...] = (
    SpecType("ngram-simple", NgramMapParams, "ngram_simple", "size_n", "size_m", None),
    SpecType("ngram-map-k", NgramMapParams, "ngram_map_k", "size_n", "size_m", "min_hits"),
    SpecType("ngram-map-k4v", NgramMapParams, "ngram_map_k4v", "size_n", "size_m", "min_hits"),
    SpecType("ngram-mod", NgramModParams, "ngram_mod", "n_match", "n_max", None),
)
SPEC_TYPE = {t.name: t for t in SPEC_TYPE_TABLE}
#: llama.cpp's names of the draftless speculation methods, in llama.cpp's order.
SPEC_TYPES: tuple[str, ...] = tuple(SPEC_TYPE)


@dataclass(frozen=True)
class SpecConfig:
    """Everything that decides what a drafter chain proposes.

    `types` is the ordered drafter chain (first non-empty draft wins); empty means
    speculation is off. `draft_max` caps every draft (None: each type's own
    maximum); drafts shorter than `draft_min` are dropped.
    """

    types: tuple[str, ...] = ("ngram-mod",)
    draft_min: int = 0
    draft_max: int | None = None
    ngram_simple: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k4v: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_mod: NgramModParams = field(default_factory=NgramModParams)
    pool_bytes: int = DEFAULT_POOL_BYTES
    draft_p_min: float | None = None  # -md model: stop below this top probability (None: its own)
    policy: str = "fixed"  # "fixed": llama.cpp's lengths; "cost": chosen from t(K) and acceptance

    def __post_init__(self) -> None:
        validate(self)

    @property
    def enabled(self) -> bool:
        return bool(self.types)

    @property
    def auto(self) -> bool:
        return self.types == (AUTO,)

    def max_draft(self) -> int:
        """Longest draft any type in the chain can propose, after `draft_max`."""
        own = [self._type_max(t) for t in self.types] or [0]
        cap = max(own)
        return cap if self.draft_max is None else min(cap, self.draft_max)

    def _type_max(self, name: str) -> int:
        if name == AUTO:
            return 64
        return getattr(self.params(name), SPEC_TYPE[name].length)

    def params(self, name: str) -> NgramMapParams | NgramModParams:
        """The parameters of spec type `name` (SPEC_TYPE_TABLE)."""
        return getattr(self, SPEC_TYPE[name].field)

    def sizes(self) -> tuple[int, int]:
        """(key length, drafted length) as llama-server reports them
        (`speculative.ngram_size_n/m`): those of the chain's first type, ngram-simple's
        for auto or an empty chain."""
        first = self.types[0] if self.types and self.types[0] in SPEC_TYPE else "ngram-simple"
        t, p = SPEC_TYPE[first], self.params(first)
        return getattr(p, t.key), getattr(p, t.length)

    def with_params(self, role: str, value: int) -> "SpecConfig":
        """Every type's `role` parameter ("key", "length" or "hits", SpecType) set to
        `value` (types without that role unchanged)."""
        changes = {}
        for t in SPEC_TYPE_TABLE:
            name = getattr(t, role)
            if name is not None:
                extra = {"n_min": min(self.ngram_mod.n_min, value)} if name == "n_max" else {}
                changes[t.field] = replace(self.params(t.name), **{name: value}, **extra)
        return replace(self, **changes)

    def override(self, *, type: str | None = None, n_max: int | None = None,
                 n_min: int | None = None, p_min: float | None = None,
                 ngram_size_n: int | None = None, ngram_size_m: int | None = None,
                 ngram_min_hits: int | None = None) -> "SpecConfig":
        """This config with a request's `speculative` fields applied (None: unchanged),
        clamped as llama-server clamps them, then validated.

        type -> types; n_max -> draft_max (>= 0); n_min -> draft_min (0..n_max);
        ngram_size_n -> every type's key length; ngram_size_m -> every type's drafted
        length (ngram-mod's n_min lowered to it); both clamped to [1, NGRAM_LIMIT];
        ngram_min_hits -> min_hits of the types that have the setting ([1, 65535]);
        p_min -> the draft model's least top probability (draft_p_min). Each type's
        parameter for each role: SPEC_TYPE_TABLE."""
        cfg = self if type is None else replace(self, types=parse_spec_types(type))
        for role, value, hi in (("key", ngram_size_n, NGRAM_LIMIT), ("hits", ngram_min_hits, 65535),
                                ("length", ngram_size_m, NGRAM_LIMIT)):
            if value is not None:
                cfg = cfg.with_params(role, _clamp(value, 1, hi))
        if p_min is not None:
            cfg = replace(cfg, draft_p_min=float(p_min))
        draft_max = cfg.draft_max if n_max is None else _clamp(n_max, 0)
        draft_min = cfg.draft_min if n_min is None else _clamp(n_min, 0)
        if draft_max is not None:
            draft_min = min(draft_min, draft_max)
        return replace(cfg, draft_max=draft_max, draft_min=draft_min)

    def with_types(self, types: str | Sequence[str]) -> "SpecConfig":
        parsed = parse_spec_types(types)
        return replace(self, types=parsed, policy="cost" if parsed == (AUTO,) else self.policy)


def _clamp(v: int, lo: int, hi: int | None = None) -> int:
    v = max(v, lo)
    return min(v, hi) if hi is not None else v


def parse_spec_types(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Parse llama.cpp's `--spec-type` value: a comma list, or "none".

    llama.cpp's draft-model types (`DRAFT_MODEL_TYPES`) add nothing to the n-gram
    chain: the -md model drafts when the chain has nothing (`uses_draft_model`
    tells the caller to insist on -md).

    >>> parse_spec_types("ngram-mod,ngram-map-k4v")
    ('ngram-mod', 'ngram-map-k4v')
    >>> parse_spec_types("none")
    ()
    >>> parse_spec_types("draft-simple,ngram-mod")
    ('ngram-mod',)
    """
    if value is None:
        return ()
    names = _type_names(value)
    if not names:
        raise ConfigError(f"--spec-type is empty; valid values: {valid_types_text()}")
    names = [n for n in names if n not in DRAFT_MODEL_TYPES]  # the -md model drafts
    if not names:
        return ()
    if any(n in OFF_TYPES for n in names):
        if len(names) > 1:
            raise ConfigError("--spec-type 'none' cannot be combined with other types")
        return ()
    if AUTO in names:
        if len(names) > 1:
            raise ConfigError("--spec-type 'auto' cannot be combined with other types")
        return (AUTO,)
    unknown = [n for n in names if n not in SPEC_TYPES]
    if "ngram-cache" in unknown:
        raise ConfigError("spec type 'ngram-cache' (llama.cpp's lookup-cache drafter) is not "
                          "implemented here; use ngram-map-k, ngram-mod or auto")
    if unknown:
        raise ConfigError(f"unknown spec type {unknown[0]!r}; valid values: {valid_types_text()}")
    return tuple(dict.fromkeys(names))  # keep order, drop repeats


def _type_names(value: str | Sequence[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(v).strip().lower() for v in items if str(v).strip()]


def uses_draft_model(value: str | Sequence[str] | None) -> bool:
    """Whether a `--spec-type` value names one of llama.cpp's draft-model types."""
    return value is not None and any(n in DRAFT_MODEL_TYPES for n in _type_names(value))


def check_draft_model(value: str | Sequence[str] | None, has_draft_model: bool) -> None:
    """ConfigError if a request's spec type names a draft-model type on an engine that
    loaded no draft model (it would silently decode without one)."""
    if uses_draft_model(value) and not has_draft_model:
        raise ConfigError(f"speculative.type {value!r} needs a draft model, and none is loaded: "
                          "start with -md/--model-draft, or use an n-gram type")


def valid_types_text() -> str:
    return ", ".join(SPEC_TYPES + (AUTO,) + OFF_TYPES + DRAFT_MODEL_TYPES)


def _check_range(what: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{what} must be {bound}, got {value}")


def validate(cfg: SpecConfig) -> None:
    """Raise ConfigError for the first invalid field of `cfg`."""
    for t in cfg.types:
        if t not in SPEC_TYPES and (t != AUTO or len(cfg.types) > 1):
            raise ConfigError(f"unknown spec type {t!r}; valid values: {valid_types_text()}")
    if cfg.policy not in POLICIES:
        raise ConfigError(f"unknown draft policy {cfg.policy!r}; valid values: {', '.join(POLICIES)}")
    for t in SPEC_TYPE_TABLE:
        p, flag = cfg.params(t.name), f"--spec-{t.name}"
        _check_range(f"{flag}-{t.key.replace('_', '-')} (n)", getattr(p, t.key), 1, NGRAM_LIMIT)
        _check_range(f"{flag}-{t.length.replace('_', '-')} (m)", getattr(p, t.length), 1,
                     NGRAM_LIMIT)
        if isinstance(p, NgramMapParams):
            _check_range(f"{flag}-min-hits", p.min_hits, 1, 65535)
    mod = cfg.ngram_mod
    _check_range("--spec-ngram-mod-n-min", mod.n_min, 0, NGRAM_LIMIT)
    if mod.n_min > mod.n_max:
        raise ConfigError(f"--spec-ngram-mod-n-min ({mod.n_min}) must not exceed "
                          f"--spec-ngram-mod-n-max ({mod.n_max})")
    _check_range("--draft-min", cfg.draft_min, 0)
    if cfg.draft_max is not None:
        _check_range("--draft-max", cfg.draft_max, 0)
        if cfg.draft_min > cfg.draft_max:
            raise ConfigError(f"--draft-min ({cfg.draft_min}) must not exceed --draft-max "
                              f"({cfg.draft_max})")
    if cfg.draft_p_min is not None and not 0.0 <= cfg.draft_p_min <= 1.0:
        raise ConfigError(f"--draft-p-min must be between 0 and 1, got {cfg.draft_p_min!r}")
    _check_range("pool size (bytes)", cfg.pool_bytes, 1 << 13)
    if cfg.pool_bytes & (cfg.pool_bytes - 1):
        raise ConfigError(f"pool size must be a power of two bytes, got {cfg.pool_bytes}")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SpecOption:
    """One user-facing setting: its flags (first is canonical), target and help.

    `targets` are dotted SpecConfig paths the value is written to; a generic
    flag (e.g. --spec-ngram-size-n) writes every type's field, a per-type flag
    (applied later) overrides just its own.
    """

    dest: str
    flags: tuple[str, ...]
    targets: tuple[str, ...]
    help: str
    kind: type = int
    generic: bool = False


def _targets(role: str) -> tuple[str, ...]:
    """The SpecConfig paths a generic setting of `role` (SpecType) writes."""
    return tuple(f"{t.field}.{getattr(t, role)}" for t in SPEC_TYPE_TABLE if getattr(t, role))

SPEC_OPTIONS: tuple[SpecOption, ...] = (
    SpecOption("draft_max", ("--draft-max", "--draft-n", "--draft", "--spec-draft-n-max"),
               ("draft_max",), "cap on draft length for every spec type (default: the type's own max)"),
    SpecOption("draft_min", ("--draft-min", "--draft-n-min", "--spec-draft-n-min"),
               ("draft_min",), "drafts shorter than this are dropped (default: 0)"),
    SpecOption("spec_ngram_size_n", ("--spec-ngram-size-n",), _targets("key"),
               "key n-gram length for every ngram type (ngram-mod: n_match)", generic=True),
    SpecOption("spec_ngram_size_m", ("--spec-ngram-size-m",), _targets("length"),
               "drafted m-gram length for every ngram type (ngram-mod: n_max)", generic=True),
    SpecOption("spec_ngram_min_hits", ("--spec-ngram-min-hits",), _targets("hits"),
               "hits before a key drafts ("
               + ", ".join(t.name for t in SPEC_TYPE_TABLE if t.hits) + ")", generic=True),
) + tuple(
    SpecOption(f"spec_{t.field}_{f.name}", (f"--spec-{t.name}-{f.name.replace('_', '-')}",),
               (f"{t.field}.{f.name}",),
               f"{t.name} {f.name.replace('_', '-')} (default: {f.default})")
    for t in SPEC_TYPE_TABLE for f in dataclass_fields(t.params)
)


def _set_path(values: dict[str, Any], path: str, value: Any) -> None:
    head, _, leaf = path.partition(".")
    if not leaf:
        values[head] = value
    else:
        values.setdefault(head, {})[leaf] = value


def spec_config_from_options(spec_type: str | Sequence[str] | None = None,
                             pool_bytes: int | None = None, policy: str | None = None,
                             **options: Any) -> SpecConfig:
    """Build a validated SpecConfig from flat option values keyed by `SpecOption.dest`.

    None values mean "not given". Generic options are applied before per-type ones,
    so `--spec-ngram-size-n 8 --spec-ngram-map-k-size-n 4` gives map-k n=4, others 8.
    auto takes the cost policy unless `policy` is "fixed": then llama.cpp's chain of auto's
    drafters (the first that drafts, at its own length), as the flag asks.
    """
    known = {o.dest: o for o in SPEC_OPTIONS}
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigError(f"unknown speculation option(s): {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    ordered = sorted(SPEC_OPTIONS, key=lambda o: not o.generic)
    for opt in ordered:
        v = options.get(opt.dest)
        if v is None:
            continue
        for target in opt.targets:
            _set_path(values, target, v)
    kwargs: dict[str, Any] = {}
    for key, v in values.items():
        if isinstance(v, dict):
            base = NgramModParams() if key == "ngram_mod" else NgramMapParams()
            kwargs[key] = replace(base, **v)
        else:
            kwargs[key] = v
    mod = kwargs.get("ngram_mod")
    if mod is not None and options.get("spec_ngram_mod_n_min") is None and mod.n_min > mod.n_max:
        # a shorter n_max given without n_min: lower n_min with it rather than refuse
        kwargs["ngram_mod"] = replace(mod, n_min=mod.n_max)
    if spec_type is not None:
        kwargs["types"] = parse_spec_types(spec_type)
    if pool_bytes is not None:
        kwargs["pool_bytes"] = pool_bytes
    if policy is not None:
        kwargs["policy"] = policy
    if kwargs.get("types") == (AUTO,) and policy != "fixed":
        kwargs["policy"] = "cost"
    return SpecConfig(**kwargs)
