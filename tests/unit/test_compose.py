"""docker-compose.yml, Dockerfile and .env.example: the deployment contract, checked without Docker.

Everything it reads is in this repository (the configuration table is docs/contract.md's).

`docker compose config` runs too when a Docker client with the compose plugin works; the
structural checks below run everywhere (CI clones have no Docker engine).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from chatq.settings import Settings
from worker.errors import ConfigError
from worker.gateway.command import refuse_placeholder_token
from worker.ops.flower import flower_command

ROOT = Path(__file__).resolve().parents[2]
APP_SERVICES = ("migrate", "worker", "beat", "flower", "gateway")
SERVICES = ("redis", "postgres", *APP_SERVICES)
CONTRACT = ROOT / "docs" / "contract.md"
"""Its "Configuration" section lists every variable chatq reads."""

_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?[-?+][^}]*)?\}")
_ONLY_REFERENCE = re.compile(rf"^{_REFERENCE.pattern}$")
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|BASIC_AUTH|REDISCLI_AUTH", re.IGNORECASE)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f".env.example: not NAME=value: {line!r}"
        assert name not in values, f".env.example sets {name} twice"
        values[name.strip()] = value.strip()
    return values


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def _env_files(service: dict[str, Any]) -> list[str]:
    files = service.get("env_file") or []
    files = [files] if isinstance(files, str | dict) else files
    return [f["path"] if isinstance(f, dict) else f for f in files]


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (*_strings(key), *_strings(value))]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


def _seconds(duration: str) -> float:
    """A compose duration ("130s", "2m10s", "1h") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a compose duration: {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def _docker_compose_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not _docker_compose_works(), reason="no Docker client with the compose plugin")
