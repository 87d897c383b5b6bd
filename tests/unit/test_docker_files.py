"""docker/: the compose file and the Dockerfile agree with the package, without Docker.

No Docker engine runs here, so every claim the files make is checked against what they
name: each command is run as far as it can be without its services (the Celery app
imports, the subcommand and each option are known to the ``celery`` command that would
parse them, a ``python -m`` module has a ``main`` and accepts its options), each
published port reaches something that listens on it, and each ``AGBOSS_*`` variable
parses as celery_agboss's settings. The shop's code is imported in subprocesses given
exactly a service's environment (this file run as a script, ``--probe``), as it would
be in its container.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
README = DOCKER / "README.md"

ISSUE_SERVICES = (
    "postgres",
    "redis",
    "rabbitmq",
    "migrate",
    "fake-stripe",
    "worker",
    "beat",
    "flower",
    "web",
)
ONE_SHOT = "migrate"
FAKE_GATEWAY = "fake-stripe"
CALLERS_OF_THE_FAKE = ("worker", "web")
SHOP_APP = "example_project.shop"
# What each third-party image is and listens on (its own documented default port).
IMAGES = {
    "postgres": ("postgres:16", 5432),
    "redis": ("redis:7", 6379),
    "rabbitmq": ("rabbitmq:3", 5672),
}
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets", "include"}
# The compose specification's service keys (docker compose refuses any other); a word
# list reads better than eighty-odd lines of a set literal.
SERVICE_KEYS = set(
    """annotations attach blkio_config build cap_add cap_drop cgroup cgroup_parent command
    configs container_name cpu_count cpu_percent cpu_period cpu_quota cpu_rt_period
    cpu_rt_runtime cpu_shares cpus cpuset depends_on deploy develop device_cgroup_rules
    devices dns dns_opt dns_search domainname entrypoint env_file environment expose extends
    external_links extra_hosts gpus group_add healthcheck hostname image init ipc isolation
    labels links logging mac_address mem_limit mem_reservation mem_swappiness memswap_limit
    network_mode networks oom_kill_disable oom_score_adj pid pids_limit platform ports
    post_start pre_stop privileged profiles pull_policy read_only restart runtime scale
    secrets security_opt shm_size stdin_open stop_grace_period stop_signal storage_opt
    sysctls tmpfs tty ulimits user userns_mode uts volumes volumes_from working_dir""".split()  # noqa: SIM905
)
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
PROBE_SECONDS = 60.0
PROBE_MARK = "DOCKER-FILES-PROBE "
# Variables a service's probe must not inherit from the shell that runs pytest.
FOREIGN_ENV_PREFIXES = ("AGBOSS_", "CELERY_", "STRIPE_", "FLOWER_", "EXAMPLE_")


# --- compose: loading it as docker compose would ------------------------------------------


class UnsetVariable(Exception):
    """The compose file needs a variable from the host that has no default."""


_VARIABLE = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.DOTALL)


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Compose's ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``, ``${VAR:?e}``, ``$$``."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        if match.group(3):
            name, operator, operand = match.group(3), None, ""
        else:
            braced = _BRACED.match(match.group(2))
            if braced is None:
                raise ValueError(f"bad substitution {match.group(0)!r}")
            name, operator, operand = braced.group(1), braced.group(2), braced.group(3) or ""
        value = environ.get(name)
        if operator == ":-":
            return value if value else operand
        if operator == "-":
            return operand if value is None else value
        if operator == ":+":
            return operand if value else ""
        if operator == "+":
            return "" if value is None else operand
        if value is None or (operator == ":?" and not value):
            raise UnsetVariable(f"{match.group(0)} needs {name} set on the host")
        return value

    return _VARIABLE.sub(substitute, text)


def _interpolated(node: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, environ)
    if isinstance(node, list):
        return [_interpolated(item, environ) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, environ) for key, value in node.items()}
    return node


def raw_compose() -> dict[str, Any]:
    import yaml

    loaded = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), "docker/compose.yaml is a mapping"
    return loaded


@cache
def compose() -> dict[str, Any]:
    """The file as ``docker compose up`` sees it on a host that sets nothing."""
    return dict(_interpolated(raw_compose(), {}))


def services() -> dict[str, dict[str, Any]]:
    found = compose().get("services")
    assert isinstance(found, dict) and found, "docker/compose.yaml declares services"
    return found


def built() -> list[str]:
    """The services that run the shop's image."""
    return [name for name, spec in services().items() if "build" in spec]


def argv_of(command: Any) -> list[str]:
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list) and all(isinstance(part, str) for part in command)
    return list(command)


