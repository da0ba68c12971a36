"""First-match rule tables: which expectation applies to a row, a cell, a release.

Expectations are written as ordered lists of rules (``[[expectations]]`` in a
scenario). Each rule names only the facts it cares about; a field left ``None`` matches
anything. The first rule that matches wins, so a table reads top to bottom: specific
rules (one variant, one patch, a version range) first, a catch-all (no match fields)
last. Each table (crash repro rows, matrix cells, future release or bug-corpus
expectations) says which of its rule's fields are compared with equality; the vLLM
version is the one fact compared with a specifier rather than equality.

A rule may also say where it holds (``platform``: the device vLLM runs on, CPU flags of
the host). Tables that know their platform pass it as the facts ``device`` and
``cpu_flags``; a rule for another platform is passed over, and when only such rules would
have matched, :func:`platform_gap` says so ("no expectation on cuda: ...") instead of a
plan silently expecting what holds elsewhere (a CPU kernel's crash on a CUDA build).

This module is the single implementation of that matching, so every table treats
``None``, versions, platforms and ordering the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

R = TypeVar("R")


@dataclass(frozen=True)
class Match(Generic[R]):
    """The rule that matched and its position in the table.

    The position is kept so a caller can say *which* entry decided a verdict (two
    rules may be equal field for field yet sit in different places) without matching
    again.
    """

    index: int  # 0-based position in the list given to first_match
    rule: R


def version_matches(version: str, specifier: str) -> bool:
    """Whether a vLLM version satisfies a PEP 440 specifier.

    Pre-releases and dev builds are admitted (``prereleases=True``): the environments
    run nightly and source builds such as ``0.34.0.dev1``, and a rule like ``>=0.28``
    must cover them. PEP 440 ordering still applies, so a dev build sorts *before* its
    release: ``0.34.0.dev1`` is in ``>=0.28`` but not in ``<0.34`` (an exclusive bound
    never admits pre-releases of the bound itself) nor in ``>=0.34``; write
    ``>=0.34.0.dev0`` to include them.

    A version that cannot be parsed (it comes from the environment) matches no
    specifier, so it falls through to a rule without one. A specifier that cannot be
    parsed is the rule author's mistake and raises InvalidSpecifier; the scenario models
    refuse one at load.
    """
    try:
        return Version(version) in SpecifierSet(specifier, prereleases=True)
    except InvalidVersion:
        return False


def _holds_here(platform: Any, facts: Mapping[str, object]) -> bool:
    """Whether a rule's platform (``harness.scenario.schema.Platform``, or None: anywhere) holds
    for the facts' ``device`` and ``cpu_flags``."""
    if platform is None:
        return True
    flags = facts["cpu_flags"]
    assert isinstance(flags, Collection)
    return bool(platform.holds(str(facts["device"]), flags))


def _matches(
    rule: object,
    facts: Mapping[str, object],
    fields: Sequence[str],
    version_field: str | None,
    version_fact: str,
) -> bool:
    for name in fields:
        # getattr without a default: a field name the rule class lacks is a bug in the
        # caller's field list, and must not silently match everything.
        wanted = getattr(rule, name)
        if wanted is not None and wanted != facts[name]:
            return False
    if version_field is not None:
        specifier = getattr(rule, version_field)
        if specifier is not None and not version_matches(str(facts[version_fact]), specifier):
            return False
    return True


def first_match(
    rules: Sequence[R],
    facts: Mapping[str, object],
    *,
    fields: Sequence[str],
    version_field: str | None = "vllm",
    version_fact: str = "vllm_version",
    platform_field: str | None = None,
) -> Match[R] | None:
    """The first rule whose set fields all agree with ``facts``, or None.

    A rule matches when, for every name in ``fields`` the rule sets (not None), its
    value equals ``facts[name]``, and, when its ``version_field`` attribute (a PEP 440
    specifier, ``vllm`` by default) is set, ``facts[version_fact]`` satisfies it (see
    :func:`version_matches`). Pass ``version_field=None`` for rules without a version.

    Order is the rules' meaning: the first match wins, so callers list specific rules
    first and a catch-all last. None means nothing matched, which callers treat as a
    scenario error (a missing catch-all), not as "no expectation".

    With ``platform_field`` (``"platform"``), a rule whose platform does not hold for
    ``facts["device"]`` and ``facts["cpu_flags"]`` is passed over.

    Rules are read by attribute (pydantic models, dataclasses alike); a name in
    ``fields`` that a rule lacks raises AttributeError, and a fact a rule needs but
    ``facts`` lacks raises KeyError, rather than matching by accident.
    """
    return next(_matching(rules, facts, fields, version_field, version_fact, platform_field), None)


def _matching(
    rules: Sequence[R],
    facts: Mapping[str, object],
    fields: Sequence[str],
    version_field: str | None,
    version_fact: str,
    platform_field: str | None,
) -> Iterator[Match[R]]:
    for index, rule in enumerate(rules):
        if _matches(rule, facts, fields, version_field, version_fact) and (
            platform_field is None or _holds_here(getattr(rule, platform_field), facts)
        ):
            yield Match(index, rule)


def all_matches(
    rules: Sequence[R],
    facts: Mapping[str, object],
    *,
    fields: Sequence[str],
    platform_field: str | None = "platform",
) -> list[Match[R]]:
    """Every rule that matches, in order: for tables whose rules add up instead of the
    first one deciding (a release with two known bugs matches two pressure rules)."""
    return list(_matching(rules, facts, fields, "vllm", "vllm_version", platform_field))


def platform_gap(rules: Sequence[R], facts: Mapping[str, object], *, fields: Sequence[str]) -> str:
    """When :func:`first_match` (with ``platform_field="platform"`` and its version
    defaults) found nothing: what a plan says instead, if rules for another platform
    would have matched: "no expectation on cuda: the rule for it holds only on cpu with
    amx_tile (<its why>)". "" when none would (a table without its catch-all, the
    scenario's error)."""
    for rule in rules:
        platform = rule.platform  # type: ignore[attr-defined]
        if _matches(rule, facts, fields, "vllm", "vllm_version") and not _holds_here(
            platform, facts
        ):
            flags = facts["cpu_flags"]
            assert isinstance(flags, Collection)
            here = platform.mismatch(str(facts["device"]), flags)
            why = str(getattr(rule, "why", "") or "")
            return f"no expectation on {here}: the rule for it holds only on " + (
                platform.describe() + (f" ({why})" if why else "")
            )
    return ""
