"""The one first-match rule engine behind crash-repro rows and matrix cells."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.commands.matrix import find_rule
from harness.errors import BadInput
from harness.scenario.crash_repro import Expectation
from harness.scenario.matrix import CellExpectation, load_matrix
from harness.scenario.rules import Match, first_match, version_matches
from harness.server.crash_signatures import RowContext, match_expectation
from harness.server.crash_signatures import version_matches as reexported

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Rule:
    """A plain rule: first_match reads attributes, whatever the class."""

    name: str
    variant: str | None = None
    connector: bool | None = None
    vllm: str | None = None


FIELDS = ("variant", "connector")


def facts(variant: str = "stock", connector: bool = True, version: str = "0.27.1") -> dict:
    return {"variant": variant, "connector": connector, "vllm_version": version}


def names(rules: list[Rule], **kw: object) -> str | None:
    found = first_match(rules, facts(**kw), fields=FIELDS)
    return None if found is None else found.rule.name


def test_set_fields_compare_with_equality():
    rules = [Rule("stock", variant="stock"), Rule("no-connector", connector=False)]
    assert names(rules, variant="stock") == "stock"
    assert names(rules, variant="current", connector=False) == "no-connector"
    assert names(rules, variant="current", connector=True) is None


def test_a_field_left_none_matches_anything():
    rules = [Rule("off", connector=False), Rule("any")]
    for variant in ("stock", "current", ""):
        assert names(rules, variant=variant) == "any"
    assert names(rules, variant="current", connector=False) == "off"


def test_first_match_wins_so_specific_rules_go_first():
    specific_first = [Rule("specific", variant="stock", connector=True), Rule("catch-all")]
    assert names(specific_first) == "specific"
    catch_all_first = list(reversed(specific_first))
    assert names(catch_all_first) == "catch-all"  # shadows everything after it


def test_no_match_is_none_and_an_empty_table_matches_nothing():
    assert first_match([Rule("x", variant="current")], facts(), fields=FIELDS) is None
    assert first_match([], facts(), fields=FIELDS) is None


def test_the_index_of_the_matched_rule_is_reported():
    same = Rule("twin", variant="stock")
    rules = [Rule("a", variant="current"), same, Rule("c"), same]
    found = first_match(rules, facts(), fields=FIELDS)
    assert found == Match(1, same)
    assert found is not None and found.rule is same


def test_only_the_listed_fields_are_compared():
    rule = Rule("stock only", variant="stock")
    assert first_match([rule], facts(variant="current"), fields=("connector",)) == Match(0, rule)


def test_a_field_the_rule_lacks_is_an_error_not_a_wildcard():
    with pytest.raises(AttributeError):
        first_match([Rule("x")], facts(), fields=("varaint",))


@pytest.mark.parametrize(
    ("version", "specifier", "expected"),
    [
        ("0.27.1", "<0.28", True),
        ("0.28.0", "<0.28", False),
        ("0.32.0", ">=0.28", True),
        ("0.27.1+cpu", "==0.27.1", True),  # local build tag
        ("0.34.0.dev1", ">=0.28", True),  # dev builds are admitted
        ("0.34.0.dev1", "<0.34", False),  # ... but sort before their release
        ("0.34.0.dev1", ">=0.34", False),
        ("0.34.0.dev1", ">=0.34.0.dev0", True),
        ("0.33.1.dev5+g1234abc.cpu", "<0.34", True),
        ("0.34.0rc1", ">=0.28,<0.35", True),
        ("not-a-version", ">=0", False),
    ],
)
def test_version_specifiers(version, specifier, expected):
    assert version_matches(version, specifier) is expected


def test_a_bad_specifier_is_the_rule_authors_error():
    with pytest.raises(ValueError):  # packaging's InvalidSpecifier is a ValueError
        version_matches("0.27.1", "about 0.27")


def test_version_rules_in_a_table():
    rules = [Rule("old", vllm="<0.28"), Rule("new", vllm=">=0.28"), Rule("other")]
    assert names(rules, version="0.27.1") == "old"
    assert names(rules, version="0.34.0.dev1") == "new"
    assert names(rules, version="unparsable") == "other"


def test_version_field_and_fact_are_configurable():
    @dataclass
    class Release:
        release: str | None = None

    rules = [Release(release="<1.0"), Release()]
    found = first_match(rules, {"v": "1.2"}, fields=(), version_field="release", version_fact="v")
    assert found is not None and found.index == 1
    found = first_match(rules, {"v": "0.9"}, fields=(), version_field="release", version_fact="v")
    assert found is not None and found.index == 0


def test_rules_without_a_version_field_can_opt_out():
    plain = object()
    assert first_match([plain], {}, fields=(), version_field=None) == Match(0, plain)
    with pytest.raises(AttributeError):  # default version_field="vllm" must exist
        first_match([plain], {}, fields=())


def test_expectation_rows_keep_the_matched_index():
    rules = [
        Expectation(variant="stock", connector=True, chunked_local=True, outcome="crashed"),
        Expectation(vllm="<0.28", patch="none", connector=True, outcome="crashed"),
        Expectation(outcome="started"),
    ]
    row = RowContext("stock", "0.27.1", "none", True, True)
    assert match_expectation(row, rules) == Match(0, rules[0])
    row = RowContext("mine", "0.26.0", "none", True, False)
    assert match_expectation(row, rules) == Match(1, rules[1])
    row = RowContext("current", "0.34.0.dev1", "none", True, True)
    assert match_expectation(row, rules) == Match(2, rules[2])
    assert match_expectation(row, rules[:2]) is None
    assert reexported is version_matches


def test_pydantic_cell_rules_match_like_plain_ones():
    rules = [
        CellExpectation(family="mla", startup="unsupported"),
        CellExpectation(geometry="llama4-roundtrip", vllm="<0.28", startup="crashed"),
        CellExpectation(),
    ]
    cell = {"family": "chunked-local", "geometry": "llama4-roundtrip", "variant": "stock"}
    fields = ("family", "geometry", "variant")
    assert first_match(rules, {**cell, "vllm_version": "0.27.1"}, fields=fields) == Match(
        1, rules[1]
    )
    found = first_match(rules, {**cell, "vllm_version": "0.32.0"}, fields=fields)
    assert found is not None and found.index == 2


def test_matrix_cells_keep_the_matched_index():
    matrix = load_matrix(ROOT / "scenarios" / "matrix.toml")
    found = find_rule(matrix, "chunked-local", "llama4-roundtrip", "stock", "0.27.1")
    assert matrix.expectations[found.index] is found.rule
    assert (found.rule.startup, found.rule.known) == ("crashed", 51150)
    # The unmatched case is bad input with the rule engine's message.
    matrix.expectations = [CellExpectation(family="mla", startup="unsupported")]
    with pytest.raises(BadInput, match="no expectation matches full-attention / x / current"):
        find_rule(matrix, "full-attention", "x", "current", "0.32.0")
