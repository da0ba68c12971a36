"""Along the releases: each check's spans of equal outcome, where it changed, and the
bisect that finds one change by building about log2(N) environments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.commands.sweep.targets import NOT_RUN, UNAVAILABLE
from harness.results.records import SweepCell

# Outcomes that mean the build behaves: a span of one after a span of another is a fix.
HEALTHY = ("started", "pass")


@dataclass(frozen=True)
class Span:
    state: str
    releases: tuple[str, ...]

    @property
    def text(self) -> str:
        first, last = self.releases[0], self.releases[-1]
        return f"{self.state} {first}" if first == last else f"{self.state} {first}-{last}"


@dataclass(frozen=True)
class Transition:
    """One check along the releases: spans of equal outcome, and what changed where."""

    check: str
    spans: tuple[Span, ...]
    unavailable: tuple[str, ...] = ()

    def changes(self) -> list[tuple[str, Span, Span]]:
        """(verb, before, after) at each change: ``first good`` when a bad outcome gives
        way to a healthy one, ``first bad`` for the reverse, else ``changed``."""
        out = []
        for before, after in zip(self.spans, self.spans[1:], strict=False):
            was, now = _healthy(before.state), _healthy(after.state)
            verb = (
                "first good" if now and not was else "first bad" if was and not now else "changed"
            )
            out.append((verb, before, after))
        return out

    def text(self) -> str:
        """``llama4-issue-51150/connector-on: crashed #51150 0.27.0-0.27.1; started
        0.28.0-0.32.0; first good: 0.28.0``."""
        parts = [s.text for s in self.spans]
        parts += [f"{verb}: {after.releases[0]}" for verb, _, after in self.changes()]
        if not self.changes() and self.spans:
            parts.append("no change")
        if self.unavailable:
            parts.append(f"unavailable: {', '.join(self.unavailable)}")
        return f"{self.check}: " + "; ".join(parts)

    def record(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "spans": [{"state": s.state, "releases": list(s.releases)} for s in self.spans],
            "changes": [
                {"verb": v, "from": b.state, "to": a.state, "at": a.releases[0]}
                for v, b, a in self.changes()
            ],
            "unavailable": list(self.unavailable),
            "text": self.text(),
        }


def _healthy(state: str) -> bool:
    """Started (crash-repro), passed (roundtrip), or started and passed (matrix)."""
    return state in HEALTHY or state == "started, pass"


def transitions(cells: Iterable[SweepCell], release_order: Sequence[str]) -> list[Transition]:
    """Per check, in ``release_order`` (oldest first; user builds are not in it), the spans
    of equal state. Unavailable releases are skipped and listed apart, releases not run
    skipped: neither says anything about the behaviour."""
    rank = {r: i for i, r in enumerate(release_order)}
    by_check: dict[str, list[SweepCell]] = {}
    for c in cells:
        if c.release in rank:
            by_check.setdefault(c.check, []).append(c)
    out = []
    for check, found in by_check.items():
        found.sort(key=lambda c: rank[c.release])
        spans: list[list[Any]] = []
        missing = []
        for c in found:
            if c.outcome == NOT_RUN:
                continue  # the table says so; it tells nothing about the release
            if c.outcome == UNAVAILABLE:
                missing.append(c.release)
            elif spans and spans[-1][0] == c.state:
                spans[-1][1].append(c.release)
            else:
                spans.append([c.state, [c.release]])
        if spans or missing:  # a check never run anywhere has nothing to say
            out.append(
                Transition(check, tuple(Span(s, tuple(r)) for s, r in spans), tuple(missing))
            )
    return out


@dataclass
class BisectResult:
    check: str
    evaluated: list[str] = field(default_factory=list)  # releases run, in the order run
    states: dict[str, str | None] = field(default_factory=dict)  # None: unavailable
    last_before: str | None = None  # the newest release with the oldest one's state
    first_after: str | None = None  # the oldest release with another state

    def text(self) -> str:
        n = len(self.evaluated)
        if self.first_after is None:
            ends = [r for r in self.evaluated if self.states.get(r) is not None]
            if len(ends) < 2:
                return f"{self.check}: too few releases could be installed to bisect"
            if self.last_before is not None:
                return (
                    f"{self.check}: {self.states[ends[0]]} on the oldest and the newest "
                    f"release ({n} built): no change between them to bisect"
                )
            return f"{self.check}: the change lies among releases that cannot be installed"
        assert self.last_before is not None
        before, after = self.states[self.last_before], self.states[self.first_after]
        verb = (
            "first good"
            if _healthy(str(after)) and not _healthy(str(before))
            else ("first bad" if _healthy(str(before)) and not _healthy(str(after)) else "changed")
        )
        return (
            f"{self.check}: {before} up to {self.last_before}, {after} from "
            f"{self.first_after}; {verb}: {self.first_after} ({n} of the releases built)"
        )


def bisect(
    releases: Sequence[str], state_of: Callable[[str], str | None], check: str
) -> BisectResult:
    """The first release whose state differs from the oldest one's, by binary search.

    ``state_of`` runs the check on a release (None: the release cannot be installed);
    each release is run at most once. Assumes one change between the oldest and the newest
    (a span that flips back is found only if the search lands in it): the point is to
    build about log2(N) environments, not N. Unavailable releases are stepped over, the
    nearest installable one to the midpoint taken instead.
    """
    result = BisectResult(check)

    def state(i: int) -> str | None:
        r = releases[i]
        if r not in result.states:
            result.evaluated.append(r)
            result.states[r] = state_of(r)
        return result.states[r]

    lo, hi = 0, len(releases) - 1
    while lo <= hi and state(lo) is None:
        lo += 1
    while hi > lo and state(hi) is None:
        hi -= 1
    if hi <= lo:
        return result
    if state(lo) == state(hi):
        result.last_before = releases[hi]
        return result
    while hi - lo > 1:
        mid = _nearest_installable(lo, hi, state)
        if mid is None:
            # Every release between lo and hi is unavailable: the change is somewhere in there.
            break
        if state(mid) == state(lo):
            lo = mid
        else:
            hi = mid
    if hi - lo == 1 or all(state(i) is None for i in range(lo + 1, hi)):
        result.last_before, result.first_after = releases[lo], releases[hi]
    return result


def _nearest_installable(lo: int, hi: int, state: Callable[[int], str | None]) -> int | None:
    """The index strictly between lo and hi nearest their midpoint whose release installs."""
    mid = (lo + hi) // 2
    for step in range(hi - lo):
        for i in (mid - step, mid + step) if step else (mid,):
            if lo < i < hi and state(i) is not None:
                return i
    return None
