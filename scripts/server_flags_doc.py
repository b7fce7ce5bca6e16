"""Write the flag table of docs/server-flags.md from `ngramspec.settings.flags.FLAGS`.

    python scripts/server_flags_doc.py          # rewrite the table in place
    python scripts/server_flags_doc.py --check  # exit 1 if the doc is stale (tests run this)

Only the part between the two BEGIN/END markers is generated.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ngramspec.settings import flags  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "server-flags.md"
BEGIN, END = "<!-- BEGIN flag table (scripts/server_flags_doc.py) -->", "<!-- END flag table -->"
WHERE = {"model": "model / context", "sampling": "request default (sampling)",
         "request": "request default", "spec": "speculation", "server": "server",
         "noop": "accepted: already so", "ignored": "accepted, warns: no meaning here"}


def row(f: flags.Flag) -> str:
    names = ", ".join(f"`{n}`" for n in f.names)
    if f.neg:
        names += " / " + ", ".join(f"`{n}`" for n in f.neg)
    takes = "-" if f.switch or (f.type is bool and f.nargs == 1) else (f.metavar or "VALUE")
    what = f.help if f.target not in ("noop", "ignored") else (f.note or "")
    if f.note and f.target not in ("noop", "ignored"):
        what = (what + "; " if what else "") + "warns: " + f.note
    default = f.default_for("serve")
    shown = "" if default is None or f.switch else f" (default `{default}`)"
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    return f"| {names} | {cell(takes)} | {WHERE[f.target]} | {cell(what)}{shown} |"


def table() -> str:
    lines = ["| flags | value | goes to | what it does here |", "|---|---|---|---|"]
    lines += [row(f) for f in flags.for_command("serve")]
    return "\n".join(lines)


def render(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    current = DOC.read_text()
    fresh = render(current)
    if "--check" in sys.argv:
        sys.exit(0 if fresh == current else 1)
    DOC.write_text(fresh)
