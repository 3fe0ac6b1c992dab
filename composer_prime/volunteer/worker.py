"""`uv run worker --join URL --token T`: this machine becomes an inference node of a run.

The worker listens on nothing; it only calls the run's pool (volunteer/pool.py, its routes in volunteer/door.py):

1. join with the token, signed by its key (volunteer/keys.py), over https to the certificate the
   token pins when the pool is beyond loopback (volunteer/tls.py): the pool answers the model, where
   the weights are (the run's SHARDCAST relays, or its weights directory on the same machine) and
   the heartbeat period (a pool limiting joins, 429, is tried again: `join`); then beat every period (a
   dead node re-joins; an ejected one stops);
2. ask for leases (long polls, `concurrency` at once); the pool chooses the tasks and seeds;
3. hold exactly the leased weight version (pulled and verified through SHARDCAST: signatures
   and shard hashes, transports/weights/shardcast/), generate with the embedded engine and the
   leased seed, keeping each generated token's last hidden state as it is decoded (no second
   forward; with `engine = "vllm"`, vLLM generates and one prefill gives the states:
   volunteer/engines.py), build TOPLOC proofs over them (verify/toploc.py), sign the submission
   and send it.

The node never reports a reward. The steps are methods (`generate`, `prove`, `submission`) so a
test's dishonest worker overrides one of them and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp
import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.config.volunteers import WorkerConfig
from composer_prime.contract.inference import Generation
from composer_prime.contract.batches import SchemaError
from composer_prime.contract.volunteer import JoinAnswer, Lease, Submission, hello, node_id
from composer_prime.contract.weights import Directory, Shardcast
from composer_prime.model.resolve import resolve_model
from composer_prime.transports.weights.filesystem import MARKER
from composer_prime.utils import steps
from composer_prime.verify import toploc
from composer_prime.volunteer.engines import make_engine
from composer_prime.volunteer.tls import split_token

log = logging.getLogger(__name__)


class Ejected(RuntimeError):
    """The run ejected this node (or refused its token): nothing more to do."""


class PoolGone(Exception):
    """The pool stopped answering: its run has ended (said once, however many lease loops saw it)."""


def unreachable(e: aiohttp.ClientError, url: str) -> str:
    """A connection failure in words, not aiohttp's repr of its connection key."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"nothing answers at {url} ({e.os_error.strerror or e.os_error})"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def refusal(text: str) -> str:
    """The reason a pool's refusal gives: FastAPI's `{"detail": "..."}` read, not printed as JSON (issue 46: a
    revoked worker said `ejected by the run: {"detail":"..."}`); any other body as it came."""
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        return text
    return detail if isinstance(detail, str) else text


def ejected(detail: str) -> Ejected:
    """The pool's word on this node's ejection: 'ejected by the run: <why>' (door.py says 'this node was
    ejected from the run: <why>')."""
    return Ejected(f"ejected by the run: {detail.removeprefix('this node was ejected from the run: ')}")


