"""`-dr/--docker-repo`: a GGUF model from Docker Hub's model registry, as llama-server's
`common_docker_resolve_model` finds it: `[<namespace>/]<model>[:<tag>]` (namespace `ai`, tag
`latest` by default); a pull token from the registry's auth service, the image manifest, its
first layer whose media type names GGUF (`application/vnd.docker.ai.gguf.v3`), and that
layer's blob, whose `sha256:` digest is the file's checksum.

The registry and its auth service are Docker Hub's unless LLAMAQ_DOCKER_REGISTRY and
LLAMAQ_DOCKER_AUTH (ours) name others (a mirror, or a test's own registry).

Owns: the reference's parts and the three registry requests. Does not own: the download, the
cache and the object store (storage/models.py ModelFiles.from_docker)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from storage.errors import ModelNotFound

DEFAULT_REGISTRY = "https://registry-1.docker.io"
DEFAULT_AUTH = "https://auth.docker.io/token"
DEFAULT_NAMESPACE = "ai"
MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json,"
                  "application/vnd.oci.image.manifest.v1+json")
_DIGEST = re.compile(r"^sha256:([a-fA-F0-9]{64})$")
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DockerModel:
    """A model image named by `-dr`."""

    repo: str
    tag: str

    @classmethod
    def parse(cls, ref: str) -> DockerModel:
        name, _, tag = ref.partition(":")
        if not name or (":" in ref and not tag):
            raise ModelNotFound(f"-dr {ref!r}: expected [<namespace>/]<model>[:<tag>]")
        return cls(name if "/" in name else f"{DEFAULT_NAMESPACE}/{name}", tag or "latest")

    def file_name(self) -> str:
        """The cached file's name, as llama-server's: `ai_smollm2_135M-Q4_0.gguf`."""
        return f"{self.repo.replace('/', '_')}_{self.tag}.gguf"


@dataclass(frozen=True)
class DockerBlob:
    """Where a model image's GGUF layer is and how to fetch it."""

    url: str
    token: str
    sha256: str


@dataclass(frozen=True)
class Registry:
    url: str = DEFAULT_REGISTRY
    auth: str = DEFAULT_AUTH

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Registry:
        return cls(environ.get("LLAMAQ_DOCKER_REGISTRY", DEFAULT_REGISTRY).rstrip("/"),
                   environ.get("LLAMAQ_DOCKER_AUTH", DEFAULT_AUTH))

    def resolve(self, model: DockerModel) -> DockerBlob:
        """The GGUF layer of `model`'s manifest (ModelNotFound on any failure, naming it)."""
        import httpx  # here: a worker that downloads nothing never loads it

        where = f"{model.repo}:{model.tag}"
        try:
            with httpx.Client(timeout=TIMEOUT_S, follow_redirects=True) as client:
                answer = client.get(self.auth, params={
                    "service": "registry.docker.io", "scope": f"repository:{model.repo}:pull"})
                if answer.status_code != 200:
                    raise ModelNotFound(f"Docker model {where}: the registry's token request "
                                        f"answered HTTP {answer.status_code}")
                token = answer.json().get("token")
                if not isinstance(token, str):
                    raise ModelNotFound(f"Docker model {where}: the token answer has no token")
                answer = client.get(f"{self.url}/v2/{model.repo}/manifests/{model.tag}",
                                    headers={"Authorization": f"Bearer {token}",
                                             "Accept": MANIFEST_TYPES})
                if answer.status_code != 200:
                    raise ModelNotFound(f"Docker model {where}: the manifest request answered "
                                        f"HTTP {answer.status_code}")
                digest = gguf_digest(answer.json(), where)
        except (httpx.HTTPError, ValueError) as error:
            raise ModelNotFound(f"Docker model {where}: {error}") from error
        return DockerBlob(f"{self.url}/v2/{model.repo}/blobs/sha256:{digest}", token, digest)


def gguf_digest(manifest: object, where: str) -> str:
    """The lowercase hex SHA-256 of the manifest's first GGUF layer."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        media_type = layer.get("mediaType", "") if isinstance(layer, dict) else ""
        if isinstance(media_type, str) and "gguf" in media_type:
            found = _DIGEST.match(str(layer.get("digest", "")))
            if found is None:
                raise ModelNotFound(f"Docker model {where}: invalid layer digest "
                                    f"{layer.get('digest')!r}")
            return found.group(1).lower()
    raise ModelNotFound(f"Docker model {where}: no GGUF layer in its manifest")