def command_of(service: str) -> list[str]:
    spec = services()[service]
    if "command" in spec:
        return argv_of(spec["command"])
    assert "build" in spec, f"{service} runs its image's own command, unknown here"
    return dockerfile().cmd


def environment_of(service: str) -> dict[str, str]:
    raw = services()[service].get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, None) for item in raw)
    unset = sorted(name for name, value in raw.items() if value is None)
    assert not unset, f"{service}: {unset} pass through from the host, which may not set them"
    return {str(name): str(value) for name, value in raw.items()}


def healthcheck_argv(service: str) -> list[str] | None:
    """The healthcheck's command as argv (a shell one split), None when there is none."""
    check = services()[service].get("healthcheck")
    if not check or check.get("disable"):
        return None
    test = check.get("test")
    if isinstance(test, str):
        return shlex.split(test)
    assert isinstance(test, list) and test, f"{service}: healthcheck.test is a list or a string"
    kind, *rest = test
    if kind == "NONE":
        return None
    if kind == "CMD-SHELL":
        assert len(rest) == 1, f"{service}: CMD-SHELL takes one shell string"
        return shlex.split(rest[0])
    assert kind == "CMD", f"{service}: healthcheck.test starts with CMD, CMD-SHELL or NONE"
    return list(rest)


def seconds(duration: Any) -> float:
    """A compose duration (``1m30s``, ``500ms``, ``20s``) in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"duration {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


@dataclass(frozen=True)
class Published:
    host_ip: str
    host_port: int
    container_port: int


def published_ports(service: str) -> list[Published]:
    found = []
    for entry in services()[service].get("ports") or []:
        if isinstance(entry, dict):
            found.append(
                Published(
                    str(entry.get("host_ip", "")),
                    int(entry.get("published", 0)),
                    int(entry["target"]),
                )
            )
            continue
        text = str(entry).split("/", 1)[0]
        parts = text.rsplit(":", 2)
        assert len(parts) == 3, f"{service}: {entry!r} names a host address and port"
        found.append(Published(parts[0], int(parts[1]), int(parts[2])))
    return found


def namespace_of(service: str) -> str:
    """The service whose network namespace ``service`` runs in."""
    mode = str(services()[service].get("network_mode", ""))
    return mode.removeprefix("service:") if mode.startswith("service:") else service


def option_value(argv: Sequence[str], name: str) -> str | None:
    """``--name value`` or ``--name=value`` in ``argv``."""
    for index, token in enumerate(argv):
        if token == name and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


# --- the Dockerfile ------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    destination: str


@dataclass(frozen=True)
class Dockerfile:
    instructions: tuple[tuple[str, str], ...]

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    @property
    def workdir(self) -> str:
        found = self.all("WORKDIR")
        assert found, "the Dockerfile sets a WORKDIR"
        return found[-1]

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for token in shlex.split(args):
                assert "=" in token, f"ENV {args!r}: use the KEY=value form"
                key, value = token.split("=", 1)
                values[key] = value
        return values

    @property
    def copies(self) -> list[Copy]:
        found = []
        for args in self.all("COPY"):
            tokens = json.loads(args) if args.startswith("[") else shlex.split(args)
            tokens = [token for token in tokens if not token.startswith("--")]
            assert len(tokens) >= 2, f"COPY {args!r} has sources and a destination"
            found.append(Copy(tuple(tokens[:-1]), tokens[-1]))
        return found

    @property
    def cmd(self) -> list[str]:
        found = self.all("CMD")
        assert found, "the Dockerfile has a default command"
        parsed = json.loads(found[-1])
        assert isinstance(parsed, list), "CMD is in the exec (JSON) form"
        return [str(part) for part in parsed]

    def copied_to(self, destination: str) -> str | None:
        """The repository path a file of the image comes from, if a COPY put it there."""
        for copy in self.copies:
            for source in copy.sources:
                name = PurePosixPath(source.rstrip("/")).name
                target = copy.destination
                if target.endswith("/") or len(copy.sources) > 1:
                    target = str(PurePosixPath(target) / name)
                target = target.rstrip("/")
                if destination == target:
                    return source.rstrip("/")
                if destination.startswith(target + "/"):
                    return source.rstrip("/") + destination[len(target) :]
        return None


@cache
def dockerfile() -> Dockerfile:
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    instructions = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return Dockerfile(tuple(instructions))


def image_path_in_repo(path: str) -> Path | None:
    """Where a path of the image (absolute, or relative to WORKDIR) is in the checkout."""
    absolute = path if path.startswith("/") else f"{dockerfile().workdir.rstrip('/')}/{path}"
    source = dockerfile().copied_to(str(PurePosixPath(absolute)))
    return None if source is None else ROOT / source


def excluded_by_dockerignore(relative: str) -> bool:
    """Whether ``.dockerignore`` keeps ``relative`` out of the build context (last match wins)."""
    if not DOCKERIGNORE.exists():
        return False
    path = PurePosixPath(relative)
    candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
    excluded = False
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        patterns = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        if any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns):
            excluded = not negated
    return excluded


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    return parser


def pip_install_targets() -> list[tuple[str, set[str]]]:
    """Each ``path[extra,…]`` the Dockerfile's ``pip install`` installs."""
    found = []
    for args in dockerfile().all("RUN"):
        for segment in re.split(r"&&|;", args):
            tokens = shlex.split(segment)
            if "pip" not in tokens or "install" not in tokens:
                continue
            for token in tokens[tokens.index("install") + 1 :]:
                match = re.fullmatch(r"([^\[\]<>=!~]+)\[([^\]]*)\]", token)
                if match and match.group(1).startswith(("/", ".")):
                    extras = {part.strip() for part in match.group(2).split(",") if part.strip()}
                    found.append((match.group(1), extras))
    return found


