"""What XLA compiled a decoding program into: the buffer copies in its loop body.

    copies = loop_copies(prepared)   # [(shape, bytes), ...] copies per verify step

An in-place update of a loop-carried buffer (the KV cache, the GDN state) costs nothing; when
XLA cannot prove the old value dead it copies the buffer, every step. Read from the compiled
HLO text of ``decoding.prepare(...)``'s program (its ``while`` body with the most instructions:
the decode loop; the prefill's scans are smaller).
"""

from __future__ import annotations

import math
import re

_DTYPE_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "f16": 2, "s8": 1, "u8": 1}
_COPY = re.compile(r"=\s+(\w+)\[([\d,]*)\]\{[\d,]*\}\s+copy\(")


def _computations(text: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = comps.setdefault(head.group(1), [])
        elif current is not None:
            current.append(line)
    return comps


def loop_copies(prepared) -> list[tuple[str, int]]:
    """(shape, bytes) of every ``copy`` in the decode loop's body of a prepared call."""
    text = prepared.compiled()[0].as_text()  # the program cache's entry: what generate runs
    comps = _computations(text)
    bodies = [b.lstrip("%") for b in re.findall(r"while\(.*?body=(%?[\w.\-]+)", text)]
    if not bodies:
        raise ValueError("the compiled program has no while loop")
    body = max(bodies, key=lambda b: len(comps.get(b, [])))
    out = []
    for line in comps.get(body, []):
        m = _COPY.search(line)
        if m:
            dims = [int(x) for x in m.group(2).split(",") if x]
            out.append((f"{m.group(1)}{dims}", math.prod(dims) * _DTYPE_BYTES.get(m.group(1), 4)))
    return out
