"""Scenario, variants and model-config loading: bad files are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import BadInput, ExitCode
from harness.scenario.crash_repro import load_crash_repro
from harness.scenario.schema import load_model_config, load_variants

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_scenario_loads_and_resolves_relative_paths():
    scen = load_crash_repro(ROOT / "scenarios" / "crash-repro.toml")
    assert scen.variants == ["stock", "stock+fix", "current", "current-no-amx"]
    assert scen.variant_models == {
        "current-no-amx": ["models/llama4-small-chunk.json"],
        "stock+fix": ["models/llama4-issue-51150.json", "models/llama4-small-chunk.json"],
    }
    assert scen.resolve(scen.models[0]) == ROOT / "scenarios" / "models" / "llama4-issue-51150.json"
    variants = load_variants(scen.resolve(scen.variants_file))
    assert variants["stock+fix"].patch == "chunked-local-fix"
    assert variants["current"].python == str(ROOT / ".venv" / "bin" / "python")
    assert (variants["current-no-amx"].amx, variants["current-no-amx"].requires_cpu) == (
        "off",
        ["amx_tile"],
    )


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


MINIMAL = """
name = "x"
variants = ["current"]
models = ["m.json"]
[[expectations]]
outcome = "started"
"""


def test_unknown_key_is_named(tmp_path):
    path = write(tmp_path, MINIMAL + "\n[server]\nmax_model_lenn = 5\n")
    with pytest.raises(BadInput) as err:
        load_crash_repro(path)
    assert "server.max_model_lenn" in str(err.value)
    assert "Extra inputs are not permitted" in str(err.value)
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_malformed_toml(tmp_path):
    with pytest.raises(BadInput, match="not valid TOML"):
        load_crash_repro(write(tmp_path, "name = [unclosed"))


def test_wrong_type_and_bad_outcome(tmp_path):
    with pytest.raises(BadInput, match=r"expectations\.0\.outcome"):
        load_crash_repro(write(tmp_path, MINIMAL.replace('"started"', '"exploded"')))
    with pytest.raises(BadInput, match="max_model_len"):
        load_crash_repro(write(tmp_path, MINIMAL + "\n[server]\nmax_model_len = -1\n"))


def test_bad_version_specifier(tmp_path):
    with pytest.raises(BadInput, match="not a version specifier"):
        load_crash_repro(
            write(tmp_path, MINIMAL + '\n[[expectations]]\nvllm = "~~1"\noutcome = "started"\n')
        )


def test_missing_file():
    with pytest.raises(BadInput, match="not found"):
        load_crash_repro(Path("/nonexistent/scenario.toml"))


def test_variants_unknown_patch(tmp_path):
    path = write(tmp_path, '[variants.a]\npython = "python3"\npatch = "make-it-work"\n', "v.toml")
    with pytest.raises(BadInput, match="unknown patch"):
        load_variants(path)


def test_model_config_must_be_json_object(tmp_path):
    with pytest.raises(BadInput, match="not valid JSON"):
        load_model_config(write(tmp_path, "{", "c.json"))
    with pytest.raises(BadInput, match="JSON object"):
        load_model_config(write(tmp_path, "[1]", "c.json"))
