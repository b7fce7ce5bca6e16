"""Held-out documents nobody on the project wrote: Python's own standard library.

Pipelines are judged on real text, not on the fixtures the draft policy was
tuned on. This module builds prompts from the installed standard library, so
every machine that runs ngramspec has the same kind of corpus without a download:

- `edit`: a class's source (its first `EDIT_LINES` lines) and the request to
  repeat it with the class renamed (a code-refactor pipeline's prompt);
- `summary`: a module docstring and the request for its key facts, one per line
  (a summarization pipeline's prompt);
- `open`: a short open-ended prompt (little to copy: the control).

Invariants: `documents()` is deterministic for one Python installation; ids are
unique; the `eval` and `tune` splits share no source.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

EDIT_LINES = 70

#: (module, class, new name); eval and tune use disjoint classes
EDIT_SOURCES = {
    "eval": [
        ("queue", "Queue", "TaskQueue"), ("sched", "scheduler", "EventScheduler"),
        ("netrc", "netrc", "NetrcFile"), ("gettext", "NullTranslations", "NoTranslations"),
        ("string", "Template", "TextTemplate"), ("json.decoder", "JSONDecoder", "JsonReader"),
        ("textwrap", "TextWrapper", "LineWrapper"), ("shlex", "shlex", "ShellLexer"),
        ("configparser", "RawConfigParser", "PlainConfigParser"),
        ("argparse", "HelpFormatter", "UsageFormatter"), ("difflib", "SequenceMatcher", "SeqMatcher"),
        ("fractions", "Fraction", "Ratio"), ("cmd", "Cmd", "CommandShell"),
        ("csv", "DictReader", "MappingReader"), ("pprint", "PrettyPrinter", "NicePrinter"),
        ("calendar", "Calendar", "MonthCalendar"), ("logging", "Formatter", "LogFormatter"),
        ("threading", "Semaphore", "Gate"), ("zipfile", "ZipInfo", "ArchiveEntry"),
        ("tarfile", "TarInfo", "TarEntry"), ("http.cookiejar", "Cookie", "WebCookie"),
        ("email.message", "MIMEPart", "MimePart"), ("ipaddress", "IPv4Network", "Net4"),
        ("collections", "OrderedDict", "InsertionDict"),
    ],
    "tune": [
        ("contextlib", "ExitStack", "CleanupStack"), ("dataclasses", "Field", "DataField"),
        ("random", "Random", "RandomSource"), ("statistics", "NormalDist", "Gaussian"),
        ("urllib.parse", "SplitResult", "UrlParts"), ("smtplib", "SMTP", "MailClient"),
        ("ftplib", "FTP", "FileTransfer"), ("mailbox", "Mailbox", "MessageStore"),
    ],
}

#: modules whose docstrings are long prose
SUMMARY_SOURCES = {
    "eval": ["socketserver", "statistics", "fileinput", "shelve", "csv", "argparse", "cmd",
             "hashlib", "timeit", "copy", "uuid", "plistlib", "heapq", "struct",
             "subprocess", "pyclbr"],
    "tune": ["configparser", "re", "wave", "json", "site", "ssl"],
}

OPEN_PROMPTS = {
    "eval": ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
             "Explain to a new programmer why version control matters.",
             "Describe a walk through a city market in the early morning.",
             "What makes a good cup of tea? Give your opinion."],
    "tune": ["Write a poem about autumn rain.", "Describe your ideal weekend."],
}


@dataclass(frozen=True)
class Document:
    id: str
    kind: str  # "edit" | "summary" | "open"
    prompt: str


def edit_prompt(module: str, name: str, new: str | None, lines: int = EDIT_LINES) -> str:
    obj = getattr(importlib.import_module(module), name)
    src = "\n".join(inspect.getsource(obj).splitlines()[:lines])
    new = new or f"{name}_v2"
    return (f"Below is a Python class, followed by the same class with {name} renamed to {new}.\n"
            f"### Original\n```python\n{src}\n```\n### Renamed\n```python\n")


def summary_prompt(module: str) -> str:
    doc = inspect.getdoc(importlib.import_module(module)) or module
    return f"Text: {doc}\n\nThe key facts of the text, one per line:\n-"


def documents(n_edit: int = 6, n_summary: int = 4, n_open: int = 2,
              split: str = "eval") -> list[Document]:
    """The first n of each kind from `split` ("eval": the held-out set; "tune")."""
    if split not in EDIT_SOURCES:
        raise ValueError(f"unknown split {split!r}; use 'eval' or 'tune'")
    docs = [Document(f"edit-{m}.{c}", "edit", edit_prompt(m, c, new))
            for m, c, new in EDIT_SOURCES[split][:n_edit]]
    docs += [Document(f"summary-{m}", "summary", summary_prompt(m))
             for m in SUMMARY_SOURCES[split][:n_summary]]
    docs += [Document(f"open-{i}", "open", p) for i, p in enumerate(OPEN_PROMPTS[split][:n_open])]
    return docs


def interleave(docs: list[Document]) -> list[Document]:
    """Kinds alternated (edit, summary, open, edit, ...), so concurrent slots mix them."""
    by_kind: dict[str, list[Document]] = {}
    for d in docs:
        by_kind.setdefault(d.kind, []).append(d)
    out, queues = [], list(by_kind.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out
