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
    """The service that runs the job (``sluice run JOB ...``: the Spark driver) and its command."""
    found = [(n, command_list(s)) for n, s in services.items() if command_list(s)[:2] == ["sluice", "run"]]
    assert len(found) == 1, f"expected one `sluice run` service, found {[n for n, _ in found]}"
    return found[0]


def submit_args(svc: dict[str, Any]) -> list[str]:
    """PYSPARK_SUBMIT_ARGS of a service, split: how `sluice run` passes spark-submit options to the JVM."""
    args = shlex.split(environment(svc).get("PYSPARK_SUBMIT_ARGS", ""))
    assert args and args[-1] == "pyspark-shell", f"PYSPARK_SUBMIT_ARGS must end with pyspark-shell: {args}"
    return args


def job_script(args: list[str]) -> str:
    return args[args.index("run") + 1]


def started(services: dict[str, dict[str, Any]]) -> set[str]:
    """The services `docker compose up` starts (not those behind a profile, like the CLI)."""
    return {n for n, s in services.items() if not s.get("profiles")}


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
    assert closure(job) >= started(services) - {job}, f"{job} does not wait for {started(services) - closure(job)}"


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
    _, args = submitter(services)
    assert repo_path(job_script(args)).as_posix().endswith("docker/jobs/kafka_to_minio.py")


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
    confs = spark_confs(submit_args(services[job]))
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
    script = repo_path(job_script(args))
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


# -- operating the job with sluice's CLI ------------------------------------------------------------------

#: the image's user (docker/Dockerfile: useradd --home-dir /home/spark)
IMAGE_HOME = "/home/spark"


def _seconds(duration: str) -> float:
    """A compose duration (``1m30s``, ``90s``, ``2m``) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms|us)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"not a compose duration: {duration}"
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """target -> source[:mode] of a service's short-syntax volumes."""
    out = {}
    for v in svc.get("volumes", []):
        source, target, *mode = str(v).split(":")
        out[target] = ":".join([source, *mode])
    return out


