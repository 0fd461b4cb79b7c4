"""A web app that only submits loads no runtime: `import worker.producer` pulls in the session side
(producer, deletion, dispatch) and the shared modules, never `worker.runtime`, `worker.ops` or
Celery's worker machinery."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import worker.producer
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(script: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.splitlines()[-1]))


def _forbidden(loaded: list[str]) -> list[str]:
    return [
        name
        for name in loaded
        if name.startswith(("worker.runtime", "worker.ops", "worker.wiring", "celery.worker", "celery.apps.worker"))
    ]


def test_importing_the_producer_loads_no_runtime_module() -> None:
    loaded = _loaded_by(SCRIPT)
    assert "worker.producer" in loaded and "worker.deletion" in loaded and "worker.dispatch" in loaded
    assert _forbidden(loaded) == []


def test_the_check_sees_a_runtime_module_when_one_is_loaded() -> None:
    # What the producer imported before: runtime/webhooks (scheduling) and runtime/deletion.
    loaded = _loaded_by(
        SCRIPT.replace("import worker.producer", "import worker.producer, worker.runtime.webhooks.deliveries")
    )
    assert "worker.runtime.webhooks.deliveries" in _forbidden(loaded)
