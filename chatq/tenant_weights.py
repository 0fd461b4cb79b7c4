"""`CHATQ_TENANT_WEIGHTS`: how the capacity of a shared limit is split between tenants that wait for it.

Comma-separated `tenant=weight` entries, `*` for every tenant without its own entry (default 1):

    CHATQ_TENANT_WEIGHTS=acme=3,beta=1,*=1

While a model's limit holds turns back, each backlogged tenant's batch turns get that limit's capacity
in proportion to its weight (`worker.runtime.policy.limits`); a tenant with nothing waiting takes no
share, so the others get its part at once. Sessions without a tenant count as one tenant of their own,
`NO_TENANT`. Parsed once at start-up, so a bad value stops the worker with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chatq.errors import ConfigError
from chatq.tenants import TENANT_RULE, is_tenant_name

__all__ = ["ANY_TENANT", "MAX_WEIGHT", "NO_TENANT", "TenantWeights", "parse_tenant_weights"]

ANY_TENANT = "*"
"""The entry whose weight applies to every tenant without its own."""
NO_TENANT = "-"
"""The name the limits give sessions without a tenant (no tenant name can be `-`)."""
MAX_WEIGHT = 1000.0
"""The largest weight: a ratio beyond 1000:1 is a misconfiguration, not a share."""


@dataclass(frozen=True, kw_only=True)
class TenantWeights:
    """The parsed `CHATQ_TENANT_WEIGHTS`."""

    weights: tuple[tuple[str, float], ...] = ()
    """`(tenant, weight)` for each tenant named, in the order given."""
    default: float = 1.0
    """The weight of every other tenant, and of sessions without one (`*`; 1 unless set)."""

    def weight_of(self, tenant: str | None) -> float:
        """The weight of `tenant` (None: a session without a tenant)."""
        if tenant:
            for name, weight in self.weights:
                if name == tenant:
                    return weight
        return self.default


def parse_tenant_weights(raw: str | None) -> TenantWeights:
    """The weights in `raw`; ConfigError naming the entry and what is wrong with it."""
    entries: dict[str, float] = {}
    default = 1.0
    parts = [part.strip() for part in (raw or "").split(",") if part.strip()]
    for number, part in enumerate(parts, start=1):
        tenant, equals, value = (piece.strip() for piece in part.partition("="))
        where = f"entry {number} of CHATQ_TENANT_WEIGHTS ({part!r})"
        if not equals or not (tenant == ANY_TENANT or is_tenant_name(tenant)):
            raise ConfigError(f"{where} must be tenant=weight (e.g. acme=3), the tenant '*' or {TENANT_RULE}")
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(f"{where}: the weight must be a number") from None
        if not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT:
            raise ConfigError(f"{where}: the weight must be above 0 and at most {MAX_WEIGHT:g}")
        if tenant in entries:
            raise ConfigError(f"{where}: {tenant!r} is given twice")
        entries[tenant] = weight
        if tenant == ANY_TENANT:
            default = weight
    named = tuple((name, weight) for name, weight in entries.items() if name != ANY_TENANT)
    return TenantWeights(weights=named, default=default)
