"""The operator's own API client: URL paths and the TLS settings taken from kopf's credentials."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

import kopf
import pytest
from kubetriton.operator.kube import NO_ANSWER, KubeError, resource_path, ssl_context


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("v1", "services", "ns", "m"), "/api/v1/namespaces/ns/services/m"),
        (("apps/v1", "deployments", "ns", None), "/apis/apps/v1/namespaces/ns/deployments"),
        (
            ("kubetriton.dev/v1alpha1", "pytritonmodels", "ns", "m", "status"),
            "/apis/kubetriton.dev/v1alpha1/namespaces/ns/pytritonmodels/m/status",
        ),
        (
            ("apiextensions.k8s.io/v1", "customresourcedefinitions", None, "x.example.com"),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.example.com",
        ),
    ],
)
def test_resource_paths(args: tuple, path: str) -> None:
    assert resource_path(*args) == path


@pytest.fixture()
def certificates(tmp_path: Path) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    files = {name: tmp_path / name for name in ("ca.key", "ca.crt", "client.key", "client.csr", "client.crt")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(files["ca.key"]),
        "-out",
        str(files["ca.crt"]),
        "-days",
        "1",
        "-subj",
        "/CN=test-cluster-ca",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(files["client.key"]),
        "-out",
        str(files["client.csr"]),
        "-subj",
        "/CN=kubetriton-operator",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        str(files["client.csr"]),
        "-CA",
        str(files["ca.crt"]),
        "-CAkey",
        str(files["ca.key"]),
        "-CAcreateserial",
        "-out",
        str(files["client.crt"]),
        "-days",
        "1",
    )
    return files


def _trusted_subjects(context: ssl.SSLContext) -> list[str]:
    return [dict(item[0] for item in cert["subject"])["commonName"] for cert in context.get_ca_certs()]


def test_kubeconfig_data_is_trusted_and_presented(certificates: dict[str, Path]) -> None:
    """kubeconfig carries base64 data; the service account carries a CA file."""

    def b64(name: str) -> str:
        return base64.b64encode(certificates[name].read_bytes()).decode()

    context = ssl_context(
        kopf.ConnectionInfo(
            server="https://cluster:6443",
            ca_data=b64("ca.crt"),
            certificate_data=b64("client.crt"),
            private_key_data=b64("client.key"),
        )
    )
    assert isinstance(context, ssl.SSLContext)
    assert _trusted_subjects(context) == ["test-cluster-ca"]

    from_file = ssl_context(
        kopf.ConnectionInfo(server="https://cluster:6443", ca_path=str(certificates["ca.crt"]))
    )
    assert isinstance(from_file, ssl.SSLContext)
    assert _trusted_subjects(from_file) == ["test-cluster-ca"]


def test_insecure_connections_skip_verification() -> None:
    assert ssl_context(kopf.ConnectionInfo(server="https://cluster:6443", insecure=True)) is False


@pytest.mark.parametrize(
    ("status", "message", "temporary"),
    [
        (NO_ANSWER, "no answer from the API server within 30 s", True),
        (409, "the object has been modified", True),
        (429, "storage is (re)initializing", True),
        (500, "etcdserver: request timed out", True),
        (503, "service unavailable", True),
        (422, 'Service "m" is invalid: spec.ports[1]: Duplicate value', False),
        (
            500,
            "failed to create typed patch object (ns/m; /v1, Kind=Service): .spec.ports: duplicate entries",
            False,
        ),
        (403, 'services "m" is forbidden: exceeded quota', False),
    ],
)
def test_which_failures_are_worth_retrying_soon(status: int, message: str, temporary: bool) -> None:
    assert KubeError(status, message).temporary is temporary


def test_a_terminating_namespace_is_recognised() -> None:
    terminating = (
        'deployments.apps "m" is forbidden: '
        "unable to create new content in namespace ns because it is being terminated"
    )
    assert KubeError(403, terminating).namespace_terminating
    assert not KubeError(403, 'services "m" is forbidden: exceeded quota').namespace_terminating
