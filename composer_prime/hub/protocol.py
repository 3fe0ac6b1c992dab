"""HTTP client for the Environments Hub routes that `prime env push/pull/install` use.

Settings follow the `prime` CLI: the key is `PRIME_API_KEY`, else `api_key` in
`~/.prime/config.json`; the server is `PRIME_API_BASE_URL` / `PRIME_BASE_URL`, else `base_url` in
that file, else https://api.primeintellect.ai; every route lives under `/api/v1`. Responses wrap
their payload in `{"data": ...}`; errors carry `{"detail": ...}`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from composer_prime.hub.errors import REFUSED, ToolError

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
REF = re.compile(r"^(?P<owner>[A-Za-z0-9][\w.-]*)/(?P<name>[A-Za-z0-9][\w.-]*)(@(?P<version>[\w.+!-]+))?$")


@dataclass(frozen=True)
class EnvRef:
    owner: str
    name: str
    version: str = "latest"

    def __str__(self) -> str:
        return f"{self.owner}/{self.name}@{self.version}"


def parse_ref(text: str) -> EnvRef:
    m = REF.match(text.strip())
    if not m:
        raise ToolError(f"malformed environment id {text!r}: expected owner/name or owner/name@version")
    return EnvRef(m["owner"], m["name"], m["version"] or "latest")


def _config_file() -> dict:
    path = Path.home() / ".prime" / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def settings() -> tuple[str, str]:
    """(base URL without /api/v1, API key or "") by prime's precedence: env > config file > default."""
    cfg = _config_file()
    base = (os.environ.get("PRIME_API_BASE_URL") or os.environ.get("PRIME_BASE_URL")
            or cfg.get("base_url") or DEFAULT_BASE_URL)
    key = os.environ.get("PRIME_API_KEY") or cfg.get("api_key") or ""
    return base.rstrip("/").removesuffix("/api/v1"), key


class HubError(ToolError):
    """The hub answered with an error status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"hub answered {status}: {detail}", REFUSED)
        self.status, self.detail = status, detail


def _explain(status: int, detail: str) -> HubError:
    if status == 401:
        detail = f"API key refused ({detail}); set PRIME_API_KEY to a valid key"
    elif status == 409 or ("content hash" in detail.lower() and "already exists" in detail):
        detail = f"{detail} (identical content was pushed before: change the environment or bump its version)"
    return HubError(status, detail)


class HubClient:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        env_base, env_key = settings()
        self.base_url = (base_url or env_base).rstrip("/").removesuffix("/api/v1")
        self.api_key = env_key if api_key is None else api_key
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s, follow_redirects=True)

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def require_key(self) -> None:
        if not self.api_key:
            raise ToolError("no API key: set PRIME_API_KEY (or run `prime login`)")

    def _send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            return self._http.request(method, url, **kw)
        except httpx.HTTPError as e:
            raise ToolError(f"hub unreachable at {self.base_url}: {type(e).__name__}: {e}") from None

    def request(self, method: str, route: str, payload: dict | None = None, params: dict | None = None) -> Any:
        r = self._send(method, f"{self.base_url}/api/v1{route}", json=payload, params=params)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text or r.reason_phrase
            raise _explain(r.status_code, str(detail))
        try:
            body = r.json() if r.content else {}
        except ValueError:
            raise ToolError(f"{self.base_url} did not answer {route} with JSON: is it an Environments Hub?") from None
        return body.get("data", body) if isinstance(body, dict) else body

    # -- routes --------------------------------------------------------------------------
    def resolve(self, name: str, owner: str | None = None, visibility: str | None = None) -> dict:
        payload = {"name": name, **({"visibility": visibility} if visibility else {}),
                   **({"owner_slug": owner} if owner else {})}
        return self.request("POST", "/environmentshub/resolve", payload)

    def prepare_wheel(self, env_id: str, payload: dict) -> dict:
        return self.request("POST", f"/environmentshub/{env_id}/wheels", payload)

    def finalize_wheel(self, env_id: str, wheel_id: str) -> dict:
        return self.request("POST", f"/environmentshub/{env_id}/wheels/{wheel_id}/finalize")

    def prepare_version(self, env_id: str, payload: dict) -> dict:
        return self.request("POST", f"/environmentshub/{env_id}/versions", payload)

    def finalize_version(self, env_id: str, version_id: str) -> dict:
        return self.request("POST", f"/environmentshub/{env_id}/versions/{version_id}/finalize")

    def details(self, ref: EnvRef) -> dict:
        try:
            return self.request("GET", f"/environmentshub/{ref.owner}/{ref.name}/@{ref.version}")
        except HubError as e:
            if e.status == 404:
                raise ToolError(f"{ref} not found on the hub at {self.base_url}") from None
            raise

    def versions(self, owner: str, name: str) -> list[dict]:
        data = self.request("GET", f"/environmentshub/{owner}/{name}/versions")
        return data.get("versions", []) if isinstance(data, dict) else data

    def upload(self, url: str, data: bytes) -> None:
        """PUT to the upload URL the hub handed out (a presigned URL: no Bearer key is sent)."""
        try:
            r = httpx.put(url, content=data, headers={"Content-Type": "application/octet-stream"}, timeout=300.0)
        except httpx.HTTPError as e:
            raise ToolError(f"upload to {url} failed: {type(e).__name__}: {e}") from None
        if r.status_code >= 400:
            raise HubError(r.status_code, f"upload refused: {r.text[:200]}")

    def download(self, url: str, dest: Path) -> Path:
        try:
            with self._http.stream("GET", url) as r:
                if r.status_code >= 400:
                    raise HubError(r.status_code, f"download of {url} refused")
                with dest.open("wb") as f:
                    for chunk in r.iter_bytes(1 << 16):
                        f.write(chunk)
        except httpx.HTTPError as e:
            raise ToolError(f"download of {url} failed: {type(e).__name__}: {e}") from None
        return dest
