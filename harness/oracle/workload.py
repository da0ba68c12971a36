"""Request sequences drawn from a seed, at the lengths where the offloading rules turn.

Hand-written sequences test the cases someone thought of. These are drawn from a seed
(the same sequence on every machine) and lean on the places the connector's arithmetic
changes its answer: prompt lengths on a KV block, an offload chunk, a sliding window or
an attention chunk and one token either side; prefixes shared at every such length (a
prompt that extends an earlier one, one that diverges from it part-way, an exact
repeat); decodes that end on and across a chunk boundary; ``max_load_tokens`` caps on
and beside a chunk; aborted requests; tier resets between requests. Pure data: a step
names its tokens, never a server.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Token ids well inside every vocabulary the harness's models have, clear of the
# special tokens at either end.
TOKEN_LO, TOKEN_HI = 100, 900


@dataclass(frozen=True)
class Step:
    """One step of a sequence: a request (``tokens`` set) or a tier reset."""

    request: str = ""
    tokens: tuple[int, ...] = ()
    max_tokens: int = 1
    max_load_tokens: int | None = None
    abort_after: int | None = None
    reset_after: int | None = None  # the tier reset once it has generated this many
    reset: bool = False
    wave: int | None = None  # requests of one wave are served at once
    why: str = ""  # which rule the step leans on, for the report

    def record(self) -> dict[str, Any]:
        if self.reset:
            return {"reset": True, "why": self.why}
        out = asdict(self)
        out["tokens"] = list(self.tokens)
        del out["reset"]
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Step:
        if data.get("reset"):
            return cls(reset=True, why=str(data.get("why", "")))
        return cls(
            request=str(data["request"]),
            tokens=tuple(int(t) for t in data["tokens"]),
            max_tokens=int(data.get("max_tokens", 1)),
            max_load_tokens=data.get("max_load_tokens"),
            abort_after=data.get("abort_after"),
            reset_after=data.get("reset_after"),
            wave=data.get("wave"),
            why=str(data.get("why", "")),
        )


@dataclass(frozen=True)
class Shape:
    """What a sequence is drawn for: the units its lengths lean on and its limits."""

    chunk: int  # the offload chunk (the alignment group's)
    block: int  # the KV block
    windows: tuple[int, ...] = ()  # sliding windows and attention chunks
    max_prompt: int = 2048
    min_prompt: int = 2
    max_tokens: int = 4  # the most a request generates (decodes crossing a chunk: more)
    max_load: bool = True  # draw max_load_tokens caps
    aborts: bool = True
    resets: bool = True
    resets_in_flight: bool = False  # tier resets while a request decodes
    # Requests served at once (0 or 1: one at a time). A wave's prompts start with
    # different tokens, so they share no block and each is judged as if served alone.
    wave: int = 0

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.block < 1:
            raise ValueError("chunk and block must be positive")
        if self.max_prompt < max(self.min_prompt, 2):
            raise ValueError(f"max_prompt {self.max_prompt} leaves no room for a prompt")


@dataclass
class _Drawer:
    shape: Shape
    rng: random.Random
    documents: list[list[int]] = field(default_factory=list)
    prompts: list[tuple[int, ...]] = field(default_factory=list)

    def token_run(self, n: int) -> list[int]:
        return [self.rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]

    def boundary_lengths(self) -> list[int]:
        """Every multiple of each unit up to the longest prompt, and one either side."""
        s = self.shape
        units = {s.chunk, s.block, *s.windows}
        out: set[int] = set()
        for unit in units:
            for k in range(1, s.max_prompt // unit + 1):
                out |= {k * unit - 1, k * unit, k * unit + 1}
        return sorted(n for n in out if s.min_prompt <= n <= s.max_prompt)

    def length(self) -> int:
        if self.rng.random() < 0.8:
            return self.rng.choice(self.boundary_lengths())
        return self.rng.randint(self.shape.min_prompt, self.shape.max_prompt)

    def document(self) -> list[int]:
        if not self.documents or self.rng.random() < 0.3:
            self.documents.append(self.token_run(self.shape.max_prompt))
        return self.rng.choice(self.documents)

    def prompt(self) -> tuple[tuple[int, ...], str]:
        """A prompt and the rule it leans on."""
        r = self.rng.random()
        if self.prompts and r < 0.2:
            return self.rng.choice(self.prompts), "repeat"
        if self.prompts and r < 0.45:
            base = self.rng.choice(self.prompts)
            cut = min(len(base), self.length())
            rest = max(0, self.length() - cut)
            tail = self.token_run(rest) if rest else []
            return (*base[:cut], *tail)[: self.shape.max_prompt], "shares a prefix, then diverges"
        doc = self.document()
        return tuple(doc[: self.length()]), "a document's prefix"

    def max_tokens(self, prompt: int) -> tuple[int, str]:
        s = self.shape
        if self.rng.random() < 0.25:
            # End the decode on, or one past, the next chunk boundary.
            to_boundary = -(prompt + 1) % s.chunk + 1
            extra = self.rng.choice((0, 1))
            n = to_boundary + extra
            if 1 <= n <= s.max_tokens + s.chunk and prompt + n <= s.max_prompt + s.chunk:
                return n, "a decode ending on a chunk boundary" if not extra else "crossing one"
        return self.rng.randint(1, s.max_tokens), ""

    def max_load(self, prompt: int) -> int | None:
        if not self.shape.max_load or self.rng.random() >= 0.15:
            return None
        c = self.shape.chunk
        k = self.rng.randint(0, max(1, prompt // c))
        return max(0, k * c + self.rng.choice((-1, 0, 1)))


def draw(shape: Shape, seed: int, count: int) -> list[Step]:
    """``count`` requests (and the resets between them) from ``seed``."""
    if count < 1:
        raise ValueError(f"a sequence needs at least one request, not {count}")
    d = _Drawer(shape, random.Random(seed))
    steps: list[Step] = []
    wave = max(1, shape.wave)
    firsts: set[int] = set()  # the first tokens of the wave's prompts so far
    for i in range(count):
        if i % wave == 0:
            firsts.clear()
            if shape.resets and i and d.rng.random() < 0.04:
                steps.append(Step(reset=True, why="the tier reset between requests"))
        tokens, why = d.prompt()
        if len(tokens) < shape.min_prompt:
            tokens = tuple(d.token_run(shape.min_prompt))
        if wave > 1 and tokens[0] in firsts:
            # Another request of the wave starts the same way: this one stands apart.
            free = [t for t in range(TOKEN_LO, TOKEN_HI) if t not in firsts]
            tokens = (d.rng.choice(free), *tokens[1:])
            why += " (its first token changed: its wave shares no block)"
        firsts.add(tokens[0])
        max_tokens, decode_why = d.max_tokens(len(tokens))
        max_load = d.max_load(len(tokens))
        abort = reset_after = None
        if shape.aborts and max_tokens > 2 and d.rng.random() < 0.08:
            abort = d.rng.randint(1, max_tokens - 1)
        elif wave == 1 and shape.resets_in_flight and max_tokens > 1 and d.rng.random() < 0.15:
            reset_after = d.rng.randint(1, max_tokens)
        reasons = [why, decode_why]
        if max_load is not None:
            reasons.append(f"max_load_tokens {max_load}")
        if abort is not None:
            reasons.append(f"aborted after {abort}")
        if reset_after is not None:
            reasons.append(f"the tier reset after {reset_after} generated")
        d.prompts.append(tokens)
        steps.append(
            Step(
                request=f"r{i}",
                tokens=tokens,
                max_tokens=max_tokens,
                max_load_tokens=max_load,
                abort_after=abort,
                reset_after=reset_after,
                wave=i // wave if wave > 1 else None,
                why="; ".join(r for r in reasons if r),
            )
        )
    return steps


def waves_of(steps: Sequence[Step]) -> list[list[int]]:
    """The steps' indices as they are served: a reset alone, a request alone, or a
    wave's requests together (consecutive steps of one wave number)."""
    out: list[list[int]] = []
    for i, s in enumerate(steps):
        prev = steps[out[-1][-1]] if out else None
        if prev is not None and s.wave is not None and prev.wave == s.wave and not prev.reset:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def requests_of(steps: Sequence[Step]) -> list[Step]:
    return [s for s in steps if not s.reset]