def test_the_job_is_operable_with_sluices_cli(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from sluice.control.registry import token_path

    job, args = submitter(services)
    svc = services[job]
    # SIGTERM reaches `sluice run` (tini as PID 1 passes it on), which stops the job with a savepoint
    assert svc.get("init") is True, f"{job}: init: true, so that the signal reaches `sluice run`"
    # the control endpoint listens on every interface of the container, published on the host's loopback
    endpoint = option(args, "--control-endpoint")
    assert endpoint is not None and endpoint.startswith("0.0.0.0:"), endpoint
    port = endpoint.rsplit(":", 1)[1]
    assert f"127.0.0.1:{port}:{port}" in [str(p) for p in svc.get("ports", [])], svc.get("ports")
    # its token goes where sluice writes it for checkpoints on S3 (~/.sluice/tokens/<job>.token), a volume
    monkeypatch.setenv("HOME", IMAGE_HOME)
    env = environment(svc)
    token = token_path(SimpleNamespace(job_id="kafka-to-minio"))  # type: ignore[arg-type]
    assert env["SLUICE_CHECKPOINTS"].startswith("s3://")
    tokens_dir = str(token.parent)
    mounts = _mounts(svc)
    assert tokens_dir in mounts, f"{job} mounts {sorted(mounts)}, not the token folder {tokens_dir}"
    volume = mounts[tokens_dir].split(":")[0]
    assert volume in compose.get("volumes", {}), f"{volume} is not a named volume"
    runs = " ".join(a for w, a in dockerfile_instructions() if w == "RUN")
    assert f"--home-dir {IMAGE_HOME}" in runs and f"{tokens_dir}" in runs and "chown -R spark:spark" in runs
    # the CLI service shares the job's network namespace (the registry names 127.0.0.1:<port>), reads the
    # token volume and finds the job in the same checkpoint storage
    (cli,) = [n for n, s in services.items() if s.get("entrypoint") == ["sluice"]]
    c = services[cli]
    assert c.get("network_mode") == f"service:{job}" and c.get("profiles"), c
    assert _mounts(c).get(tokens_dir) == f"{volume}:ro", _mounts(c)
    cenv = environment(c)
    assert cenv["SLUICE_CHECKPOINT_STORAGE"] == env["SLUICE_CHECKPOINTS"]
    for key in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert cenv[key] == env[key], key
    # `docker compose stop` waits this long before SIGKILL: enough for a savepoint and Spark's shutdown
    assert _seconds(svc.get("stop_grace_period", "10s")) >= 60, svc.get("stop_grace_period")


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.s3
def test_the_job_command_reports_to_the_cli_and_stops_with_a_savepoint_on_sigterm(
    services: dict[str, dict[str, Any]], broker: Any, moto_s3: Any, tmp_path: Path
) -> None:
    """The `sluice-job` service's command and environment, run here as the container would run them (no
    Docker engine on this machine): the image's /opt/sluice is this checkout, the Spark master local[2],
    Kafka and S3 the test's broker and moto server, HOME a folder standing in for the token volume.
    `sluice status` reaches the job through the registry and the token file; SIGTERM (what `docker compose
    stop` sends) ends it with a savepoint, within the service's stop_grace_period."""
    import json as _json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.sinks.conftest import _free_port

    job, args = submitter(services)
    svc = services[job]
    port = _free_port()
    bin_dir = Path(sys.executable).parent
    cmd = []
    for i, word in enumerate(args):
        prev = args[i - 1] if i else ""
        if i == 0:
            word = str(bin_dir / word)  # sluice
        elif word.startswith(IMAGE_REPO + "/"):
            word = str(repo_path(word))
        elif prev == "--master":
            word = "local[2]"
        elif prev == "--control-endpoint":
            word = f"127.0.0.1:{port}"  # the container's 0.0.0.0, kept to loopback here
        cmd.append(word)
    topic = f"docker-job-{os.urandom(3).hex()}"
    broker.create_topic(topic, 2)
    events = runpy.run_path(str(DOCKER / "jobs" / "produce_events.py"), run_name="events")["event"]
    for p in (0, 1):
        broker.produce(topic, [json.dumps(events(i, 1_700_000_000_000 + i)).encode() for i in range(p, 4000, 2)], partition=p)
    s3 = moto_s3.client()
    bucket = environment(svc)["SLUICE_CHECKPOINTS"].removeprefix("s3://").split("/", 1)[0]
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(environment(svc))
    env.update(
        HOME=str(home), KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, SLUICE_TOPIC=topic, SLUICE_PARALLELISM="2",
        AWS_ENDPOINT_URL_S3=moto_s3.endpoint,
        PYSPARK_SUBMIT_ARGS=env["PYSPARK_SUBMIT_ARGS"].replace(f"spark.driver.host={job}", "spark.driver.host=127.0.0.1")
        .replace("spark.driver.bindAddress=0.0.0.0", "spark.driver.bindAddress=127.0.0.1"),
    )  # fmt: skip
    token = home / ".sluice" / "tokens" / "kafka-to-minio.token"  # the sluice-tokens volume's file
    out, err = (tmp_path / "job.out").open("w"), (tmp_path / "job.err").open("w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=tmp_path, start_new_session=True)

    def log() -> str:
        return (tmp_path / "job.out").read_text() + (tmp_path / "job.err").read_text()[-5000:]

    def cli(verb: str) -> subprocess.CompletedProcess[str]:
        """`sluice VERB kafka-to-minio` as from the host: the registry in S3, the token from the volume."""
        return subprocess.run(
            [str(bin_dir / "sluice"), verb, "kafka-to-minio", "--storage", env["SLUICE_CHECKPOINTS"],
             "--token-file", str(token), "--json"],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )  # fmt: skip

    def status() -> dict[str, Any] | None:
        r = cli("status")
        return _json.loads(r.stdout)["job"] if r.returncode == 0 else None  # type: ignore[no-any-return]

    try:
        deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
        while True:
            assert proc.poll() is None, f"the job ended before it was stopped:\n{log()}"
            assert time.monotonic() < deadline, f"no completed checkpoint within 300 s:\n{log()}"
            s = status() if token.exists() else None
            if s is not None and s["status"] == "running" and s.get("last_checkpoint"):
                break
            time.sleep(1)
        r = cli("savepoint")
        assert r.returncode == 0 and "/kafka-to-minio/savepoint-" in _json.loads(r.stdout)["path"], r.stdout + r.stderr
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # docker compose stop
        grace = _seconds(svc["stop_grace_period"])
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"not stopped within stop_grace_period ({grace:.0f} s): docker would SIGKILL it\n{log()}") from None
        print(f"SIGTERM to exit: {time.monotonic() - stopped:.1f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        out.close()
        err.close()
    text = (tmp_path / "job.out").read_text()
    assert proc.returncode == 0, log()
    m = re.search(r"stopped at (s3://\S+/kafka-to-minio/savepoint-\d+);", text)
    assert m, log()
    key = m.group(1).removeprefix(f"s3://{bucket}/") + "/_metadata"
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0
    assert "stopping the job with a savepoint" in (tmp_path / "job.err").read_text()
    assert not token.exists(), "the token file outlives the job"


def test_every_port_is_published_on_the_hosts_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    """Kafka without authentication, MinIO with a demo password, Spark's UIs and master: reachable from this
    machine only (a published "9000:9000" listens on every interface of the host)."""
    published = {name: [str(p) for p in svc.get("ports", [])] for name, svc in services.items()}
    assert any(published.values())
    for name, ports in published.items():
        for p in ports:
            assert p.startswith("127.0.0.1:") and p.count(":") == 2, f"{name} publishes {p!r}: bind 127.0.0.1"


def test_the_docs_say_the_stack_was_never_started() -> None:
    """No Docker engine where sluice is developed and tested: docs/docker.md says so plainly."""
    text = " ".join((ROOT / "docs" / "docker.md").read_text().split())
    assert "No Docker engine is available where sluice is developed and tested" in text
    assert "neither the image nor the stack has been built or started" in text
