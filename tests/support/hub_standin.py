"""A LOCAL STAND-IN for the Environments Hub, for tests and offline work. It is not the hub.

It speaks the routes and JSON shapes the `prime` CLI (0.18.0) uses for `env push`, `pull`,
`install`, `info`, `status`, `list` and `version list`, so the real CLI can be pointed at it with
`PRIME_BASE_URL=http://127.0.0.1:PORT`. What the real hub does beyond what the CLI reveals
(status codes of refusals, extra fields) is a documented guess: see docs/hub.md.

    python -m tests.support.hub_standin --port P --data DIR --api-key K [--user local]

Writes need `Authorization: Bearer K` (401 otherwise); reads are anonymous except for private
environments; a bad key is 401 everywhere. Upload URLs point back here (`/_standin/uploads/...`)
and, like presigned storage URLs, carry their own authority. Storage is one directory: blobs
named by sha256 plus `state.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import time
import uuid
from pathlib import Path

from aiohttp import web

API = "/api/v1/environmentshub"
DUPLICATE = "Environment version with this content hash already exists ({})"  # guessed wording, see docs/hub.md


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 10**6:06d}Z"


def _fail(status: int, detail: str) -> web.HTTPException:
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound, 409: web.HTTPConflict,
           422: web.HTTPUnprocessableEntity}[status]
    return cls(text=json.dumps({"detail": detail}), content_type="application/json")


def _ok(data: object, **extra: object) -> web.Response:
    return web.json_response({"data": data, **extra})


class StandinHub:
    def __init__(self, data_dir: Path, api_keys: list[str], user: str = "local") -> None:
        self.dir = Path(data_dir)
        (self.dir / "blobs").mkdir(parents=True, exist_ok=True)
        (self.dir / "uploads").mkdir(exist_ok=True)
        self.keys, self.user = set(api_keys), user
        path = self.dir / "state.json"
        self.state = json.loads(path.read_text()) if path.exists() else {
            "environments": {}, "wheels": {}, "versions": {}, "uploads": {}}

    # -- bookkeeping ---------------------------------------------------------------------
    def _save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.dir / "state.json")

    def _caller(self, request: web.Request) -> str | None:
        """The user a request acts as: None when anonymous; a bad key is refused outright."""
        auth = request.headers.get("Authorization", "")
        if not auth:
            return None
        if not auth.startswith("Bearer ") or auth[7:] not in self.keys:
            raise _fail(401, "Invalid API key")
        return self.user

    def _writer(self, request: web.Request) -> str:
        user = self._caller(request)
        if user is None:
            raise _fail(401, "Not authenticated")
        return user

    def _env(self, env_id: str) -> dict:
        if env_id not in self.state["environments"]:
            raise _fail(404, f"Environment {env_id} not found")
        return self.state["environments"][env_id]

    def _find(self, request: web.Request) -> dict:
        owner, name = request.match_info["owner"], request.match_info["name"]
        env = next((e for e in self.state["environments"].values() if (e["owner"], e["name"]) == (owner, name)), None)
        if env is None or (env["visibility"] == "PRIVATE" and self._caller(request) is None):
            raise _fail(404, f"Environment {owner}/{name} not found")
        return env

    def _versions(self, env_id: str) -> list[dict]:
        """Finalized versions of an environment, newest first."""
        vs = [v for v in self.state["versions"].values() if v["env_id"] == env_id and v["finalized"]]
        return sorted(vs, key=lambda v: v["created_at"], reverse=True)

    def _refuse_duplicate(self, env_id: str, content_hash: str) -> None:
        if any(v["content_hash"] == content_hash for v in self._versions(env_id)):
            raise _fail(409, DUPLICATE.format(content_hash[:8]))

    def _url(self, request: web.Request, path: str) -> str:
        return f"{request.scheme}://{request.host}{path}"

    async def _prepare(self, request: web.Request, kind: str) -> dict:
        self._writer(request)
        env_id = request.match_info["env_id"]
        self._env(env_id)
        body = await request.json()
        missing = [k for k in ("content_hash", "filename", "sha256", "semantic_version") if not body.get(k)]
        if missing:
            raise _fail(422, f"missing fields: {', '.join(missing)}")
        self._refuse_duplicate(env_id, body["content_hash"])
        rid, token = uuid.uuid4().hex, secrets.token_urlsafe(24)
        table = "wheels" if kind == "wheel" else "versions"
        self.state[table][rid] = {**{k: body.get(k) for k in ("content_hash", "filename", "sha256", "size",
                                                              "semantic_version", "metadata", "runtime_hint")},
                                  "id": rid, "env_id": env_id, "finalized": False, "created_at": _now()}
        self.state["uploads"][token] = {"table": table, "id": rid}
        self._save()
        return {"id": rid, "upload_url": self._url(request, f"/_standin/uploads/{token}")}

    def _finalize(self, request: web.Request, table: str, rid: str) -> dict:
        self._writer(request)
        rec = self.state[table].get(rid)
        if rec is None or rec["env_id"] != request.match_info["env_id"]:
            raise _fail(404, f"upload {rid} not found")
        part = self.dir / "uploads" / rid
        if not part.exists():
            raise _fail(400, "nothing was uploaded for this artifact")
        data = part.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != rec["sha256"] or (rec.get("size") is not None and rec["size"] != len(data)):
            raise _fail(400, f"uploaded bytes do not match the declared sha256/size (got {digest[:12]})")
        self._refuse_duplicate(rec["env_id"], rec["content_hash"])  # a race between two pushes
        part.replace(self.dir / "blobs" / digest)
        rec.update(finalized=True, finalized_at=_now())
        if table == "versions":
            wheels = [w for w in self.state["wheels"].values() if w["env_id"] == rec["env_id"]
                      and w["finalized"] and w["content_hash"] == rec["content_hash"]]
            rec["wheel_id"] = next((w["id"] for w in sorted(wheels, key=lambda w: w["created_at"], reverse=True)), None)
            env = self.state["environments"][rec["env_id"]]
            env.update(updated_at=rec["finalized_at"], description=(rec.get("metadata") or {}).get("description", ""))
        self._save()
        return rec

    def _details(self, request: web.Request, env: dict, v: dict) -> dict:
        wheel = self.state["wheels"].get(v.get("wheel_id") or "")

        def blob(rec: dict) -> str:
            return self._url(request, f"/_standin/files/{rec['sha256']}/{rec['filename']}")

        return {
            "id": env["id"], "name": env["name"], "owner": {"name": env["owner"]}, "visibility": env["visibility"],
            "version_id": v["id"], "semantic_version": v["semantic_version"], "content_hash": v["content_hash"],
            "created_at": v["created_at"], "metadata": v.get("metadata") or {}, "runtime_hint": v.get("runtime_hint"),
            "package_url": blob(v), "package_sha256": v["sha256"],
            "wheel_url": blob(wheel) if wheel else None, "wheel_sha256": wheel["sha256"] if wheel else None,
            "wheel_filename": wheel["filename"] if wheel else None, "url_dependencies": [], "standin": True,
        }

    # -- routes --------------------------------------------------------------------------
    async def resolve(self, request: web.Request) -> web.Response:
        user = self._writer(request)
        body = await request.json()
        name = body.get("name")
        if not name:
            raise _fail(422, "name is required")
        owner = body.get("owner_slug") or body.get("team_slug") or user  # stand-in: any owner is writable
        envs = self.state["environments"]
        env = next((e for e in envs.values() if (e["owner"], e["name"]) == (owner, name)), None)
        created = env is None
        if created:
            env_id = uuid.uuid4().hex[:24]
            env = envs[env_id] = {"id": env_id, "owner": owner, "name": name, "description": "",
                                  "visibility": body.get("visibility") or "PUBLIC",
                                  "created_at": _now(), "updated_at": _now()}
            self._save()
        return _ok({"id": env["id"], "owner": {"name": owner}, "name": name, "created": created})

    async def prepare_wheel(self, request: web.Request) -> web.Response:
        r = await self._prepare(request, "wheel")
        return _ok({"wheel_id": r["id"], "upload_url": r["upload_url"]})

    async def prepare_version(self, request: web.Request) -> web.Response:
        r = await self._prepare(request, "version")
        return _ok({"version_id": r["id"], "upload_url": r["upload_url"]})

    async def finalize_wheel(self, request: web.Request) -> web.Response:
        rec = self._finalize(request, "wheels", request.match_info["wheel_id"])
        return _ok({"success": True, "wheel_id": rec["id"]})

    async def finalize_version(self, request: web.Request) -> web.Response:
        rec = self._finalize(request, "versions", request.match_info["version_id"])
        return _ok({"success": True, "version_id": rec["id"], "content_hash": rec["content_hash"],
                    "semantic_version": rec["semantic_version"]})

    async def upload(self, request: web.Request) -> web.Response:
        target = self.state["uploads"].pop(request.match_info["token"], None)
        if target is None:
            raise _fail(404, "unknown or used upload URL")
        (self.dir / "uploads" / target["id"]).write_bytes(await request.read())
        self._save()
        return web.Response(status=200)

    async def details(self, request: web.Request) -> web.Response:
        env, want = self._find(request), request.match_info["version"]
        vs = self._versions(env["id"])
        if want != "latest":
            vs = [v for v in vs if v["semantic_version"] == want or (len(want) >= 8 and v["content_hash"].startswith(want))]
        if not vs:
            raise _fail(404, f"Version {want} of {env['owner']}/{env['name']} not found")
        return _ok(self._details(request, env, vs[0]))

    async def versions(self, request: web.Request) -> web.Response:
        env = self._find(request)
        rows = [{"version": v["semantic_version"], "version_id": v["id"], "created_at": v["created_at"],
                 "sha256": v["content_hash"], "content_hash": v["content_hash"], "size": 1 + bool(v.get("wheel_id"))}
                for v in self._versions(env["id"])]
        return _ok({"versions": rows})

    async def status(self, request: web.Request) -> web.Response:
        env = self._find(request)
        vs = self._versions(env["id"])
        latest = {k: vs[0][k] for k in ("semantic_version", "content_hash", "created_at")} if vs else None
        return _ok({"name": env["name"], "description": env["description"], "visibility": env["visibility"],
                    "latest_version": latest})

    async def list_envs(self, request: web.Request) -> web.Response:
        caller, q = self._caller(request), request.query
        envs = [e for e in self.state["environments"].values() if e["visibility"] == "PUBLIC" or caller]
        if q.get("owner"):
            envs = [e for e in envs if e["owner"] == q["owner"]]
        rows = [{"id": e["id"], "name": e["name"], "owner": {"name": e["owner"]}, "description": e["description"],
                 "visibility": e["visibility"], "stars": 0, "updated_at": e["updated_at"],
                 "latest_version": (self._versions(e["id"]) or [{}])[0].get("semantic_version")} for e in envs]
        offset, limit = int(q.get("offset", 0)), int(q.get("limit", 20))
        return _ok(rows[offset: offset + limit], total_count=len(rows))

    async def file(self, request: web.Request) -> web.Response:
        sha = request.match_info["sha"]
        path = self.dir / "blobs" / sha
        if len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha) or not path.exists():
            raise _fail(404, "no such file")
        disposition = f"attachment; filename={request.match_info['filename']}"
        return web.FileResponse(path, headers={"Content-Disposition": disposition})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "standin": True})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024**2)
        app.add_routes([
            web.get("/_standin/health", self.health),
            web.put("/_standin/uploads/{token}", self.upload),
            web.get("/_standin/files/{sha}/{filename}", self.file),
            web.get(f"{API}/", self.list_envs),
            web.post(f"{API}/resolve", self.resolve),
            web.post(f"{API}/{{env_id}}/wheels", self.prepare_wheel),
            web.post(f"{API}/{{env_id}}/wheels/{{wheel_id}}/finalize", self.finalize_wheel),
            web.post(f"{API}/{{env_id}}/versions", self.prepare_version),
            web.post(f"{API}/{{env_id}}/versions/{{version_id}}/finalize", self.finalize_version),
            web.get(f"{API}/{{owner}}/{{name}}/versions", self.versions),
            web.get(f"{API}/{{owner}}/{{name}}/status", self.status),
            web.get(f"{API}/{{owner}}/{{name}}/@{{version}}", self.details),
        ])
        return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Local STAND-IN for the Environments Hub (tests/offline only).")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--data", type=Path, required=True, help="storage directory (blobs + state.json)")
    p.add_argument("--api-key", action="append", default=[], help="accepted Bearer key (repeatable)")
    p.add_argument("--user", default="local", help="the account slug the keys belong to")
    args = p.parse_args(argv)
    hub = StandinHub(args.data, args.api_key, args.user)
    print(f"stand-in hub (not the real Environments Hub) on http://{args.host}:{args.port}", flush=True)
    web.run_app(hub.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
