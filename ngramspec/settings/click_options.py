"""Click options generated from the flag table (`settings.flags.FLAGS`): a command's
options, which flags the user gave, and the warnings for flags with no effect here.

Invariant: a flag is spelled, typed and documented once, in the table.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import click

from .flag import Flag
from ..errors import ConfigError
from .flags import FLAGS, for_command

#: click context settings of a command that takes llama.cpp flags
CONTEXT_SETTINGS = {"token_normalize_func": lambda name: name.replace("_", "-"),
                    "help_option_names": ["-h", "--help", "--usage"]}


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


