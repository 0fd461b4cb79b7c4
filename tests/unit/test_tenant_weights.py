"""`CHATQ_TENANT_WEIGHTS` (chatq.tenant_weights) and its place in the settings."""

from __future__ import annotations

import pytest

from chatq.errors import ConfigError
from chatq.settings import load_settings
from chatq.tenant_weights import parse_tenant_weights


def test_named_tenants_get_their_weight_and_the_rest_the_star_or_one() -> None:
    weights = parse_tenant_weights(" acme=3, beta=0.5 ,*=2")
    assert weights.weight_of("acme") == 3 and weights.weight_of("beta") == 0.5
    assert weights.weight_of("other") == 2 and weights.weight_of(None) == 2
    assert parse_tenant_weights(None).weight_of("acme") == 1 == parse_tenant_weights("").default
    assert load_settings({"CHATQ_TENANT_WEIGHTS": "acme=4"}).tenant_weights.weight_of("acme") == 4


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("acme", "must be tenant=weight"),
        ("acme=", "must be a number"),
        ("acme=lots", "must be a number"),
        ("acme=0", "above 0"),
        ("acme=-1", "above 0"),
        ("acme=nan", "above 0"),
        ("acme=5000", "at most 1000"),
        ("a b=1", "must be tenant=weight"),
        ("acme=1,acme=2", "'acme' is given twice"),
        ("*=1,*=2", "'*' is given twice"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(raw: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"CHATQ_TENANT_WEIGHTS": raw})
    assert says in caught.value.message and "CHATQ_TENANT_WEIGHTS" in caught.value.message
    assert "\n" not in caught.value.message
