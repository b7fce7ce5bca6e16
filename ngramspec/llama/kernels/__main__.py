"""`python -m ngramspec.llama.kernels build`: compile every kernel into the cache folder now
(scripts/setup.sh runs it), trying again after a remembered failure. Prints one line a
kernel; exits 0 whatever happened (a kernel that cannot be built leaves llama.cpp's
computation in place), 2 on a wrong command line."""
from __future__ import annotations

import sys

from . import KERNELS, build, guard


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m ngramspec.llama.kernels build", file=sys.stderr)
        return 2
    # the drafters' loops and the folded steps: plain C for any CPU (Python runs where they fail)
    for name, what in ((build.DRAFTING, "drafting loops"), (build.FOLD, "folded steps")):
        built = build.library(name, build.GENERIC, force=True)
        print(f"ngramspec {what} ({build.GENERIC}): " +
              (f"built ({built.path})" if built.lib is not None else f"not built, {built.reason}"))
    reason = guard.cpu_reason()
    if reason:
        print(f"ngramspec kernels: not built, {reason}; llama.cpp's kernels run instead")
        return 0
    for k in KERNELS:
        for variant in k.candidates():
            built = build.library(k.source, variant, force=True)
            print(f"ngramspec kernel {k.name} ({variant}): " +
                  (f"built ({built.path})" if built.lib is not None else f"not built, {built.reason}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
