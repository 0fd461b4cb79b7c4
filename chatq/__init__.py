"""chatq's bottom layer: what every other package may import and which imports none of them.

`chatq.errors` holds the root exception of the whole product. `worker/`, `models/` and `handlers/`
build on this package; it never imports them (ruff's banned-api rule in chatq/ruff.toml holds it).
"""

__all__: list[str] = []
