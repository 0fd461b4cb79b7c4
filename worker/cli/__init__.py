"""The `chatq` command line: the command itself (`commands`), the commands it adds (`turn_cli`,
`session_cli`, `approval_cli`, `batch_cli`, `kb_cli`) and what they use (`batch`, `batch_resume`, `follow`).

`chatq = "worker.cli:main"` (pyproject.toml) and `python -m worker.cli` (`__main__`) run it.
"""

from worker.cli.commands import main

__all__ = ["main"]
