"""`kubetriton deploy`, `delete` and `status` as a user runs them: a kubeconfig, a script, a cluster.

The cluster is the emulator, with the real operator where a test follows a model to Ready. The
emulator runs no pods, so a test plays the kubelet's part: it sets the Deployment's status, or
creates a pod whose worker exited as the launcher does for an image it cannot use.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import eventually
from crd_check import admit
from emulator import ClusterEmulator, OperatorThread
from kubetriton import cli, podenv
from kubetriton.operator import deploy, naming, rollout, script
from kubetriton.operator.spec import PyTritonModel
from test_operator_cli import write_kubeconfig
from test_operator_reconciler import (
    CHILD_APIS,
    MODELS,
    create,
    create_model,
    model,
    model_document,
    patch,
    set_deployment_status,
    stored,
)

StartOperator = Callable[..., Awaitable[OperatorThread]]
CONFIG_MAPS = "v1/configmaps"
SERVE = """\
import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def infer_fn(sequences):
    return {"lengths": np.array([[len(s[0])] for s in sequences], dtype=np.float32)}


with Triton() as triton:
    triton.bind(
        model_name="Lengths",
        infer_func=infer_fn,
        inputs=[Tensor(name="sequences", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="lengths", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=16),
    )
    triton.serve()
"""


def write_script(folder: Path, source: str = SERVE, name: str = "serve.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


class Result:
    """A finished command: its exit status and what it printed."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


async def kubetriton(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """Run a `kubetriton` command as the console script does, on a thread, so that the emulator (on this
    test's event loop) keeps answering it."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return Result(code, out, err)


@pytest.fixture()
def kubeconfig(cluster: ClusterEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$KUBECONFIG names the emulator, as a user's names their cluster."""
    path = write_kubeconfig(tmp_path / "kubeconfig", str(cluster.servers[0].url).rstrip("/"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


def config_map(cluster: ClusterEmulator, name: str, namespace: str = "default") -> dict[str, Any] | None:
    return stored(cluster, CONFIG_MAPS, name, namespace)


def script_config_maps(cluster: ClusterEmulator, namespace: str = "default") -> list[str]:
    return sorted(
        name
        for (resource, ns, name), obj in cluster.objects.items()
        if resource.plural == "configmaps" and ns == namespace and not obj.deleted
    )


# Reading a script, with no cluster


def test_model_names_come_from_bind_calls_by_keyword_or_position(tmp_path: Path) -> None:
    source = """\
        import socket, zmq
        from pytriton.triton import Triton
        zmq.Context().socket(zmq.PUB).bind("tcp://*:5556")
        socket.socket().bind(("0.0.0.0", 9000))
        with Triton() as triton:
            triton.bind(infer_func=f, model_name="Embed", inputs=[], outputs=[])
            triton.bind("Rank", g, [], [])
            triton.bind(model_name="Embed", infer_func=f, inputs=[], outputs=[])
            triton.bind("add_sub", h, [], [])
    """
    loaded = script.load(write_script(tmp_path, source))
    assert script.model_names(loaded) == ["Embed", "Rank", "add_sub"], "a socket's bind names no model"


@pytest.mark.parametrize(
    ("source", "explanation"),
    [
        ("name = 'A'\ntriton.bind(model_name=name, infer_func=f)\n", "at serve.py:2 does not name its model"),
        ("triton.bind(f'{prefix}-model', f)\n", "at serve.py:1 does not name its model"),
        ("print('no model here')\n", 'it has no bind(model_name="...") call'),
    ],
)
def test_unreadable_model_names_ask_for_model(tmp_path: Path, source: str, explanation: str) -> None:
    loaded = script.load(write_script(tmp_path, source))
    with pytest.raises(script.ScriptError) as raised:
        script.model_names(loaded)
    assert explanation in str(raised.value)
    assert str(raised.value).endswith("give every model name with --model NAME")


def test_a_folder_ships_its_top_level_files_and_its_modules_name_models(tmp_path: Path) -> None:
    folder = tmp_path / "ranker"
    write_script(folder, "import models\nmodels.serve()\n")
    write_script(folder, "def serve():\n    triton.bind(model_name='Rank', infer_func=f)\n", "models.py")
    (folder / "weights.bin").write_bytes(b"\x00\xff")
    write_script(folder / "data", "x\n", "notes.txt")
    write_script(folder / "__pycache__", "", "models.cpython-312.pyc")
    write_script(folder / ".git", "", "HEAD")
    write_script(folder, "HF_TOKEN=hf_secret\n", ".env")
    (folder / "hostname").symlink_to("/etc/hostname")
    (folder / "weights-link.bin").symlink_to("weights.bin")
    loaded = script.load(folder)
    assert sorted(loaded.files) == ["models.py", "serve.py", "weights-link.bin", "weights.bin"]
    assert loaded.entrypoint == "serve.py"
    assert loaded.skipped == (
        (".env", script.HIDDEN),
        ("data", script.TOP_LEVEL_ONLY),
        ("hostname", "it links to /etc/hostname, outside the folder"),
    )
    assert script.model_names(loaded) == ["Rank"]
    with pytest.raises(script.ScriptError, match=r"ranker has no file named main\.py$"):
        script.load(folder, "main.py")
    (folder / "serve.py").rename(folder / "main.py")
    with pytest.raises(
        script.ScriptError, match=r"ranker has no serve\.py: name the file to run with --entrypoint$"
    ):
        script.load(folder)


def test_the_hash_follows_the_content(tmp_path: Path) -> None:
    first = script.load(write_script(tmp_path / "a"))
    same = script.load(write_script(tmp_path / "b"))
    edited = script.load(write_script(tmp_path / "c", SERVE.replace("len(s[0])", "len(s[0]) * 2")))
    assert first.digest == same.digest != edited.digest


@pytest.mark.parametrize(
    ("candidates", "label"),
    [
        (("Lengths", "serve"), "lengths"),
        (("ESM_1.v2", "x"), "esm-1-v2"),
        (("2nd", "my_model"), "nd"),
        (("42", "my_model"), "my-model"),
    ],
)
def test_default_names_are_dns_labels(candidates: tuple[str, str], label: str) -> None:
    assert script.object_name(*candidates) == label


# The dry run: what would be applied, with no cluster


def test_dry_run_prints_the_config_map_and_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    settings = yaml.safe_load(config.read_text())
    settings["contexts"][0]["context"]["namespace"] = "team-a"
    config.write_text(yaml.safe_dump(settings))
    monkeypatch.setenv("KUBECONFIG", str(config))
    path = write_script(tmp_path / "app")
    argv = ["deploy", str(path), "--image", "python:3.13-slim", "--gpus", "1", "--replicas", "2", "--router"]

    assert cli.main([*argv, "--dry-run=client", "-o", "yaml"]) == 0
    printed = capsys.readouterr()
    config_map_doc, model_doc = list(yaml.safe_load_all(printed.out))
    assert printed.err == ""
    kubernetes_validate.validate(config_map_doc, "1.37.0", strict=True)
    digest = script.load(path).digest
    assert config_map_doc["metadata"] == {
        "name": f"lengths-script-{digest}",
        "namespace": "team-a",
        "labels": {
            "app.kubernetes.io/instance": "lengths",
            "app.kubernetes.io/component": "script",
            "app.kubernetes.io/managed-by": "kubetriton-deploy",
        },
    }
    assert config_map_doc["immutable"] is True and config_map_doc["data"] == {"serve.py": SERVE}
    assert "serve.py: |" in printed.out, "the script reads as a block, as in the file"
    assert model_doc["spec"] == {
        "worker": {
            "image": "python:3.13-slim",
            "script": {"configMap": f"lengths-script-{digest}", "entrypoint": "serve.py"},
        },
        "models": ["Lengths"],
        "gpus": {"count": 1},
        "replicas": 2,
        "router": True,
    }
    PyTritonModel.model_validate(model_doc)
    admitted, errors = admit(model_doc)
    assert errors == [] and admitted["spec"]["worker"]["script"] == model_doc["spec"]["worker"]["script"]

    assert cli.main([*argv, "--dry-run=client"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"configmap/lengths-script-{digest} applied (dry run)",
        "pytritonmodel.kubetriton.dev/lengths applied (dry run)",
    ]


def test_dry_run_refuses_what_the_api_server_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    path = write_script(tmp_path, "triton.bind(model_name='-leading-dash', infer_func=f)\n")
    assert (
        cli.main(["deploy", str(path), "--image", "x", "--name", "m", "--dry-run=client", "-o", "yaml"]) == 1
    )
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.startswith(
        "error: invalid PyTritonModel:\nspec.models: '-leading-dash': each model name"
    )

    assert cli.main(["deploy", str(path), "--model", "Ranker", "--dry-run=client"]) == 1
    assert capsys.readouterr().err == "error: --image is required\n"

    router_named = write_script(tmp_path / "c", "triton.bind(model_name='Text-Router', infer_func=f)\n")
    assert cli.main(["deploy", str(router_named), "--image", "x", "--dry-run=client"]) == 1
    assert capsys.readouterr().err == (
        "error: the object name made from 'Text-Router', 'text-router', ends with -pods or -router, which"
        " names the model's own children: give another with --name\n"
    )
    assert cli.main(["deploy", str(router_named), "--image", "x", "--name", "", "--dry-run=client"]) == 1
    assert "metadata.name must be" in capsys.readouterr().err, "an empty --name is refused, not ignored"
    assert (
        cli.main(["deploy", str(router_named), "--image", "x", "--name", "Bad_Name", "--dry-run=client"]) == 1
    )
    assert capsys.readouterr().err == (
        "error: --name 'Bad_Name': metadata.name must be at most 63 lowercase letters, digits or '-',"
        " starting with a letter: it names the model's Service\n"
    ), "one error, not a second for the names made from it"

    unreadable = write_script(tmp_path / "b", "triton.bind(model_name=NAME, infer_func=f)\n")
    assert cli.main(["deploy", str(unreadable), "--image", "x", "--dry-run=client", "-o", "yaml"]) == 1
    assert "give every model name with --model NAME" in capsys.readouterr().err
    assert cli.main(["deploy", str(unreadable), "--image", "x", "--model", "Ranker", "--dry-run=client"]) == 0
    assert "pytritonmodel.kubetriton.dev/ranker applied (dry run)" in capsys.readouterr().out


# Against a cluster


ACCESS_LINES = [
    "HTTP: http://lengths.default.svc:8000",
    "gRPC: grpc://lengths.default.svc:8001",
    "",
    "from pytriton.client import ModelClient",
    'with ModelClient("grpc://lengths-pods.default.svc:8001", "Lengths") as client:'
    "  # each request to a free pod",
    "    result = client.infer_batch(...)  # one numpy array per input",
]


def test_the_addresses_name_the_router_where_the_model_has_one() -> None:
    router = {
        "url": "http://lengths-router.default.svc:8000",
        "grpcUrl": "grpc://lengths-router.default.svc:8001",
    }
    model = {"metadata": {"name": "lengths", "namespace": "default"}, "spec": {"models": ["Lengths"]}}
    assert deploy.addresses(model) == ACCESS_LINES
    assert deploy.addresses({**model, "status": {"router": router}}) == [
        *ACCESS_LINES[:2],
        "Router: http://lengths-router.default.svc:8000, grpc://lengths-router.default.svc:8001",
        *ACCESS_LINES[2:],
    ]


async def start_deploy(
    capsys: pytest.CaptureFixture[str], cluster: ClusterEmulator, path: Path, *flags: str
) -> tuple[asyncio.Task[Result], str]:
    """`kubetriton deploy`, running, once the operator has applied a Deployment whose pods mount its
    script; and that script's ConfigMap name."""
    map_name = f"lengths-script-{script.load(path).digest}"
    deploying = asyncio.create_task(kubetriton(capsys, "deploy", str(path), *flags))

    def mounted() -> bool:
        deployment = stored(cluster, CHILD_APIS["Deployment"], "lengths") or {}
        volumes = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", [])
        return any((volume.get("configMap") or {}).get("name") == map_name for volume in volumes)

    await eventually(mounted, timeout=20, message=f"a Deployment mounting {map_name}")
    return deploying, map_name


@pytest.mark.asyncio
async def test_deploy_applies_the_script_and_model_then_follows_them_to_ready(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await start_operator()
    path = write_script(tmp_path / "app")
    deploying, first_map = await start_deploy(capsys, cluster, path, "--image", "python:3.13-slim")
    await set_deployment_status(cluster, "lengths", ready=1, replicas=1)
    first = await asyncio.wait_for(deploying, 30)

    assert (first.code, first.err) == (0, "")
    operator_lag = "waiting for the operator to take the new spec"  # shown only if the first look is early
    assert [line for line in first.out.splitlines() if line != operator_lag] == [
        f"configmap/{first_map} created",
        "pytritonmodel.kubetriton.dev/lengths created",
        "waiting for lengths to be Ready (timeout 300s)",
        "ready: 1 of 1",
        "lengths is Ready: 1/1 replicas ready",
        "",
        *ACCESS_LINES,
    ]
    created = model(cluster, "lengths")
    assert created is not None
    assert created["spec"] == {
        "worker": {"image": "python:3.13-slim", "script": {"configMap": first_map, "entrypoint": "serve.py"}},
        "models": ["Lengths"],
    }
    assert [entry["manager"] for entry in created["metadata"]["managedFields"]] == ["kubetriton-deploy"]
    stored_map = config_map(cluster, first_map)
    assert stored_map is not None
    assert stored_map["immutable"] is True and stored_map["data"] == {"serve.py": SERVE}
    assert stored_map["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubetriton.dev/v1alpha1",
            "kind": "PyTritonModel",
            "name": "lengths",
            "uid": created["metadata"]["uid"],
        }
    ]

    edited = write_script(tmp_path / "app", SERVE.replace("len(s[0])", "len(s[0]) * 2"))
    deploying, second_map = await start_deploy(capsys, cluster, edited, "--timeout", "30s")
    assert second_map != first_map
    await set_deployment_status(cluster, "lengths", ready=1, replicas=1)
    second = await asyncio.wait_for(deploying, 40)

    assert (second.code, second.err) == (0, "")
    lines = second.out.splitlines()
    assert lines[:3] == [
        f"configmap/{second_map} created",
        "pytritonmodel.kubetriton.dev/lengths configured",
        "waiting for lengths to be Ready (timeout 30s)",
    ]
    assert f"configmap/{first_map} deleted (an older script)" in lines
    assert lines[-len(ACCESS_LINES) :] == ACCESS_LINES
    updated = model(cluster, "lengths")
    assert updated is not None
    assert updated["spec"]["worker"] == {
        "image": "python:3.13-slim",
        "script": {"configMap": second_map, "entrypoint": "serve.py"},
    }, "a deploy without --image keeps the model's image"
    assert updated["metadata"]["generation"] == 2
    assert script_config_maps(cluster) == [second_map]


@pytest.mark.asyncio
async def test_deploy_of_zero_replicas_returns_once_the_deployment_scaled_down(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await start_operator()
    path = write_script(tmp_path / "app")
    deploying, _ = await start_deploy(
        capsys, cluster, path, "--image", "python:3.13-slim", "--replicas", "0", "--timeout", "20s"
    )
    await set_deployment_status(cluster, "lengths", ready=0, replicas=0)
    result = await asyncio.wait_for(deploying, 30)

    assert (result.code, result.err) == (0, ""), "deploy waited for a Ready that 0 replicas never give"
    lines = result.out.splitlines()
    assert "waiting for lengths to scale to zero (timeout 20s)" in lines
    assert "lengths is scaled to zero: the model has no replicas" in lines
    assert result.out.endswith("\n".join(ACCESS_LINES) + "\n")


@pytest.mark.asyncio
async def test_deploy_with_a_router_waits_until_the_router_serves(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The model Ready is not enough where it has a router: the router's address, which deploy prints,
    answers only once a router pod is ready."""
    await start_operator()
    path = write_script(tmp_path / "app")
    deploying, _ = await start_deploy(capsys, cluster, path, "--image", "python:3.13-slim", "--router")
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], "lengths-router"), message="router")
    await set_deployment_status(cluster, "lengths-router", ready=0, replicas=2)
    await set_deployment_status(cluster, "lengths", ready=1, replicas=1)
    await eventually(lambda: rollout.is_ready(model(cluster, "lengths") or {}), message="the model Ready")
    await asyncio.sleep(2 * rollout.POLL_SECONDS)  # deploy looks at a Ready model whose router is not
    assert not deploying.done(), "deploy returned before the router serves"
    await set_deployment_status(cluster, "lengths-router", ready=2, replicas=2)
    done = await asyncio.wait_for(deploying, 30)

    assert (done.code, done.err) == (0, "")
    lines = done.out.splitlines()
    progress = lines[lines.index("waiting for lengths to be Ready (timeout 300s)") + 1 : lines.index("")]
    assert progress[-3:] == [
        "router: 0/2 router replicas ready",
        "router: 2/2 router replicas ready",
        "lengths is Ready: 1/1 replicas ready",
    ]
    assert "Router: http://lengths-router.default.svc:8000, grpc://lengths-router.default.svc:8001" in lines


def exited_pod(
    name: str,
    image: str,
    config_map_name: str,
    message: str,
    exit_code: int = podenv.UNSUPPORTED_IMAGE_EXIT_CODE,
    restarts: int = 1,
) -> dict[str, Any]:
    """A pod whose worker exited and waits to be started again, as the kubelet reports it; by default, one
    the launcher stopped."""
    exited = {"terminated": {"exitCode": exit_code, "message": message}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-5f7c9d8b6-abcde", "labels": naming.labels(name)},
        "spec": {
            "containers": [{"name": "worker", "image": image}],
            "volumes": [{"name": podenv.SCRIPT_VOLUME, "configMap": {"name": config_map_name}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "worker",
                    "ready": False,
                    "restartCount": restarts,
                    "imageID": "docker.io/library/python@sha256:0",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": exited,
                }
            ],
        },
    }


@pytest.mark.asyncio
async def test_deploy_stops_at_an_image_kubetriton_cannot_run_in(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await start_operator()
    deploying, map_name = await start_deploy(
        capsys, cluster, write_script(tmp_path / "app"), "--image", "python:3.9-slim"
    )
    refusal = "The worker image has Python 3.9; kubetriton needs CPython 3.10 to 3.13"
    pod = exited_pod("lengths", "python:3.9-slim", map_name, f"Traceback?\n{refusal}")
    await create(cluster, "/api/v1/namespaces/default/pods", pod)
    failed = await asyncio.wait_for(deploying, 30)

    assert failed.code == 1
    lines = failed.out.splitlines()
    assert "pods scheduled: 1 of 1" in lines and "images pulled: 1 of 1" in lines
    cause = f"WorkerImageUnsupported: pod {pod['metadata']['name']}: {refusal}"
    assert cause in lines
    assert failed.err == (
        f"error: lengths cannot become Ready: {cause}\n"
        f"the last lines of container worker of pod {pod['metadata']['name']}:\n"
        f"  Traceback?\n"
        f"  {refusal}\n"
    )
    assert "HTTP:" not in failed.out
    assert script_config_maps(cluster) == [map_name], "the script stays for the next try"


def test_an_evicted_pods_last_output_is_not_shown_as_the_cause() -> None:
    """The kubelet killed it: its last lines were written before, and the eviction's message says why."""
    pod = exited_pod("lengths", "python:3.13-slim", "m", "Loading the weights", exit_code=137)
    name = pod["metadata"]["name"]
    message = f"pod {name}: the pod was evicted (1 pod evicted so far): The node was low on resource: memory."
    assert rollout.error_output([pod], message) == [
        f"the last lines of container worker of pod {name}:",
        "  Loading the weights",
    ]
    pod["status"].update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    assert rollout.error_output([pod], message) == []


TRACEBACK = ["Traceback (most recent call last):"] + [
    f'  File "serve.py", line {n}, in f{n}' for n in range(12)
]


@pytest.mark.asyncio
async def test_deploy_stops_at_a_crash_loop_with_the_scripts_last_lines(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The worker exited three times: the deploy ends there, with the exception and the traceback's end."""
    await start_operator()
    image = "python:3.13-slim"
    deploying, map_name = await start_deploy(
        capsys, cluster, write_script(tmp_path / "app"), "--image", image
    )
    said = "\n".join([*TRACEBACK, "RuntimeError: boom"])
    pod = exited_pod("lengths", image, map_name, said, exit_code=1, restarts=2)
    await create(cluster, "/api/v1/namespaces/default/pods", pod)
    failed = await asyncio.wait_for(deploying, 30)

    assert failed.code == 1
    name = pod["metadata"]["name"]
    cause = f"CrashLoopBackOff: pod {name}: container worker exited with code 1 3 times: RuntimeError: boom"
    assert failed.err.splitlines() == [
        f"error: lengths cannot become Ready: {cause}",
        f"the last lines of container worker of pod {name}:",
        *(f"  {line}" for line in [*TRACEBACK, "RuntimeError: boom"][-10:]),
    ]


def test_a_cause_in_a_pod_of_an_earlier_script_does_not_end_the_wait() -> None:
    """The old script's pod crashes while the new one's loads: the rollout may still succeed."""
    spec = {"worker": {"image": "w:1", "script": {"configMap": "m-new"}}, "models": ["M"]}
    old = exited_pod("m", "w:1", "m-old", "boom", exit_code=1, restarts=9)
    new = exited_pod("m", "w:1", "m-new", "boom", exit_code=1, restarts=9)
    new["metadata"]["name"] = "m-5f7c9d8b6-fghij"

    def model(message: str) -> dict[str, Any]:
        conditions = [
            {"type": "Progressing", "status": "False", "reason": "Stalled", "message": message},
            {"type": "Degraded", "status": "True", "reason": "CrashLoopBackOff", "message": message},
        ]
        return {
            "metadata": {"name": "m", "generation": 2},
            "spec": spec,
            "status": {"observedGeneration": 2, "conditions": conditions},
        }

    about_old, about_new = (f"pod {pod['metadata']['name']}: exited" for pod in (old, new))
    assert rollout.stalled(model(about_old), [old, new]) is None
    assert rollout.stalled(model(about_new), [old, new])["message"] == about_new
    assert rollout.stalled(model("exceeded quota"), [old])["message"] == "exceeded quota"


def test_an_evicted_pod_is_not_counted_beside_the_one_made_in_its_place() -> None:
    spec = {"worker": {"image": "w:1", "script": {"configMap": "m-1"}}, "models": ["M"]}
    evicted = exited_pod("m", "w:1", "m-1", "", exit_code=137, restarts=0)
    evicted["status"].update(phase="Failed", reason="Evicted")
    replacement = exited_pod("m", "w:1", "m-1", "", exit_code=1, restarts=0)
    replacement["metadata"]["name"] = "m-5f7c9d8b6-fghij"
    model = {"metadata": {"name": "m", "generation": 1}, "spec": spec, "status": {"observedGeneration": 1}}

    shown = rollout.steps(model, [evicted, replacement])

    assert (shown["scheduled"], shown["pulled"]) == ("pods scheduled: 1 of 1", "images pulled: 1 of 1")


def observed_status(*conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    """A model's status as the operator writes it for its first generation: (type, status, reason, message)
    of each condition."""
    fields = ("type", "status", "reason", "message")
    return {
        "observedGeneration": 1,
        "conditions": [dict(zip(fields, found, strict=True)) for found in conditions],
    }


@pytest.mark.asyncio
async def test_deploy_times_out_saying_what_it_waited_for(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_script(tmp_path / "app")
    timed_out = await kubetriton(
        capsys, "deploy", str(path), "--image", "python:3.13-slim", "--timeout", "1s"
    )
    assert timed_out.code == 1
    assert timed_out.out.splitlines()[-1] == "waiting for the operator to take the new spec"
    assert timed_out.err == (
        "error: timed out after 1s: the operator has not taken the new spec of lengths yet (is it running?)\n"
    )

    stalled = observed_status(("Ready", "False", "Loading", "0/1 replicas ready; loading"))
    await patch(cluster, MODELS.format(ns="default") + "/lengths/status", {"status": stalled})
    again = await kubetriton(capsys, "deploy", str(path), "--timeout", "1s")
    assert (
        again.err == "error: timed out after 1s: lengths is not Ready: Loading: 0/1 replicas ready; loading\n"
    )

    no_router = observed_status(
        ("Ready", "True", "AllReplicasReady", "1/1 replicas ready"),
        (
            "RouterReady",
            "False",
            "ImagePullBackOff",
            "0/2 router replicas ready; pod lengths-router-1: container haproxy: Back-off",
        ),
    )
    await patch(cluster, MODELS.format(ns="default") + "/lengths/status", {"status": no_router})
    routed = await kubetriton(capsys, "deploy", str(path), "--timeout", "1s")
    assert routed.out.splitlines()[-1] == (
        "router: 0/2 router replicas ready; pod lengths-router-1: container haproxy: Back-off"
    )
    assert routed.err == (
        "error: timed out after 1s: lengths is Ready, its router is not: ImagePullBackOff: "
        "0/2 router replicas ready; pod lengths-router-1: container haproxy: Back-off\n"
    )


@pytest.mark.asyncio
async def test_a_model_the_api_server_refuses_prints_its_message(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = 'PyTritonModel.kubetriton.dev "lengths" is invalid: spec.gpus.count: Invalid value: 9'
    cluster.rejections["pytritonmodels"] = lambda _: refusal
    path = write_script(tmp_path / "app")
    refused = await kubetriton(capsys, "deploy", str(path), "--image", "python:3.13-slim", "--gpus", "9")
    assert refused.code == 1
    assert refused.err == f"Error from server (Invalid): {refusal}\n"
    assert model(cluster, "lengths") is None


@pytest.mark.asyncio
async def test_a_new_model_needs_an_image(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = await kubetriton(capsys, "deploy", str(write_script(tmp_path)), "-n", "team-a")
    assert (result.code, result.out) == (1, "")
    assert result.err == "error: --image is required: model lengths does not exist in namespace team-a yet\n"
    assert script_config_maps(cluster, "team-a") == []


@pytest.mark.asyncio
async def test_status_lists_models_and_describes_one(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_script(tmp_path / "app")
    deployed = await kubetriton(capsys, "deploy", str(path), "--image", "python:3.13-slim", "--no-wait")
    assert deployed.code == 0 and deployed.out.splitlines()[-len(ACCESS_LINES) :] == ACCESS_LINES
    assert "waiting" not in deployed.out
    await create_model(cluster, model_document("other", "team-b"), namespace="team-b")
    map_name = f"lengths-script-{script.load(path).digest}"
    problem = "0/1 replicas ready; container worker: Back-off pulling image"
    status = {
        "observedGeneration": 1,
        "replicas": 1,
        "readyReplicas": 0,
        "url": "http://lengths.default.svc:8000",
        "grpcUrl": "grpc://lengths.default.svc:8001",
        "podsUrl": "http://lengths-pods.default.svc:8000",
        "podsGrpcUrl": "grpc://lengths-pods.default.svc:8001",
        "router": {
            "url": "http://lengths-router.default.svc:8000",
            "grpcUrl": "grpc://lengths-router.default.svc:8001",
            "replicas": 2,
            "readyReplicas": 1,
        },
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "ImagePullBackOff", "message": problem},
            {"type": "Degraded", "status": "True", "reason": "ImagePullBackOff", "message": problem},
        ],
    }
    await patch(cluster, MODELS.format(ns="default") + "/lengths/status", {"status": status})
    pod = exited_pod("lengths", "python:3.13-slim", map_name, "")
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff"}}
    await create(cluster, "/api/v1/namespaces/default/pods", pod)

    listed = await kubetriton(capsys, "status")
    assert listed.code == 0
    header, row = listed.out.splitlines()
    assert header.split() == [
        "NAME",
        "READY",
        "REPLICAS",
        "AVAILABLE",
        "MODELS",
        "GPUS",
        "AGE",
        "REASON",
        "MESSAGE",
    ]
    assert row.split()[:5] == ["lengths", "False", "1", "0", "Lengths"]
    assert row.split()[7] == "ImagePullBackOff" and row.endswith(problem)
    assert header.index("MESSAGE") == row.index(problem), "columns line up"

    everywhere = await kubetriton(capsys, "status", "-A")
    assert [line.split()[:2] for line in everywhere.out.splitlines()] == [
        ["NAMESPACE", "NAME"],
        ["default", "lengths"],
        ["team-b", "other"],
    ]
    empty = await kubetriton(capsys, "status", "-n", "team-c")
    assert (empty.code, empty.out, empty.err) == (0, "", "No resources found in team-c namespace.\n")

    detail = await kubetriton(capsys, "status", "lengths")
    assert detail.code == 0
    lines = detail.out.splitlines()
    assert lines[:10] == [
        "Name:         lengths",
        "Namespace:    default",
        "Image:        python:3.13-slim",
        f"Script:       {map_name} (serve.py)",
        "Models:       Lengths",
        "Replicas:     0 ready of 1",
        "HTTP:         http://lengths.default.svc:8000",
        "gRPC:         grpc://lengths.default.svc:8001",
        "ModelClient:  grpc://lengths-pods.default.svc:8001 or http://lengths-pods.default.svc:8000",
        "Router:       http://lengths-router.default.svc:8000, grpc://lengths-router.default.svc:8001"
        " (1 of 2 ready)",
    ]
    conditions = lines.index("Conditions:")
    assert lines[conditions + 1].split() == ["TYPE", "STATUS", "REASON", "MESSAGE"]
    assert lines[conditions + 2].split()[:3] == ["Ready", "False", "ImagePullBackOff"]
    assert lines[conditions + 2].endswith(problem)
    pods = lines.index("Pods:")
    assert lines[pods + 1].split() == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "REQUESTS",
        "SHARE",
        "QUEUE",
    ]
    assert lines[pods + 2].split()[:4] == [pod["metadata"]["name"], "0/1", "ImagePullBackOff", "1"]
    assert lines[pods + 2].split()[-3:] == ["-", "-", "-"], "a pod that is not Ready is not read"

    assert (await kubetriton(capsys, "status", "--wait")).err == "error: --wait needs a model NAME\n"
    cause = f"pod {pod['metadata']['name']}: container worker: Back-off pulling image"
    stalled = {"type": "Progressing", "status": "False", "reason": "Stalled", "message": cause}
    degraded = {"type": "Degraded", "status": "True", "reason": "ImagePullBackOff", "message": cause}
    conditions = {"conditions": [status["conditions"][0], stalled, degraded]}
    await patch(cluster, MODELS.format(ns="default") + "/lengths/status", {"status": conditions})
    waited = await kubetriton(capsys, "status", "lengths", "--wait", "--timeout", "30s")
    assert waited.code == 1
    assert waited.out.splitlines()[0] == "waiting for lengths to be Ready (timeout 30s)"
    assert waited.err == f"error: lengths cannot become Ready: ImagePullBackOff: {cause}\n"


@pytest.mark.asyncio
async def test_delete_removes_the_model_and_says_when_there_is_none(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_script(tmp_path / "app")
    assert (await kubetriton(capsys, "deploy", str(path), "--image", "x:1", "--no-wait")).code == 0
    deleted = await kubetriton(capsys, "delete", "lengths", "--wait")
    assert (deleted.code, deleted.out, deleted.err) == (
        0,
        'pytritonmodels.kubetriton.dev "lengths" deleted\n',
        "",
    )
    assert model(cluster, "lengths") is None
    delete_requests = [r for r in cluster if r.method.value.upper() == "DELETE"]
    assert [(r.resource.plural, r.data.get("propagationPolicy")) for r in delete_requests] == [
        ("pytritonmodels", "Foreground")
    ], "the model alone is deleted; what it owns goes by garbage collection"

    not_found = 'Error from server (NotFound): pytritonmodels.kubetriton.dev "lengths" not found\n'
    for argv in (("delete", "lengths"), ("status", "lengths")):
        missing = await kubetriton(capsys, *argv)
        assert (missing.code, missing.out, missing.err) == (1, "", not_found)


@pytest.mark.asyncio
async def test_context_and_kubeconfig_flags_choose_the_cluster_and_namespace(
    cluster: ClusterEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "elsewhere", "http://127.0.0.1:1")))
    config = write_kubeconfig(tmp_path / "kubeconfig", str(cluster.servers[0].url).rstrip("/"))
    settings = yaml.safe_load(config.read_text())
    settings["contexts"].append(
        {"name": "team-a", "context": {"cluster": "test", "user": "test", "namespace": "team-a"}}
    )
    config.write_text(yaml.safe_dump(settings))
    path = write_script(tmp_path / "app")
    flags = ["--kubeconfig", str(config), "--context", "team-a"]
    deployed = await kubetriton(capsys, "deploy", str(path), "--image", "x:1", "--no-wait", *flags)
    assert deployed.code == 0, deployed.err
    assert model(cluster, "lengths", "team-a") is not None
    assert "HTTP: http://lengths.team-a.svc:8000" in deployed.out

    unknown = await kubetriton(capsys, "status", "--kubeconfig", str(config), "--context", "nowhere")
    assert unknown.code == 1 and unknown.err.startswith("error: ") and "nowhere" in unknown.err
    unreachable = await kubetriton(capsys, "status")
    assert unreachable.code == 1 and unreachable.err.startswith(
        "error: cannot reach the Kubernetes API server"
    )


@pytest.mark.asyncio
async def test_an_update_keeps_what_its_flags_do_not_say(
    cluster: ClusterEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = {"image": "registry.example.com/lengths:1", "command": ["python", "/app/serve.py"]}
    await create_model(
        cluster, model_document("lengths", worker=worker, gpus={"count": 2}, replicas=3, router=True)
    )
    path = write_script(tmp_path / "app")
    updated = await kubetriton(capsys, "deploy", str(path), "--no-wait", "--replicas", "1")
    assert updated.code == 0
    command = "['python', '/app/serve.py']"
    assert updated.err.splitlines() == [
        "warning: model lengths serves Identity; this deploy makes it serve Lengths (another script? give"
        " another --name to deploy it beside)",
        f"warning: model lengths has worker.command {command}, which runs instead of the script",
    ]
    assert "pytritonmodel.kubetriton.dev/lengths configured" in updated.out.splitlines()
    spec = (model(cluster, "lengths") or {})["spec"]
    assert spec["worker"]["image"] == "registry.example.com/lengths:1"
    assert spec["worker"]["script"]["configMap"] == f"lengths-script-{script.load(path).digest}"
    assert (spec["gpus"]["count"], spec["replicas"], spec["models"], spec["router"]) == (
        2,
        1,
        ["Lengths"],
        True,
    )
