"""CHATQ_MODEL_LIMITS: parsed at start-up, one clear line for a bad value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatq.errors import ConfigError
from chatq.model_limits import ModelLimit, limit_for, parse_model_limits
from chatq.settings import load_settings


def test_entries_per_model_per_base_url_and_for_any_model(tmp_path: Path) -> None:
    raw = {
        "gpt-4o-mini": {"rpm": 500, "tpm": 200000},
        "gpt-4o-mini@http://gateway:8080/v1/": {"max_concurrent": 4},
        "*": {"rpm": 60},
    }
    path = tmp_path / "limits.json"
    path.write_text(json.dumps(raw))
    for source in (json.dumps(raw), str(path)):
        limits = parse_model_limits(source)
        assert limit_for(limits, "gpt-4o-mini", "https://api.openai.com/v1") == ModelLimit(
            key="gpt-4o-mini", rpm=500.0, tpm=200000.0
        )
        assert limit_for(limits, "gpt-4o-mini", "http://gateway:8080/v1") == ModelLimit(
            key="gpt-4o-mini@http://gateway:8080/v1/", max_concurrent=4
        )
        other = limit_for(limits, "llama", None)
        assert other is not None and other.rpm == 60.0
    assert limit_for(parse_model_limits('{"a": {"rpm": 1}}'), "b", None) is None
    assert parse_model_limits(None) == () == parse_model_limits("  ")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"m": 5}', "must be an object"),
        ('{"m": {"rps": 5}}', "unknown field 'rps'"),
        ('{"m": {"rpm": 0}}', "rpm must be a positive number"),
        ('{"m": {"rpm": true}}', "rpm must be a positive number"),
        ('{"m": {"max_concurrent": 1.5}}', "max_concurrent must be a whole number"),
        ("/no/such/limits.json", "cannot read"),
    ],
)
def test_bad_values_stop_start_up_with_one_line(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="CHATQ_MODEL_LIMITS") as info:
        load_settings({"CHATQ_MODEL_LIMITS": raw})
    assert fragment in info.value.message and "\n" not in info.value.message


def test_provider_settings_defaults_and_switch() -> None:
    settings = load_settings({})
    assert settings.provider_limits is True and settings.provider_patience == 900.0
    off = load_settings({"CHATQ_PROVIDER_LIMITS": "off", "CHATQ_PROVIDER_PATIENCE": "30"})
    assert off.provider_limits is False and off.provider_patience == 30.0