# --- the probe: a service's commands, run as far as they go without its services ----------


def _click_options(command: Any) -> dict[str, Any]:
    import click

    return {
        name: param
        for param in command.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def _takes_value(param: Any) -> bool:
    return not (param.is_flag or param.count)


def _flower_listener(argv: Sequence[str], where: str) -> tuple[list[str], dict[str, Any]]:
    """Flower parses its own options (tornado's, ``--name=value`` only) and its --conf."""
    import flower.command
    import flower.options  # defines Flower's options on tornado's parser
    from tornado.options import options

    problems = []
    for token in argv:
        name, equals, _ = token.partition("=")
        if not token.startswith("--"):
            problems.append(f"{where}: flower takes only --name=value options, not {token!r}")
        elif name[2:] not in options:
            problems.append(f"{where}: flower has no option {name}")
        elif not equals and options._options[name[2:].replace("_", "-")].type is not bool:
            problems.append(f"{where}: flower reads {name} only as {name}=VALUE")
    if problems:
        return problems, {}
    try:
        flower.command.apply_env_options()
        flower.command.apply_options("flower", list(argv))
    except Exception as exc:  # reported: the test fails on it
        return [f"{where}: flower refuses its options: {exc!r}"], {}
    if options.conf and not Path(options.conf).is_file():
        problems.append(f"{where}: flower's --conf {options.conf} is not a file")
    return problems, {"port": options.port, "address": options.address}


def _celery_problems(argv: Sequence[str], apps: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Walk ``celery …`` as click would: every option and subcommand known, the app loads."""
    from celery import Celery
    from celery.app.utils import find_app
    from celery.bin.celery import celery as celery_group
    from celery.worker.control import Panel

    where = shlex.join(argv)
    command: Any = celery_group
    tokens = list(argv[1:])
    path = ["celery"]
    problems: list[str] = []
    if not (option_value(argv, "-A") or option_value(argv, "--app")):
        problems.append(f"{where}: names no app (-A)")
    while True:
        options = _click_options(command)
        positionals: list[str] = []
        descend: Any = None
        index = 0
        while index < len(tokens):
            token = tokens[index]
            if token.startswith("-") and token != "-":
                name, equals, value = token.partition("=")
                param = options.get(name)
                if param is None:
                    problems.append(f"{where}: `{' '.join(path)}` has no option {name}")
                    return problems, {}
                if _takes_value(param) and not equals:
                    index += 1
                    value = tokens[index] if index < len(tokens) else ""
                if name in ("-A", "--app"):
                    try:
                        app = find_app(value)
                    except Exception as exc:  # reported: the test fails on it
                        problems.append(f"{where}: the app {value!r} does not load: {exc!r}")
                        return problems, {}
                    if not isinstance(app, Celery):
                        problems.append(f"{where}: {value!r} is {type(app)!r}, not a Celery app")
                        return problems, {}
                    apps[value] = app
                index += 1
                continue
            if hasattr(command, "commands") and not positionals:
                descend = command.commands.get(token)
                if descend is None:
                    problems.append(f"{where}: `{' '.join(path)}` has no subcommand {token!r}")
                    return problems, {}
                tokens = tokens[index + 1 :]
                path.append(token)
                break
            positionals.append(token)
            index += 1
        if descend is None:
            break
        command = descend
        if command.name == "flower":
            flower_problems, listener = _flower_listener(tokens, where)
            return problems + flower_problems, listener
    if hasattr(command, "commands"):
        problems.append(f"{where}: `{' '.join(path)}` needs a subcommand")
    if command.name in ("inspect", "control"):
        known = {name for name, info in Panel.meta.items() if info.type == command.name}
        if not positionals or positionals[0] not in known:
            problems.append(f"{where}: `celery {command.name}` has no command {positionals[:1]}")
    return problems, {}


def _module_problems(argv: Sequence[str]) -> list[str]:
    """``python -m M --opt …``: M has a ``main`` and its ``--help`` lists every option used."""
    import contextlib
    import importlib
    import importlib.util
    import io

    where, module = shlex.join(argv), argv[2]
    if importlib.util.find_spec(module) is None:
        return [f"{where}: no module {module}"]
    loaded = importlib.import_module(module)
    if not callable(getattr(loaded, "main", None)):
        return [f"{where}: {module} has no main()"]
    used = [token.split("=", 1)[0] for token in argv[3:] if token.startswith("--")]
    if not used:
        return []
    shown = io.StringIO()
    saved, sys.argv = sys.argv, [module, "--help"]
    try:
        with contextlib.redirect_stdout(shown):
            loaded.main()
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return [f"{where}: --help exited {exit_.code}"]
    finally:
        sys.argv = saved
    return [
        f"{where}: {module} --help lists no {name}" for name in used if name not in shown.getvalue()
    ]


def probe(commands: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Run in a subprocess with one service's environment: what is wrong with each command."""
    from celery_agboss.runtime.settings import settings_from_conf

    results: dict[str, Any] = {}
    apps: dict[str, Any] = {}
    for argv in commands:
        listener: dict[str, Any] = {}
        if argv[:1] == ["celery"]:
            problems, listener = _celery_problems(argv, apps)
        elif list(argv[:2]) == ["python", "-m"] and len(argv) > 2:
            problems = _module_problems(argv)
        else:
            problems = [f"{shlex.join(argv)}: neither `celery …` nor `python -m …`"]
        results[shlex.join(argv)] = {"problems": problems, "listener": listener}
    conf: dict[str, Any] = {}
    for name, app in apps.items():
        entry: dict[str, Any] = {"broker_url": app.conf.broker_url}
        try:
            settings = settings_from_conf(app.conf)
        except Exception as exc:  # reported: the test fails on it
            entry["settings_error"] = str(exc)
        else:
            entry["database_url"] = settings.database_url
        conf[name] = entry
    return {"commands": results, "apps": conf}


def service_process_env(service: str) -> dict[str, str]:
    """This machine's environment, minus the shop's variables, plus the container's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV_PREFIXES)}
    env.update(dockerfile().env)
    env.update(environment_of(service))
    # The image's /app holds the repository's own layout (test_the_image_mirrors...).
    env["PYTHONPATH"] = str(ROOT)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_probe(env: Mapping[str, str], commands: Sequence[Sequence[str]]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--probe"],
        input=json.dumps([list(argv) for argv in commands]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(env),
        timeout=PROBE_SECONDS,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"the probe exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1][len(PROBE_MARK) :])
    return result


def readme_exec_commands() -> Iterator[tuple[str, list[str]]]:
    """``(service, argv)`` for each ``docker compose … exec SERVICE argv`` in the README."""
    for argv in readme_compose_commands():
        sub, rest = argv[0], argv[1:]
        if sub != "exec":
            continue
        positionals = [token for token in rest if not token.startswith("-")]
        if positionals:
            start = rest.index(positionals[0])
            yield positionals[0], rest[start + 1 :]


def probed_commands(service: str) -> list[list[str]]:
    found = [command_of(service)]
    check = healthcheck_argv(service)
    if check and check[0] == "celery":
        found.append(check)
    found += [argv for name, argv in readme_exec_commands() if name == service]
    if service == "worker":
        found.append(dockerfile().cmd)
    return [argv for argv in found if argv[:1] == ["celery"] or argv[:2] == ["python", "-m"]]


@pytest.fixture(scope="module")
def probes() -> dict[str, dict[str, Any]]:
    """Per shop service: its commands' problems, its listeners, its app's conf.

    One subprocess per distinct environment (the shop's services share one), in parallel.
    """
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in built():
        groups.setdefault(tuple(sorted(service_process_env(name).items())), []).append(name)
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        runs = {
            key: pool.submit(
                run_probe,
                dict(key),
                list({shlex.join(c): c for n in names for c in probed_commands(n)}.values()),
            )
            for key, names in groups.items()
        }
        found: dict[str, dict[str, Any]] = {}
        for key, names in groups.items():
            result = runs[key].result()
            for name in names:
                mine = [result["commands"][shlex.join(c)] for c in probed_commands(name)]
                found[name] = {
                    "problems": [problem for entry in mine for problem in entry["problems"]],
                    "listeners": {
                        shlex.join(c): entry["listener"]
                        for c, entry in zip(probed_commands(name), mine, strict=True)
                        if entry["listener"]
                    },
                    "apps": result["apps"],
                }
        return found


def readme_compose_commands() -> Iterator[list[str]]:
    """The argv after ``docker compose -f docker/compose.yaml [--profile P]`` of each command."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.DOTALL)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
                tokens.pop(0)
            if tokens[:2] != ["docker", "compose"]:
                continue
            rest = tokens[2:]
            while rest and rest[0] in ("-f", "--file", "--profile"):
                if rest[0] in ("-f", "--file"):
                    assert rest[1] == "docker/compose.yaml", f"the README runs {line!r}"
                rest = rest[2:]
            assert rest, f"the README's {line!r} names a compose command"
            yield rest


# --- the tests: the compose file -----------------------------------------------------------


def test_the_compose_file_has_known_top_level_keys_and_every_service_an_image_or_a_build() -> None:
    document = raw_compose()
    unknown = {key for key in document if key not in TOP_LEVEL_KEYS and not key.startswith("x-")}
    assert not unknown, f"unknown top-level keys {unknown}"
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", str(document.get("name", ""))), "a project name"
    for name, spec in services().items():
        assert isinstance(spec, dict), name
        unknown = {key for key in spec if key not in SERVICE_KEYS and not key.startswith("x-")}
        assert not unknown, f"{name}: compose knows no {sorted(unknown)}"
        assert set(spec.get("healthcheck") or {}) <= HEALTHCHECK_KEYS | {"disable"}, name
        for dependency in (spec.get("depends_on") or {}).values():
            assert set(dependency) <= {"condition", "restart", "required"}, name
        assert "image" in spec or "build" in spec, f"{name} has neither image nor build"
        for volume in spec.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in (document.get("volumes") or {}), f"{name}: volume {source}"


def test_every_service_of_the_issue_is_declared() -> None:
    assert set(ISSUE_SERVICES) <= set(services()), sorted(set(ISSUE_SERVICES) - set(services()))


def test_the_third_party_services_run_the_images_the_issue_names() -> None:
    for name, (image, _) in IMAGES.items():
        assert services()[name]["image"] == image, name


def test_rabbitmq_starts_only_under_the_test_profile() -> None:
    for name, spec in services().items():
        assert spec.get("profiles", []) == (["test"] if name == "rabbitmq" else []), name
        assert "rabbitmq" not in (spec.get("depends_on") or {}), f"{name} waits for rabbitmq"


def test_every_shop_service_builds_the_dockerfile_from_the_repository_root() -> None:
    assert set(built()) == set(ISSUE_SERVICES) - set(IMAGES)
    for name in built():
        build = services()[name]["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_the_compose_file_needs_no_variable_from_the_host() -> None:
    compose.cache_clear()
    try:
        compose()
    except UnsetVariable as exc:
        pytest.fail(str(exc))


def test_every_command_names_an_app_subcommand_and_options_that_exist(
    probes: dict[str, dict[str, Any]],
) -> None:
    problems = [problem for name in built() for problem in probes[name]["problems"]]
    assert not problems, "\n".join(problems)
    for name in built():
        argv = command_of(name)
        if argv[0] == "celery":
            assert option_value(argv, "-A") == SHOP_APP, name


def test_the_image_runs_the_worker_by_default() -> None:
    assert dockerfile().cmd == command_of("worker")


def test_every_long_running_service_has_a_healthcheck_and_migrate_runs_once() -> None:
    for name, spec in services().items():
        if name == ONE_SHOT:
            assert spec.get("restart") == "no", "migrate is not restarted once it exited 0"
            assert healthcheck_argv(name) is None, "migrate exits; it has nothing to check"
            continue
        assert healthcheck_argv(name), f"{name} has no healthcheck"
        check = spec["healthcheck"]
        assert seconds(check["interval"]) > 0 and int(check["retries"]) >= 1, name
        assert spec.get("restart") == "unless-stopped", name


def test_the_healthchecks_ask_the_service_itself_and_wait_long_enough(
    listeners: dict[str, tuple[int, str]],
) -> None:
    for name in services():
        argv = healthcheck_argv(name)
        if not argv:
            continue
        if argv[:2] == ["python", "-c"]:
            compile(argv[2], f"{name} healthcheck", "exec")
            ports = [int(port) for port in re.findall(r"http://127\.0\.0\.1:(\d+)/", argv[2])]
            assert ports, f"{name}: the healthcheck asks a loopback URL"
            assert all(port == listeners[name][0] for port in ports), f"{name} checks {ports}"
        if argv[0] == "celery":
            destination = option_value(argv, "--destination") or option_value(argv, "-d")
            assert destination and destination.endswith("@$HOSTNAME"), f"{name}: ping itself"
            expected = "celerybeat" if "beat" in command_of(name) else "celery"
            assert destination.split("@")[0] == expected, f"{name} pings {destination}"
            timeout = float(option_value(argv, "--timeout") or 1)
            assert seconds(services()[name]["healthcheck"]["timeout"]) > timeout, name
        if name in IMAGES:
            assert argv[0] in ("pg_isready", "redis-cli", "rabbitmq-diagnostics"), argv


def test_beat_answers_its_healthcheck() -> None:
    assert "--enable-remote-control" in command_of("beat"), "beat answers inspect ping"


def _waits_for(service: str) -> set[str]:
    """Every service that must be healthy or done before ``service`` starts."""
    seen: set[str] = set()
    todo = [service]
    while todo:
        for dependency, spec in (services()[todo.pop()].get("depends_on") or {}).items():
            assert isinstance(spec, dict), "depends_on uses the long form, with a condition"
            waits = spec.get("condition") in ("service_healthy", "service_completed_successfully")
            if waits and dependency not in seen:
                seen.add(dependency)
                todo.append(dependency)
    return seen


def test_the_start_order_waits_for_healthy_services_and_a_finished_migrate() -> None:
    for name, spec in services().items():
        for dependency, condition in (spec.get("depends_on") or {}).items():
            assert dependency in services(), f"{name} depends on unknown {dependency}"
            wanted = (
                "service_completed_successfully" if dependency == ONE_SHOT else "service_healthy"
            )
            assert condition.get("condition") == wanted, f"{name} → {dependency}"
        assert name not in _waits_for(name), f"{name} waits for itself"
    assert {"postgres"} <= _waits_for(ONE_SHOT)
    for name in ("worker", "beat", "web", "flower"):
        assert {ONE_SHOT, "postgres", "redis"} <= _waits_for(name), name
    for name in CALLERS_OF_THE_FAKE:
        assert FAKE_GATEWAY in _waits_for(name), name


def fake_gateway_port() -> int:
    port = option_value(command_of(FAKE_GATEWAY), "--port")
    assert port, "fake-stripe is started on a known --port"
    return int(port)


@pytest.fixture(scope="module")
def listeners(probes: dict[str, dict[str, Any]]) -> dict[str, tuple[int, str]]:
    """What each service listens on: (port, address); '0.0.0.0' is every interface."""
    listeners: dict[str, tuple[int, str]] = {
        name: (port, "0.0.0.0") for name, (_, port) in IMAGES.items()
    }
    listeners[FAKE_GATEWAY] = (fake_gateway_port(), "127.0.0.1")  # it never binds elsewhere
    web = command_of("web")
    assert option_value(web, "--host") == "0.0.0.0", "web listens on every interface"
    listeners["web"] = (int(option_value(web, "--port") or 0), "0.0.0.0")
    flower = probes["flower"]["listeners"].get(shlex.join(command_of("flower")))
    assert flower, "flower's port and address are known"
    listeners["flower"] = (int(flower["port"]), flower["address"] or "0.0.0.0")
    return listeners


def test_every_published_port_binds_loopback_and_reaches_a_listener(
    listeners: dict[str, tuple[int, str]],
) -> None:
    published = {name: published_ports(name) for name in services()}
    for name, ports in published.items():
        if namespace_of(name) != name:
            assert not ports, f"{name} shares a namespace: its ports go on {namespace_of(name)}"
        in_namespace = {
            listeners[member]
            for member in services()
            if namespace_of(member) == name and member in listeners
        }
        for port in ports:
            assert port.host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            reachable = {p for p, address in in_namespace if address == "0.0.0.0"}
            assert port.container_port in reachable, f"{name}: nothing listens on {port}"
    for name in ("web", "flower", "postgres", "redis", "rabbitmq"):
        wanted = listeners[name][0]
        owner = namespace_of(name)
        assert any(p.container_port == wanted for p in published[owner]), f"{name} unpublished"


def test_the_callers_of_the_fake_gateway_share_its_network_and_reach_its_port() -> None:
    fake_port = fake_gateway_port()
    for name in CALLERS_OF_THE_FAKE:
        assert services()[name].get("network_mode") == f"service:{FAKE_GATEWAY}", name
        # A restarted fake is a new namespace: its callers must follow it.
        assert services()[name]["depends_on"][FAKE_GATEWAY].get("restart") is True, name
        base = urlsplit(environment_of(name)["STRIPE_API_BASE"])
        assert (base.scheme, base.hostname, base.port) == ("http", "127.0.0.1", fake_port), name
    for name in built():
        env = environment_of(name)
        assert env["STRIPE_API_KEY"].startswith("sk_test_"), "never a live key in this file"
        assert env["STRIPE_WEBHOOK_SECRET"].startswith("whsec_"), name


def test_every_agboss_variable_is_a_setting_celery_agboss_knows_and_parses() -> None:
    from celery_agboss.runtime.settings import settings_from_conf

    for name in built():
        env = environment_of(name)
        agboss = {key: value for key, value in env.items() if key.startswith("AGBOSS_")}
        assert "AGBOSS_TESTING" not in agboss, f"{name}: a fixed test key is no demo setting"
        assert {"AGBOSS_DATABASE_URL", "AGBOSS_PSEUDONYM_KEY"} <= set(agboss), name
        # As conf keys, an unknown name is refused (the environment would ignore it).
        settings_from_conf({key.lower(): value for key, value in agboss.items()}, environ={})
        settings = settings_from_conf({}, environ=env)
        assert settings.database_url == env["AGBOSS_DATABASE_URL"]
        assert not settings.testing_key


def _databases_created(service: str) -> set[str]:
    spec = services()[service]
    env = environment_of(service)
    created = {env.get("POSTGRES_DB") or env.get("POSTGRES_USER") or "postgres"}
    for volume in spec.get("volumes") or []:
        source, target = str(volume).split(":")[:2]
        if target.startswith("/docker-entrypoint-initdb.d/") and source.startswith("."):
            sql = (DOCKER / source).read_text(encoding="utf-8")
            created |= set(re.findall(r"(?im)^\s*CREATE\s+DATABASE\s+(\w+)", sql))
    return created


def test_the_store_and_broker_urls_point_at_the_compose_services() -> None:
    from sqlalchemy.engine import make_url

    for name in built():
        env = environment_of(name)
        store = make_url(env["AGBOSS_DATABASE_URL"])
        assert store.get_backend_name() == "postgresql" and store.host in services(), name
        host = str(store.host)
        assert services()[host]["image"].startswith("postgres:"), name
        assert (store.port or 5432) == IMAGES["postgres"][1], name
        assert store.database in _databases_created(host), f"nothing creates {store.database}"
        postgres_env = environment_of(host)
        assert store.username == postgres_env.get("POSTGRES_USER", "postgres"), name
        if postgres_env.get("POSTGRES_HOST_AUTH_METHOD") != "trust":
            assert store.password == postgres_env.get("POSTGRES_PASSWORD"), name
        broker = urlsplit(env["CELERY_BROKER_URL"])
        assert broker.scheme == "redis" and broker.hostname in services(), name
        assert services()[str(broker.hostname)]["image"].startswith("redis:"), name
        assert (broker.port or 6379) == IMAGES["redis"][1], name


def test_the_shop_reads_its_broker_and_store_from_the_compose_environment(
    probes: dict[str, dict[str, Any]],
) -> None:
    for name in built():
        for app, seen in probes[name]["apps"].items():
            env = environment_of(name)
            assert "settings_error" not in seen, f"{name} ({app}): {seen.get('settings_error')}"
            assert seen["broker_url"] == env["CELERY_BROKER_URL"], name
            assert seen["database_url"] == env["AGBOSS_DATABASE_URL"], name


def test_the_test_services_are_where_the_test_suite_looks_for_them() -> None:
    from sqlalchemy.engine import make_url

    from tests.support.services import POSTGRES, RABBITMQ, REDIS

    for service, default in (("postgres", POSTGRES), ("redis", REDIS), ("rabbitmq", RABBITMQ)):
        url = urlsplit(default.default_url.replace("postgresql+psycopg", "postgresql"))
        ports = [(p.host_ip, p.host_port, p.container_port) for p in published_ports(service)]
        assert (url.hostname, default.default_port, IMAGES[service][1]) in ports, service
    postgres = make_url(POSTGRES.default_url)
    assert postgres.database in _databases_created("postgres")
    assert environment_of("postgres").get("POSTGRES_HOST_AUTH_METHOD") == "trust"
    assert not environment_of("rabbitmq").get("RABBITMQ_DEFAULT_USER"), "guest:guest"


# --- the tests: the Dockerfile -------------------------------------------------------------


def test_the_image_is_python_3_11_slim_unbuffered_and_not_root() -> None:
    image = dockerfile()
    assert image.all("FROM") == ["python:3.11-slim"]
    assert image.env.get("PYTHONUNBUFFERED") == "1"
    users = image.all("USER")
    assert users and users[-1] not in ("root", "0"), "the image runs as a user of its own"
    keywords = [key for key, _ in image.instructions]
    assert keywords.index("USER") < keywords.index("CMD")
    created = " ".join(image.all("RUN"))
    assert re.search(rf"useradd\b[^&]*\b{re.escape(users[-1])}\b", created), "USER is created"


def test_the_image_installs_the_package_with_extras_setup_cfg_declares() -> None:
    targets = pip_install_targets()
    assert targets, "the Dockerfile pip-installs the package from the build context"
    declared = set(setup_cfg()["options.extras_require"])
    metadata = setup_cfg()["metadata"]
    for path, extras in targets:
        assert {"stripe", "flower"} <= extras, extras
        assert extras <= declared, f"unknown extras {extras - declared}"
        source = dockerfile().copied_to(path.rstrip("/") + "/setup.cfg")
        assert source == "setup.cfg", f"{path} holds the repository's setup.cfg"
        needed = ["pyproject.toml", "celery_agboss"]
        needed.append(metadata["long_description"].removeprefix("file:").strip())
        needed += metadata.get("license_files", "").split()
        for name in needed:
            assert dockerfile().copied_to(f"{path.rstrip('/')}/{name}") == name, name


def test_every_file_the_dockerfile_copies_exists_and_reaches_the_build_context() -> None:
    copies = dockerfile().copies
    assert copies
    for copy in copies:
        for source in copy.sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not excluded_by_dockerignore(source.rstrip("/")), f".dockerignore drops {source}"
    for must_go in (".git", ".venv", "tests"):
        assert excluded_by_dockerignore(must_go), f".dockerignore sends {must_go} to the daemon"


def test_the_image_mirrors_the_repository_layout_under_its_workdir() -> None:
    """So a command's relative paths (flower's --conf) mean the same here and there."""
    workdir = dockerfile().workdir.rstrip("/")
    for copy in dockerfile().copies:
        if copy.destination.startswith(workdir + "/"):
            assert len(copy.sources) == 1, copy
            assert copy.destination.rstrip("/") == f"{workdir}/{copy.sources[0].rstrip('/')}"
    assert dockerfile().env.get("PYTHONPATH") == workdir
    conf = option_value(command_of("flower"), "--conf")
    assert conf and image_path_in_repo(conf) == ROOT / conf, "flower's --conf is copied"
    assert image_path_in_repo("example_project") == ROOT / "example_project"


# --- the tests: the README -----------------------------------------------------------------


def test_the_readme_commands_name_services_that_exist() -> None:
    commands = list(readme_compose_commands())
    subcommands = {argv[0] for argv in commands}
    assert {"up", "exec", "down"} <= subcommands, subcommands
    assert any("--build" in argv for argv in commands if argv[0] == "up")
    assert any("-v" in argv for argv in commands if argv[0] == "down")
    for argv in commands:
        if argv[0] == "exec":
            continue
        for token in argv[1:]:
            if not token.startswith("-"):
                assert token in services(), f"the README names {token!r}"
    execs = list(readme_exec_commands())
    assert ("worker", ["celery", "-A", SHOP_APP, "agboss", "pending"]) in execs


def test_the_readme_urls_are_published_and_its_flower_login_is_the_configured_one() -> None:
    text = README.read_text(encoding="utf-8")
    host_ports = {p.host_port for name in services() for p in published_ports(name)}
    internal = fake_gateway_port()
    for port in map(int, re.findall(r"http://127\.0\.0\.1:(\d+)", text)):
        assert port in host_ports or port == internal, f"the README's port {port}"
    assert "http://127.0.0.1:5555" in text and "http://127.0.0.1:8000/orders" in text
    conf = (ROOT / "docs" / "flowerconfig.py").read_text(encoding="utf-8")
    assert 'os.environ["FLOWER_BASIC_AUTH"]' in conf, "docs/flowerconfig.py reads the login"
    login = environment_of("flower").get("FLOWER_BASIC_AUTH")
    assert login, "the compose file gives Flower a login (FLOWER_BASIC_AUTH)"
    user, password = login.split(":", 1)
    assert f"`{user}` / `{password}`" in text
    assert "FLOWER_BASIC_AUTH" not in environment_of("worker"), "only Flower gets the login"
    assert "not affiliated with or endorsed by Stripe" in " ".join(text.split())


if __name__ == "__main__" and sys.argv[1:] == ["--probe"]:
    sys.path.insert(0, str(ROOT))
    result = probe(json.loads(sys.stdin.read()))
    sys.stdout.write(PROBE_MARK + json.dumps(result) + "\n")
