"""What went wrong in a failed ``docker build``, and the ``servekit build`` option that fixes it.

A first image build on a locked-down machine fails in a few known ways, each deep in
Docker's or pip's output: the build has no network for pip, a proxy's certificate that
pip does not trust, no registry for the base image, a ``docker`` client without the
buildx plugin while a build secret asks for BuildKit.  :func:`diagnose` reads the output
(BuildKit's or the classic builder's) and returns one line naming the fix, or ``None``.
The texts matched are Docker's and pip's own (tests/scaffold/test_build_failures.py
holds recorded ones).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ``docker build`` of Docker 23 and later when BuildKit is asked for and the buildx plugin is absent.
BUILDX_MISSING = "BuildKit is enabled but the buildx component is missing"

#: A daemon started without a bridge (``dockerd --bridge=none``) runs no build step on the default network.
_NO_BRIDGE = "network bridge not found"
#: The engine could not fetch the base image (no registry, or none reachable).
_NO_REGISTRY = re.compile(
    r"failed to resolve source metadata for|pull access denied|"
    r"(?:Get|Head) \"?https://[^\s\"]+/v2/[^\s\"]*\"?: (?:dial tcp|net/http|proxyconnect)|"
    r"Error response from daemon: Get \"?https://[^\s\"]+/v2/|"
    r"manifest for [^\s]+ not found|repository does not exist"
)
#: The engine does not trust the registry's (or a proxy's) certificate.
_REGISTRY_X509 = re.compile(r"x509: certificate (?:signed by unknown authority|is not valid)")
#: pip inside the build does not trust the certificate it is shown (an intercepting proxy).
_PIP_CERTIFICATE = re.compile(r"CERTIFICATE_VERIFY_FAILED|problem confirming the ssl certificate")
#: pip inside the build cannot reach its index at all.
_PIP_NO_NETWORK = re.compile(
    r"Temporary failure in name resolution|Name or service not known|No address associated with hostname|"
    r"Network is unreachable|Connection refused|ConnectTimeoutError|Failed to establish a new connection|"
    r"Read timed out|Max retries exceeded|ProxyError"
)
#: pip gave up on a requirement (what follows each of pip's connection errors).
_PIP_GAVE_UP = re.compile(r"No matching distribution found for|Could not find a version that satisfies")


@dataclass(frozen=True)
class Attempt:
    """What the failed build was given, so the advice does not repeat an option already there."""

    pip_cert: bool = False
    host_network: bool = False
    base_image: str = ""
    buildkit_secret: bool = False


def diagnose(output: str, attempt: Attempt | None = None) -> str | None:
    """One line naming the ``servekit build`` option that fixes this failed build, or ``None``."""
    attempt = attempt or Attempt()
    if BUILDX_MISSING in output:
        secret = " (--pip-cert's build secret needs BuildKit)" if attempt.buildkit_secret else ""
        return (
            f"this docker client has no buildx plugin{secret}: install it (Debian: apt-get install docker-buildx; "
            "Docker's packages: docker-buildx-plugin) or put a docker client that has it first in PATH"
        )
    if _NO_BRIDGE in output:
        return (
            "the Docker engine has no bridge network for the build's steps (dockerd --bridge=none): pass "
            "--docker-arg --network=host so the build uses the host's network"
        )
    if _REGISTRY_X509.search(output) and not _PIP_CERTIFICATE.search(output):
        return (
            "the Docker engine does not trust the registry's certificate, so it could not fetch the base image: "
            "pass --base-image IMAGE with an image the engine already has (docker images), or add the CA to "
            "the engine's trusted certificates"
        )
    if _NO_REGISTRY.search(output):
        return (
            "the Docker engine could not fetch the base image (no registry reachable): pass --base-image IMAGE "
            "with an image the engine already has (docker images; docker load), or a mirror's"
        )
    if _PIP_CERTIFICATE.search(output):
        if attempt.pip_cert:
            return (
                "pip in the build does not trust the index's certificate even with --pip-cert: the bundle given "
                "must hold the CA that signed your proxy's certificate (PEM)"
            )
        return (
            "pip in the build does not trust the index's certificate (an HTTPS-intercepting proxy?): pass "
            "--pip-cert CA.pem, the CA bundle that signed it (kept out of every layer)"
        )
    if _PIP_NO_NETWORK.search(output) and _PIP_GAVE_UP.search(output):
        if attempt.host_network:
            return (
                "pip in the build could not reach its package index, even on the host's network: pass "
                "--pip-index-url URL of an index this machine reaches (a mirror), or --build-arg HTTPS_PROXY=URL"
            )
        return (
            "pip in the build could not reach its package index (the build has no network): pass "
            "--docker-arg --network=host so the build uses the host's network, or --pip-index-url URL of an index "
            "it reaches"
        )
    return None
