#!/usr/bin/env python3
"""Write a model's first N transformer blocks as a GGUF of its own: a fast decode.

    python tests/fast_model.py IN.gguf OUT.gguf N

The output keeps every metadata key (the block count set to N), the vocabulary, the
embeddings, the output norm and head, and the tensors of blocks 0..N-1, unchanged
(same quantisation, same bytes). Its text is nonsense but deterministic: fine for
exactness checks, and for measuring speculation where a decode costs ~1-2 ms (the
SmolLM2-135M file cut to 4 blocks; scripts/setup.sh makes it). Needs the `gguf`
package (PyPI).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _kept(tensor_name: str, n_blocks: int) -> bool:
    m = _BLOCK.match(tensor_name)
    return m is None or int(m.group(1)) < n_blocks


def cut(src: Path, dst: Path, n_blocks: int) -> int:
    """Write `src` with its first `n_blocks` blocks to `dst`; the tensors written."""
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    have = reader.fields[f"{arch}.block_count"].contents()
    if not 1 <= n_blocks <= have:
        raise SystemExit(f"{src} has {have} blocks: N must be 1..{have}, got {n_blocks}")
    out = GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer adds these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = n_blocks if key == f"{arch}.block_count" else field.contents()
        out.add_key_value(key, value, kind, sub_type=sub)
    tensors = [t for t in reader.tensors if _kept(t.name, n_blocks)]
    for t in tensors:
        out.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return len(tensors)


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    src, dst, n = Path(argv[0]), Path(argv[1]), int(argv[2])
    tmp = dst.with_name(dst.name + ".part")
    count = cut(src, tmp, n)
    tmp.replace(dst)  # never a half-written model at the final path
    print(f"{dst}: {n} blocks, {count} tensors")


if __name__ == "__main__":
    main(sys.argv[1:])
