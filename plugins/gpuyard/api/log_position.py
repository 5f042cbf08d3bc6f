"""Where a resumed log read starts: the lines a client already read, skipped per rank.

A client whose log stream broke (an API restart) asks again with `offset=RANK:LINES,...`, which it
counted as it read (gpuyard_client.log_offset). A gang's ranks interleave differently on each read,
but each rank's lines keep their order, so skipping each rank's first LINES lines skips exactly what
was read, whatever the interleaving. Lines end where the client's reader ends them (str.splitlines).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from gpuyard_client import log_line_rank

LINE_ENDS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines', as httpx's line reader


def whole_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The text of `chunks` cut into lines, each with its ending; a last unended line comes at the end."""
    held = ""
    for chunk in chunks:
        lines = (held + chunk).splitlines(keepends=True)
        # an unended last line waits for its end; so does a "\r" that a "\n" may follow
        held = lines.pop() if lines and (lines[-1][-1] not in LINE_ENDS or lines[-1].endswith("\r")) else ""
        yield from lines
    if held:
        yield held


def after_offset(chunks: Iterable[str], offset: Mapping[str, int]) -> Iterator[str]:
    """The log without each rank's first `offset[rank]` lines (all of it when `offset` is empty)."""
    if not any(offset.values()):
        yield from chunks
        return
    skipped: dict[str, int] = {}
    for line in whole_lines(chunks):
        rank = log_line_rank(line)
        if skipped.get(rank, 0) < offset.get(rank, 0):
            skipped[rank] = skipped.get(rank, 0) + 1
        else:
            yield line
