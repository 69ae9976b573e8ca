"""docker/: the compose file validates and hangs together, the Dockerfile is sane, the job builds.

No Docker engine is needed. The compose file is checked three ways:

1. against the official Compose Specification JSON schema (``compose-spec.json`` of the compose-spec
   project, as vendored by the ``check-jsonschema`` package; the same check its ``check-compose-spec``
   pre-commit hook runs);
2. by interpolating variables the way Compose does and validating the result again;
3. by the cross-references below, which neither of those knows about: KRaft settings, Spark cores against
   the job's parallelism, files the containers run, the bucket the job writes to.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
#: where the Dockerfile puts the repository inside the image
IMAGE_REPO = "/opt/sluice"

# -- helpers ---------------------------------------------------------------------------------------------

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution (``$$``, ``$V``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?e}``, ...)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        op, arg = m.group("op"), m.group("arg") or ""
        have = name in env
        empty = not env.get(name)
        if op in (":-", "-"):
            return arg if (empty if op == ":-" else not have) else env[name]
        if op in (":?", "?"):
            if empty if op == ":?" else not have:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return env[name]
        if op in (":+", "+"):
            return arg if (not empty if op == ":+" else have) else ""
        return env.get(name, "")

    return _VAR.sub(sub, value)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return data


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """The compose file as `docker compose config` sees it with no variables set (the defaults)."""
    resolved: dict[str, Any] = interpolate(raw, {})
    return resolved


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs: dict[str, dict[str, Any]] = compose["services"]
    return svcs


def command_list(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    if isinstance(env, list):
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def depends_on(svc: dict[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def spark_confs(args: list[str]) -> dict[str, str]:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def workers(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {
        name: command_list(svc)
        for name, svc in services.items()
        if "org.apache.spark.deploy.worker.Worker" in command_list(svc)
    }


def submitter(services: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    found = [(n, command_list(s)) for n, s in services.items() if command_list(s)[:1] == ["spark-submit"]]
    assert len(found) == 1, f"expected one spark-submit service, found {[n for n, _ in found]}"
    return found[0]


def repo_path(image_path: str) -> Path:
    assert image_path.startswith(IMAGE_REPO + "/"), f"{image_path} is not inside {IMAGE_REPO}"
    return ROOT / image_path[len(IMAGE_REPO) + 1 :]


# -- 1. schema -------------------------------------------------------------------------------------------


def compose_spec_schema() -> dict[str, Any]:
    try:
        vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        pytest.fail(
            "check-jsonschema (which ships the compose-spec schema) is missing: pip install -e '.[test]'"
        )
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text())
    return schema


def test_compose_matches_the_compose_spec_schema(raw: dict[str, Any], compose: dict[str, Any]) -> None:
    import jsonschema

    schema = compose_spec_schema()
    assert schema.get("title") == "Compose Specification"
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    # as written (the schema allows ${...} where a number or bool is expected) and as resolved
    for label, doc in (("as written", raw), ("interpolated", compose)):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        assert not errors, f"compose.yaml ({label}) does not match the compose spec:\n" + "\n".join(
            f"  {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors
        )


def test_the_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    import jsonschema

    schema = compose_spec_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    bad = json.loads(json.dumps(compose))
    bad["services"]["kafka"]["healthcheck"]["retires"] = 3  # typo: unknown key
    bad["services"]["minio"]["ports"] = "9000:9000"  # not a list
    assert len(list(validator.iter_errors(bad))) >= 2





# -- 3. cross-references ---------------------------------------------------------------------------------


def test_every_dependency_exists_and_its_condition_can_be_met(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep, condition in depends_on(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert dep != name, f"{name} depends on itself"
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy: no healthcheck"
                assert not services[dep]["healthcheck"].get("disable"), f"{dep}: healthcheck disabled"
            elif condition == "service_completed_successfully":
                assert services[dep].get("restart", "no") in ("no", "on-failure"), (
                    f"{name} waits for {dep} to complete, but {dep} restarts"
                )
            else:
                assert condition == "service_started", f"{name} -> {dep}: unknown condition {condition}"


def test_startup_order_has_no_cycle_and_the_job_starts_last(services: dict[str, dict[str, Any]]) -> None:
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(n: str, path: tuple[str, ...]) -> None:
        if state.get(n) == 2:
            return
        assert state.get(n) != 1, f"depends_on cycle: {' -> '.join((*path, n))}"
        state[n] = 1
        for d in depends_on(services[n]):
            visit(d, (*path, n))
        state[n] = 2
        order.append(n)

    for n in services:
        visit(n, ())
    job, _ = submitter(services)

    def closure(n: str) -> set[str]:
        deps = set(depends_on(services[n]))
        for d in list(deps):
            deps |= closure(d)
        return deps

    # the job needs every other long-running service up first
    assert closure(job) >= set(services) - {job}, f"{job} does not wait for {set(services) - closure(job)}"


def test_build_contexts_and_dockerfiles_exist(services: dict[str, dict[str, Any]]) -> None:
    built = {n: s for n, s in services.items() if "build" in s}
    assert built, "no service builds the sluice image"
    for name, svc in built.items():
        build = svc["build"] if isinstance(svc["build"], dict) else {"context": svc["build"]}
        context = (DOCKER / build.get("context", ".")).resolve()
        assert context.is_dir(), f"{name}: build context {context} does not exist"
        assert (context / "pyproject.toml").is_file(), f"{name}: the build context must be the repo root"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.resolve() == DOCKERFILE, f"{name}: builds {dockerfile}, not docker/Dockerfile"
    images = {svc.get("image") for svc in built.values()}
    assert len(images) == 1, f"services building the same Dockerfile should share one image tag: {images}"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        image = svc.get("image")
        assert image or "build" in svc, f"{name}: no image and no build"
        if image:
            ref = image.split("@", 1)[0].rsplit("/", 1)[-1]
            assert ":" in ref or "@" in image, f"{name}: image {image} has no tag"
            assert not ref.endswith(":latest"), f"{name}: image {image} uses the latest tag"


def test_files_the_containers_run_exist_and_compile(services: dict[str, dict[str, Any]]) -> None:
    seen = set()
    for name, svc in services.items():
        words = command_list(svc)
        test = svc.get("healthcheck", {}).get("test", [])
        words += [str(w) for w in test] if isinstance(test, list) else shlex.split(test)
        for word in words:
            if word.startswith(IMAGE_REPO + "/"):
                path = repo_path(word)
                assert path.is_file(), f"{name} runs {word}, but {path} does not exist"
                if path.suffix == ".py":
                    compile(path.read_text(), str(path), "exec")
                seen.add(path.relative_to(ROOT).as_posix())
    assert "docker/jobs/kafka_to_minio.py" in seen


def test_kraft_configuration_is_complete(services: dict[str, dict[str, Any]]) -> None:
    kafka = [n for n, s in services.items() if str(s.get("image", "")).startswith("apache/kafka:")]
    assert len(kafka) == 1, f"expected one apache/kafka service, found {kafka}"
    name = kafka[0]
    env = environment(services[name])
    required = {
        "CLUSTER_ID",
        "KAFKA_NODE_ID",
        "KAFKA_PROCESS_ROLES",
        "KAFKA_CONTROLLER_QUORUM_VOTERS",
        "KAFKA_CONTROLLER_LISTENER_NAMES",
        "KAFKA_LISTENERS",
        "KAFKA_ADVERTISED_LISTENERS",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
        "KAFKA_INTER_BROKER_LISTENER_NAME",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    }
    assert not required - env.keys(), f"{name}: missing {sorted(required - env.keys())}"
    assert "ZOOKEEPER" not in " ".join(env), "KRaft mode: no ZooKeeper settings"
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}

    def listeners(value: str) -> dict[str, tuple[str, int]]:
        out = {}
        for item in value.split(","):
            m = re.fullmatch(r"([A-Z_]+)://([^:]*):(\d+)", item.strip())
            assert m, f"{name}: bad listener {item!r}"
            out[m.group(1)] = (m.group(2), int(m.group(3)))
        return out

    listen = listeners(env["KAFKA_LISTENERS"])
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(p.split(":", 1) for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    inter_broker = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    assert set(listen) <= set(protocols), (
        f"listeners without a security protocol: {set(listen) - set(protocols)}"
    )
    assert controller in listen and inter_broker in listen and inter_broker != controller
    assert controller not in advertised, "the controller listener is not advertised to clients"
    assert set(advertised) <= set(listen)
    for lname, (_, port) in advertised.items():
        assert listen[lname][1] == port, (
            f"{lname}: advertised port {port} != listening port {listen[lname][1]}"
        )

    # the quorum is this node, on its controller listener, under a name the container answers to
    hostnames = {name, services[name].get("hostname", name)}
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    expected = {f"{env['KAFKA_NODE_ID']}@{host}:{listen[controller][1]}" for host in hostnames}
    assert len(voters) == 1 and voters[0] in expected, (
        f"{name}: quorum voters {voters}; a single node votes for itself: one of {expected}"
    )
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert env[key] == "1", f"single broker: {key} must be 1"

    # in-network clients bootstrap from a listener advertised under the service's own name
    in_network = {f"{h}:{p}" for h, p in advertised.values() if h in hostnames}
    clients = [
        (n, environment(s)["KAFKA_BOOTSTRAP_SERVERS"])
        for n, s in services.items()
        if "KAFKA_BOOTSTRAP_SERVERS" in environment(s)
    ]
    assert clients, "no service gets KAFKA_BOOTSTRAP_SERVERS"
    for client, bootstrap in clients:
        assert set(bootstrap.split(",")) <= in_network, f"{client}: {bootstrap} is not one of {in_network}"
    health = " ".join(services[name]["healthcheck"]["test"])
    assert any(addr in health for addr in in_network), "the healthcheck should use the in-network listener"


def test_spark_cluster_fits_the_job(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    masters = [n for n, s in services.items() if "org.apache.spark.deploy.master.Master" in command_list(s)]
    assert len(masters) == 1
    master_args = command_list(services[masters[0]])
    master_url = f"spark://{option(master_args, '--host')}:{option(master_args, '--port')}"
    assert option(master_args, "--host") == services[masters[0]].get("hostname", masters[0])

    ws = workers(services)
    assert len(ws) >= 2, "the demo runs two workers"
    cores = {}
    for name, args in ws.items():
        assert master_url in args, f"{name} does not register with {master_url}"
        assert option(args, "--host") == services[name].get("hostname"), f"{name}: --host != hostname"
        c = option(args, "--cores") or environment(services[name]).get("SPARK_WORKER_CORES")
        assert c, f"{name}: set --cores (standalone would otherwise offer all the host's cores)"
        cores[name] = int(c)
        assert masters[0] in depends_on(services[name])

    job, args = submitter(services)
    assert option(args, "--master") == master_url
    confs = spark_confs(args)
    assert confs.get("spark.dynamicAllocation.enabled") == "false", (
        "barrier mode needs dynamic allocation off"
    )
    assert confs.get("spark.driver.host") == services[job].get("hostname"), "executors must reach the driver"
    task_cpus = int(confs.get("spark.task.cpus", "1"))
    executor_cores = int(confs.get("spark.executor.cores", min(cores.values())))
    assert executor_cores <= min(cores.values()), "an executor larger than a worker is never launched"
    # slots the cluster can give this application at once
    slots = sum(c // executor_cores * (executor_cores // task_cpus) for c in cores.values())
    slots = min(slots, int(confs.get("spark.cores.max", slots)) // task_cpus)

    # build the job with the service's environment and read its parallelism off the graph
    for key, value in environment(services[job]).items():
        monkeypatch.setenv(key, value)
    script = repo_path(args[-1])
    ns = runpy.run_path(str(script), run_name="sluice_docker_job")
    pipeline = ns["pipeline"]
    pipeline.build()
    parallelism = max(pipeline.graph.parallelism_of(n) for n in pipeline.graph.nodes.values())
    assert slots >= parallelism, (
        f"the barrier stage needs {parallelism} slots at once; workers {cores} give {slots}"
    )
    assert sum(cores.values()) >= parallelism
    checkpoint_storage = pipeline.checkpoint.storage
    assert checkpoint_storage.startswith("s3://"), checkpoint_storage
    assert pipeline.checkpoint.interval == 5.0

    # the topic has a partition for every reader
    producer = [s for s in services.values() if "TOPIC_PARTITIONS" in environment(s)]
    assert producer and int(environment(producer[0])["TOPIC_PARTITIONS"]) >= parallelism


def test_the_bucket_exists_and_s3_clients_point_at_minio(services: dict[str, dict[str, Any]]) -> None:
    minio = [n for n, s in services.items() if str(s.get("image", "")).startswith("minio/minio:")]
    assert len(minio) == 1
    init = [n for n, s in services.items() if str(s.get("image", "")).startswith("minio/mc:")]
    assert len(init) == 1
    script = " ".join(command_list(services[init[0]]))
    buckets = set(re.findall(r"mc mb (?:--ignore-existing |-p )*local/([a-z0-9.-]+)", script))
    assert buckets, "the init container creates no bucket"
    creds = environment(services[minio[0]])

    job, _ = submitter(services)
    env = environment(services[job])
    for key in ("SLUICE_OUTPUT", "SLUICE_CHECKPOINTS"):
        bucket = env[key].removeprefix("s3://").split("/", 1)[0]
        assert bucket in buckets, f"{key} uses bucket {bucket}, the init container creates {buckets}"
    # the driver writes checkpoint metadata, the executors (on the workers) write files and state
    for name in [job, *workers(services)]:
        e = environment(services[name])
        assert e.get("AWS_ENDPOINT_URL_S3", "").startswith(f"http://{minio[0]}:9000"), name
        assert e.get("AWS_ACCESS_KEY_ID") == creds["MINIO_ROOT_USER"], name
        assert e.get("AWS_SECRET_ACCESS_KEY") == creds["MINIO_ROOT_PASSWORD"], name


# -- Dockerfile ------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        pending += " " + stripped
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def test_dockerfile_lint() -> None:
    instructions = dockerfile_instructions()
    assert instructions and instructions[0][0] == "FROM", "the first instruction must be FROM"
    known = {
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ADD",
        "COPY",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "ONBUILD",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
    }
    for word, _ in instructions:
        assert word in known, f"unknown instruction {word}"
    for word, args in instructions:
        if word == "FROM":
            image = args.split()[0]
            ref = image.split("@", 1)[0].rsplit("/", 1)[-1]
            assert ":" in ref or "@" in image, f"FROM {image}: pin a tag"
            assert not ref.endswith(":latest"), f"FROM {image}: no latest tag"
        if word in ("COPY", "ADD"):
            parts = [p for p in args.split() if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"{word} {src}: not in the build context (repository root)"
    env = " ".join(a for w, a in instructions if w == "ENV")
    assert "PYSPARK_PYTHON=python3" in env and "PYSPARK_DRIVER_PYTHON=python3" in env
    runs = " ".join(a for w, a in instructions if w == "RUN")
    assert re.search(r"pip install [^&]*/opt/sluice", runs), "the image must pip install the repository"
    assert re.search(r"openjdk-(17|21)", runs) or "apache/spark" in instructions[0][1], (
        "Spark 4 needs Java 17+"
    )
    workdir = [a for w, a in instructions if w == "WORKDIR"]
    assert IMAGE_REPO in workdir or any(IMAGE_REPO in a for w, a in instructions if w == "COPY")
    assert instructions[-1][0] in ("CMD", "ENTRYPOINT")


def test_dockerignore_keeps_what_the_build_needs() -> None:
    ignore = DOCKER / "Dockerfile.dockerignore"
    assert ignore.is_file(), (
        "docker/Dockerfile.dockerignore (BuildKit's per-Dockerfile ignore file) is missing"
    )
    patterns = {p.strip() for p in ignore.read_text().splitlines() if p.strip() and not p.startswith("#")}
    assert {".git", ".venv"} <= patterns
    for needed in ("pyproject.toml", "setup.py", "README.md", "core", "connectors", "sinks", "templates", "docker"):
        assert (ROOT / needed).exists()
        assert needed not in patterns and f"{needed}/" not in patterns, f"{needed} must stay in the context"


def test_interpolation_helper() -> None:
    assert interpolate("${A:-x}/${B-y}/$$C/${D}", {"A": "", "B": ""}) == "x//$C/"
    assert interpolate(["${A:+set}"], {"A": "1"}) == ["set"]
    with pytest.raises(ValueError):
        interpolate("${A:?needed}", {})


def test_dockerfile_parses_with_the_buildkit_parser() -> None:
    """The `dockerfile` package wraps BuildKit's own Go parser: a syntax error there is one in `docker build`."""
    import dockerfile
    parsed = dockerfile.parse_file(str(DOCKERFILE))
    assert [c.cmd.upper() for c in parsed] == [w for w, _ in dockerfile_instructions()]
    assert parsed[0].cmd.upper() == "FROM"
