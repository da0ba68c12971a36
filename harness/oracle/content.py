"""Whether every load read back exactly the KV stored under its key: the content ledger
(``harness.engine.content_ledger``) judged.

The ledger's lines come from several processes: the scheduler's manager says which
offload key each CPU slot was prepared for (``assign``), each worker rank what the
engine's blocks held at every store and load (a digest per layer). Replayed in time
order, a slot's key at a copy is the key it was last prepared for, so each stored block
is remembered by (key, rank, block within the chunk) and each loaded block is held to
it. A load of a key stored before the ledger began (an earlier server's disk tier) has
nothing to be held to and is counted as unverified, never passed.

Pure Python over the files: no vLLM, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ContentError:
    """The first way one loaded block differs from what was stored under its key."""

    key: str
    group: int
    rank: int
    block: int  # the block within its chunk
    layer: int  # the first layer tensor (of the group's) whose bytes differ
    job: int
    why: str

    def text(self) -> str:
        return (
            f"key {self.key[:16]}... group {self.group} rank {self.rank} block {self.block} "
            f"layer {self.layer} (load job {self.job}): {self.why}"
        )


@dataclass
class ContentReport:
    stored_blocks: int = 0
    loaded_blocks: int = 0
    unverified: int = 0  # loads of keys stored before the ledger began
    unmapped: int = 0  # copies of a slot no key was prepared for (a ledger gap)
    errors: list[ContentError] = field(default_factory=list)  # the first few
    wrong: int = 0  # every wrong block, listed or not
    files: int = 0

    @property
    def checked(self) -> int:
        return self.loaded_blocks - self.unverified - self.unmapped

    @property
    def passed(self) -> bool:
        return not self.errors and not self.unmapped

    def observed(self) -> str:
        text = f"{self.checked} of {self.loaded_blocks} loaded blocks held to their stores: "
        text += f"{self.wrong} wrong" if self.wrong else "all the same"
        if self.unverified:
            text += f", {self.unverified} stored before the ledger began"
        if self.unmapped:
            text += f", {self.unmapped} from a slot no key was prepared for"
        return text


def read_events(directory: Path) -> tuple[list[dict[str, Any]], int]:
    """Every ledger line under ``directory`` in time order; and how many files."""
    files = sorted(directory.glob("*.jsonl"))
    events: list[dict[str, Any]] = []
    for path in files:
        for raw in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut by a killed process
            if isinstance(event, dict) and "t" in event:
                events.append(event)
    events.sort(key=lambda e: int(e["t"]))
    return events, len(files)


def _blocks(event: dict[str, Any]) -> Iterator[tuple[int, int, int, list[int]]]:
    for group, row, sub, layers in event.get("blocks") or ():
        yield int(group), int(row), int(sub), [int(d) for d in layers]


def judge(
    events: Iterable[dict[str, Any]], files: int = 0, keep: int = 20, since: int = 0
) -> ContentReport:
    """The ledger's events, in time order, judged; at most ``keep`` errors kept. Loads
    before ``since`` (``time.monotonic_ns``) are replayed but not counted: a server that
    serves several rounds is judged round by round."""
    report = ContentReport(files=files)
    slot_key: dict[int, str] = {}
    stored: dict[tuple[str, int, int], list[int]] = {}
    wrong = 0
    for event in events:
        op = event.get("op")
        if op == "assign":
            for key, slot in zip(event.get("keys") or (), event.get("slots") or (), strict=False):
                slot_key[int(slot)] = str(key)
            continue
        if op not in ("store", "load"):
            continue
        rank, job = int(event.get("rank", 0)), int(event.get("job", -1))
        for group, row, sub, layers in _blocks(event):
            key = slot_key.get(row)
            if op == "store":
                report.stored_blocks += 1
                if key is not None:
                    stored[(key, rank, sub)] = layers
                continue
            if int(event["t"]) < since:
                continue
            report.loaded_blocks += 1
            if key is None:
                report.unmapped += 1
                continue
            want = stored.get((key, rank, sub))
            if want is None:
                report.unverified += 1
                continue
            if want == layers:
                continue
            wrong += 1
            if len(report.errors) < keep:
                layer = next(
                    (i for i, (a, b) in enumerate(zip(want, layers, strict=False)) if a != b),
                    min(len(want), len(layers)),
                )
                report.errors.append(
                    ContentError(
                        key,
                        group,
                        rank,
                        sub,
                        layer,
                        job,
                        "the engine's block after the load is not the block stored under this key",
                    )
                )
    report.wrong = wrong
    return report


def judge_directories(directories: Iterable[Path], since: int = 0) -> ContentReport:
    """The ledgers of every server of a run (a restart's second server loads what the
    first stored) judged as one."""
    events: list[dict[str, Any]] = []
    files = 0
    for directory in directories:
        more, n = read_events(directory)
        events += more
        files += n
    events.sort(key=lambda e: int(e["t"]))
    return judge(events, files, since=since)


def judge_directory(directory: Path) -> ContentReport:
    return judge_directories([directory])