class Worker:
    def __init__(self, cfg: WorkerConfig, key) -> None:
        self.cfg, self.key, self.node = cfg, key, node_id(key)
        self.url = cfg.join.rstrip("/")
        self.version = 0  # the weights the engine holds
        self.submitted = 0
        self.engine = None  # volunteer/engines.py, once joined
        self._http: aiohttp.ClientSession | None = None
        self._cond = asyncio.Condition()  # guards `version` and `_users` (leases using the weights)
        self._users = 0

    def _connector(self) -> aiohttp.TCPConnector:
        """Over https, only the certificate the token pins (volunteer/tls.py); http is for loopback only
        (WorkerConfig refuses it beyond)."""
        _, pin = split_token(self.cfg.join_token())
        if not self.url.startswith("https://"):
            return aiohttp.TCPConnector()
        if pin is None:
            raise Ejected(f"{self.url} is https but the token pins no certificate: use the token the run's "
                          f"operator gave (SECRET.PIN)")
        return aiohttp.TCPConnector(ssl=aiohttp.Fingerprint(bytes.fromhex(pin)))

    async def post(self, route: str, body: dict) -> tuple[int, dict | None]:
        """(status, answer); a refusal's answer is {"detail": its reason in words}."""
        async with self._http.post(f"{self.url}/pool/{route}", json=body) as r:
            return r.status, (await r.json() if r.status == 200 else {"detail": refusal(await r.text())})

    async def join(self, wait_s: float = 120.0) -> JoinAnswer:
        """Join (again); a pool not up yet, or limiting joins (429: strangers on this host, or this invite's
        other keys, joined a lot), is waited for `wait_s`, trying again after 1, 2, 4 ... 16 s."""
        deadline, pause = time.time() + wait_s, 1.0
        secret, _ = split_token(self.cfg.join_token())
        while True:
            try:
                status, info = await self.post("join", hello(self.key, "join", token=secret))
            except aiohttp.ServerFingerprintMismatch:  # someone else answers at that address
                raise Ejected(f"the pool at {self.url} is not the run's: its certificate does not match the one "
                              f"your token pins") from None
            except aiohttp.ClientConnectionError:
                if time.time() > deadline:
                    raise Ejected(f"no pool answers at {self.url} after {wait_s:.0f} s") from None
                await self.pause(1.0)
                continue
            if status != 429:
                break
            if time.time() + pause > deadline:
                raise Ejected(f"the pool at {self.url} still limits joins after {wait_s:.0f} s: {info['detail']}")
            if pause == 1.0:
                log.warning(f"the pool at {self.url} limits joins ({info['detail']}): trying again for up to "
                            f"{wait_s:.0f} s")
            await self.pause(pause)
            pause = min(2 * pause, 16.0)
        if status != 200:
            raise Ejected(f"the pool at {self.url} refused to let this node join: {status} {info['detail']}")
        try:
            return JoinAnswer.from_json(info)
        except SchemaError as e:
            raise Ejected(f"the pool at {self.url} answered the join with something else: {e}") from None

    async def pause(self, seconds: float) -> None:
        """Wait before trying the pool again (a test moves its clock instead)."""
        await asyncio.sleep(seconds)

    async def run(self) -> int:
        """Work until the pool ends (or `max_leases` submissions); returns how many were sent. ProofError at once
        where TOPLOC is not installed: a node that cannot prove its work must not take leases (each would
        fail, and the run would wait out every lease's deadline)."""
        toploc.require()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cfg.http_timeout_s), connector=self._connector())
        try:
            info = await self.join()
            log.info(f"joined {self.url} as node {self.node[:12]}")
            beat = asyncio.create_task(self._beat(info.heartbeat_s))  # beating while the model loads
            try:
                model_dir = await asyncio.to_thread(resolve_model, info.model)  # may convert it, once
                self.weights, self.model_dir = info.weights, model_dir
                dtype = self.cfg.dtype if self.cfg.dtype != "auto" else info.dtype or "auto"  # the run's, by default
                self.engine = make_engine(self.cfg.engine, model_dir, info.model, self.cfg.max_model_len,
                                          self.cfg.concurrency, self.cfg.device, dtype, self.cfg.draws)
                await self.engine.start()
                await self._work(beat)
            finally:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
                if self.engine is not None:
                    await self.engine.stop()
        finally:
            await self._http.close()
        return self.submitted

    async def _beat(self, period: float) -> None:
        failing = False
        while True:
            await asyncio.sleep(period)
            try:
                status, body = await self.post("heartbeat", hello(self.key, "heartbeat"))
                failing = False
                if status == 403 and "ejected" in body["detail"]:
                    raise ejected(body["detail"])
                if status == 403:  # declared dead (a pause, a slow link): join again
                    await self.join()
            except aiohttp.ClientError as e:
                if not failing:  # once per outage, not once per beat
                    log.warning(f"heartbeat failed: {unreachable(e, self.url)}")
                failing = True

    async def _work(self, beat: asyncio.Task) -> None:
        """`concurrency` lease loops (the engine batches what they generate) until one ends them all."""
        loops = [asyncio.create_task(self._loop()) for _ in range(self.cfg.concurrency)]
        try:
            done, _ = await asyncio.wait([beat, *loops], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # Ejected from the beat or a loop; PoolGone from a loop
        except PoolGone:
            log.info("the pool is gone: the run has ended")
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self) -> None:
        while not self.cfg.max_leases or self.submitted < self.cfg.max_leases:
            try:
                status, body = await self.post("lease", hello(self.key, "lease", wait_s=5.0))
            except aiohttp.ClientConnectionError:
                raise PoolGone from None
            if status == 204:
                continue
            if status == 403 and "ejected" in body["detail"]:
                raise ejected(body["detail"])
            if status != 200:
                await asyncio.sleep(1.0)  # rate-limited, or dead and re-joining
                continue
            lease = Lease(**body)
            try:
                sub = await self.work(lease)
            except (OSError, ValueError, RuntimeError) as e:  # weights not fetched in time, a prompt too long ...
                log.warning(f"lease {lease.lease_id[:8]} not done: {e}")  # it times out and goes to another node
                continue
            await self.submit(lease, sub)
            self.submitted += 1

    async def submit(self, lease: Lease, sub: Submission) -> None:
        """Send it; over the rate limit, again after a pause, until the lease's deadline."""
        while True:
            async with self._http.post(f"{self.url}/pool/submit", json=asdict(sub)) as r:
                if r.status == 429 and time.time() < lease.deadline:
                    await asyncio.sleep(0.5)
                    continue
                if r.status != 202:
                    log.warning(f"lease {lease.lease_id[:8]}: submission refused: {r.status} {refusal(await r.text())}")
                return

    async def work(self, lease: Lease) -> Submission:
        async with self.holding(lease.weight_version, lease.deadline):  # no swap until it is proven
            gen, states = await self.generate(lease)
            return self.submission(lease, gen, await asyncio.to_thread(self.prove, states))

    async def generate(self, lease: Lease) -> tuple[Generation, torch.Tensor]:
        """The completion and its tokens' last hidden states [tokens, hidden]."""
        return await self.engine.generate_with_states(lease.prompt_ids, SamplingParams(**lease.sampling))

    def prove(self, states: torch.Tensor) -> list[str]:
        return toploc.build(states)

    def submission(self, lease: Lease, gen: Generation, proofs: list[str]) -> Submission:
        return Submission(self.node, lease.lease_id, self.version, lease.prompt_sha256, gen.token_ids, gen.logprobs,
                          lease.sampling["seed"], proofs, self.engine.sampler).signed(self.key)

    @contextlib.asynccontextmanager
    async def holding(self, version: int, deadline: float):
        """The engine at weights `version` for the block: leases at the held version share it; another
        version is loaded (forwards, or back to one a slower trusted server still serves) once no
        lease is using the weights."""
        async with self._cond:
            await self._cond.wait_for(lambda: self.version == version or self._users == 0)
            if self.version != version:
                await self.load(version, deadline)
            self._users += 1
        try:
            yield
        finally:
            async with self._cond:
                self._users -= 1
                self._cond.notify_all()

    async def load(self, version: int, deadline: float) -> None:
        path = await self.fetch(version, deadline)
        await self.engine.load_weights(str(path))
        self.version = version
        log.info(f"holding weights v{version}")
        if isinstance(self.weights, Shardcast):  # our downloads: the newest few (a lease may go back one)
            steps.prune(path.parent, 3)

    async def fetch(self, version: int, deadline: float) -> Path:
        w = self.weights
        if isinstance(w, Directory):  # the run's own directory: this machine is the run's
            path = steps.step_path(Path(w.root), version)
            while not (path / MARKER).exists():
                if time.time() > deadline:
                    raise TimeoutError(f"weights v{version} did not appear in {w.root}")
                await asyncio.sleep(0.2)
            return path
        from composer_prime.transports.weights.shardcast.client import Downloader
        from composer_prime.transports.weights.shardcast.origin import model_hash

        dl = Downloader(w, self.cfg.work_dir / "incoming",
                        expect_model_hash=model_hash(Path(self.model_dir)))
        try:
            return await dl.fetch(version, steps.step_path(self.cfg.work_dir / "weights", version))
        finally:
            await dl.close()