def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    # .env is git-ignored, so validate with the example in a scratch project directory.
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    project = ["--project-directory", str(tmp_path), "-f", str(tmp_path / "docker-compose.yml")]
    result = subprocess.run(
        ["docker", "compose", *project, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert set(SERVICES) <= set(services), f"missing: {set(SERVICES) - set(services)}"
    assert services["redis"]["image"].startswith("redis:7")
    assert services["postgres"]["image"].startswith("postgres:16")
    assert _environment(services["postgres"])["POSTGRES_DB"] == "chatq"


def test_migrate_is_a_one_shot_db_upgrade(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert _command(migrate) == ["db", "upgrade"]
    assert str(migrate.get("restart")) == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", ["worker", "beat", "flower", "gateway"])
def test_app_services_start_after_the_migration(services: dict[str, dict[str, Any]], name: str) -> None:
    depends_on = services[name]["depends_on"]
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"
    assert depends_on["redis"]["condition"] == "service_healthy"


def test_commands(services: dict[str, dict[str, Any]]) -> None:
    assert _command(services["worker"])[0] == "worker"
    assert _command(services["beat"])[0] == "beat"
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1
    flower = _command(services["flower"])
    assert flower[0] == "flower" and "--port=5555" in flower
    assert any(str(port).endswith("5555:5555") for port in services["flower"]["ports"])
    gateway = _command(services["gateway"])
    assert gateway[0] == "serve" and "--unauthenticated" not in gateway
    # Inside its container it must listen on all interfaces, or the published port reaches nothing.
    assert gateway[gateway.index("--host") + 1] == "0.0.0.0"
    assert any(str(port).endswith(f":{gateway[gateway.index('--port') + 1]}") for port in services["gateway"]["ports"])


def _host_ip(port: Any) -> str:
    """The host address a compose port mapping publishes on ("" for all interfaces)."""
    if isinstance(port, dict):
        return str(port.get("host_ip") or "")
    parts = str(port).rsplit(":", 2)
    return parts[0].strip("[]") if len(parts) == 3 else ""


def test_published_ports_are_on_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    """Flower's basic auth and the gateway's bearer token travel in clear text: nothing is published
    beyond this machine unless an operator changes it (behind a TLS proxy)."""
    published = {name: service.get("ports") or [] for name, service in services.items()}
    assert published["gateway"] and published["flower"]
    for name, ports in published.items():
        for port in ports:
            assert _host_ip(port) in ("127.0.0.1", "::1"), f"{name} publishes {port!r} on every interface"


def test_gateway_requires_its_token(services: dict[str, dict[str, Any]]) -> None:
    token = _environment(services["gateway"]).get("CHATQ_API_TOKEN", "")
    assert re.fullmatch(r"\$\{CHATQ_API_TOKEN:\?[^}]*\}", token), token


def test_the_example_secrets_are_refused_as_they_are(env_example: dict[str, str]) -> None:
    """`cp .env.example .env` without editing it must not give a gateway or a Flower anyone can use."""
    with pytest.raises(ConfigError, match="placeholder"):
        refuse_placeholder_token(env_example)
    with pytest.raises(ConfigError, match="placeholder"):
        flower_command(["--port=5555"], env_example)


def test_readme_names_every_compose_service(services: dict[str, dict[str, Any]]) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### docker compose", 1)[1].split("\n#", 1)[0]
    missing = [name for name in services if f"`{name}`" not in section]
    assert not missing, f"README's docker compose section does not name: {missing}"
    assert "127.0.0.1:8000" in section, "README must say where the gateway is published"


@pytest.mark.parametrize("name", ["redis", "postgres"])
def test_backing_services_have_healthchecks(services: dict[str, dict[str, Any]], name: str) -> None:
    check = services[name]["healthcheck"]
    assert not check.get("disable")
    assert check["test"] and check["test"] != ["NONE"]
    text = " ".join(check["test"])
    assert ("redis-cli" in text and "ping" in text) if name == "redis" else "pg_isready" in text


def test_redis_requires_its_password(services: dict[str, dict[str, Any]], env_example: dict[str, str]) -> None:
    command = _command(services["redis"])
    password = command[command.index("--requirepass") + 1]
    assert _ONLY_REFERENCE.match(password) and "REDIS_PASSWORD" in password
    # Without auth, `redis-cli ping` answers NOAUTH yet exits 0: the healthcheck must log in.
    assert "REDIS_PASSWORD" in _environment(services["redis"]).get("REDISCLI_AUTH", "")
    redis_url = urlsplit(env_example["REDIS_URL"])
    assert redis_url.hostname == "redis" and redis_url.password == env_example["REDIS_PASSWORD"]


def test_database_url_matches_the_postgres_service(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    url = urlsplit(env_example["DATABASE_URL"])
    env = _environment(services["postgres"])
    assert url.scheme == "postgresql+psycopg" and url.hostname == "postgres"
    assert url.username == env.get("POSTGRES_USER", "postgres")
    assert url.password == env_example["POSTGRES_PASSWORD"]
    assert url.path == "/" + env["POSTGRES_DB"]


def test_app_services_share_one_image_and_the_env_file(services: dict[str, dict[str, Any]]) -> None:
    builds = {json.dumps(services[name].get("build"), sort_keys=True) for name in APP_SERVICES}
    images = {services[name].get("image") for name in APP_SERVICES}
    assert len(builds) == 1 and builds != {"null"}, builds
    assert len(images) == 1, images
    for name in APP_SERVICES:
        assert _env_files(services[name]) == [".env"], name


def test_no_secret_values_inline(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for key, value in _environment(service).items():
            if _SECRET_NAME.search(key):
                assert _ONLY_REFERENCE.match(value), f"{name}: {key} must be a ${{VAR}} reference"
    for text in _strings(compose):
        assert "sk-" not in text, "an OpenAI key in docker-compose.yml"
        for match in re.finditer(r"[a-z][a-z0-9+.-]*://[^\s/@]*:(?P<pw>[^@\s/]+)@", text):
            assert _ONLY_REFERENCE.match(match["pw"]), f"a password inline in {text!r}"


def test_flower_requires_authentication(services: dict[str, dict[str, Any]], env_example: dict[str, str]) -> None:
    flower = services["flower"]
    assert "--unauthenticated" not in _command(flower)
    auth = _environment(flower).get("FLOWER_BASIC_AUTH", "")
    # `${VAR:?...}` makes compose refuse to start flower when the variable is unset or empty.
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]*\}", auth), auth
    user, _, password = env_example["FLOWER_BASIC_AUTH"].partition(":")
    assert user and password


def test_worker_stop_grace_outlasts_a_turn(services: dict[str, dict[str, Any]]) -> None:
    grace = _seconds(str(services["worker"]["stop_grace_period"]))
    assert grace > Settings().turn_timeout == 120.0


def test_dockerfile_runs_chatq_as_a_non_root_user() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0].startswith("FROM python:3.11-slim")
    users = [line.split(None, 1)[1] for line in instructions if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    entrypoints = [line.split(None, 1)[1] for line in instructions if line.upper().startswith("ENTRYPOINT ")]
    assert entrypoints and json.loads(entrypoints[-1]) == ["chatq"]
    installs = [line for line in instructions if "pip install" in line]
    assert installs and not any("[dev]" in line for line in installs)


def test_secrets_stay_out_of_git_and_the_image() -> None:
    gitignore = {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()}
    dockerignore = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert ".env" in gitignore
    assert ".env" in dockerignore


def _documented_variables() -> set[str]:
    section = CONTRACT.read_text().split("\n## Configuration", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", section))
    assert {"DATABASE_URL", "REDIS_URL", "CHATQ_MODEL", "FLOWER_BASIC_AUTH", "CHATQ_API_TOKEN"} <= names
    return names


def test_the_contract_documents_every_setting() -> None:
    """Every CHATQ_ variable chatq/settings.py and chatq/gateway_variables.py read is in docs/contract.md's
    configuration table."""
    sources = [ROOT / "chatq" / name for name in ("settings.py", "gateway_variables.py")]
    read = set(re.findall(r'"(CHATQ_[A-Z0-9_]+)"', "\n".join(path.read_text() for path in sources)))
    assert read and read <= _documented_variables(), sorted(read - _documented_variables())


def test_env_example_names_only_documented_variables(compose: dict[str, Any], env_example: dict[str, str]) -> None:
    referenced = {m["name"] for text in _strings(compose) for m in _REFERENCE.finditer(text)}
    # Compose-only variables are documented by their use in docker-compose.yml.
    unknown = set(env_example) - _documented_variables() - referenced
    assert not unknown, f".env.example names undocumented variables: {sorted(unknown)}"
    missing = referenced - set(env_example)
    assert not missing, f"docker-compose.yml needs these in .env.example: {sorted(missing)}"
    assert env_example["OPENAI_API_KEY"] == ""
    assert {"DATABASE_URL", "REDIS_URL", "CHATQ_MODEL", "FLOWER_BASIC_AUTH"} <= set(env_example)
