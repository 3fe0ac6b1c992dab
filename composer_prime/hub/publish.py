"""Push a built artifact with the same sequence of calls as `prime env push`:

    POST /environmentshub/resolve                         -> {id, owner{name}, created}
    POST /environmentshub/{id}/wheels                     -> {wheel_id, upload_url};  PUT the wheel
    POST /environmentshub/{id}/wheels/{wheel_id}/finalize
    POST /environmentshub/{id}/versions                   -> {version_id, upload_url}; PUT the archive
    POST /environmentshub/{id}/versions/{version_id}/finalize -> {success: true, ...}
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from composer_prime.hub.artifact import Artifact
from composer_prime.hub.errors import REFUSED, ToolError
from composer_prime.hub.protocol import HubClient

log = logging.getLogger(__name__)


@dataclass
class Pushed:
    owner: str
    name: str
    version: str
    environment_id: str
    created: bool


def wheel_payload(art: Artifact) -> dict:
    payload = {
        "content_hash": art.content_hash,
        "filename": art.wheel.name,
        "sha256": art.wheel_sha256,
        "size": art.wheel.stat().st_size,
        "semantic_version": art.version,
        "metadata": art.metadata,
    }
    return payload | ({"runtime_hint": art.runtime_hint} if art.runtime_hint else {})


def source_payload(art: Artifact) -> dict:
    payload = {
        "content_hash": art.content_hash,
        "filename": art.source_filename,
        "sha256": art.source_sha256,
        "semantic_version": art.version,
        "metadata": {**art.metadata, "original_filename": f"{art.name}-{art.version}.tar.gz"},
    }
    return payload | ({"runtime_hint": art.runtime_hint} if art.runtime_hint else {})


def describe(art: Artifact, base_url: str, owner: str | None, has_key: bool) -> str:
    """What a push would send, for the dry run."""
    target = f"{owner}/{art.name}" if owner else f"<your account>/{art.name}"
    lines = [
        f"dry run: would push {target}@{art.version} to {base_url}",
        f"  content hash   {art.content_hash}",
        f"  wheel          {art.wheel.name}  sha256 {art.wheel_sha256}  {art.wheel.stat().st_size} bytes",
        f"  source archive {art.source_filename}  sha256 {art.source_sha256}  {len(art.files)} files",
        f"  runtime        {art.runtime_hint or 'unclassified (no verifiers requirement)'}",
        f"  API key        {'set' if has_key else 'MISSING (set PRIME_API_KEY)'}",
        "re-run with --yes to push",
    ]
    return "\n".join(lines)


def push(art: Artifact, client: HubClient, owner: str | None = None, visibility: str | None = None) -> Pushed:
    client.require_key()
    env = client.resolve(art.name, owner=owner, visibility=visibility)
    env_id, owner_name = env["id"], env["owner"]["name"]
    log.info(f"{'created' if env.get('created') else 'found'} environment {owner_name}/{art.name} ({env_id})")

    wheel = client.prepare_wheel(env_id, wheel_payload(art))
    if wheel.get("upload_url"):
        client.upload(wheel["upload_url"], art.wheel.read_bytes())
        client.finalize_wheel(env_id, wheel["wheel_id"])
    log.info(f"uploaded {art.wheel.name}")

    version = client.prepare_version(env_id, source_payload(art))
    client.upload(version["upload_url"], art.source.read_bytes())
    done = client.finalize_version(env_id, version["version_id"])
    if not done.get("success"):
        raise ToolError(f"hub did not finalize the version: {done.get('message', done)}", REFUSED)
    log.info(f"uploaded {art.source_filename}")
    return Pushed(owner_name, art.name, art.version, env_id, bool(env.get("created")))
