"""vLLM engine: runs vLLM's OpenAI server as a child process and talks to it over HTTP.

Why a child process rather than vLLM's Python API in our own process: importing vLLM takes
~10 s and GBs of memory, a crash in it (a worker dying, an illegal instruction in a CPU
kernel) must not take our server down, and `stop()` must be able to reclaim everything by
killing one process group.

The child is started with
  --enable-scale-out                    -> POST /inference/v1/generate (token ids in, token ids out)
  VLLM_SERVER_DEV_MODE=1                -> POST /collective_rpc and /reset_prefix_cache (weight swaps)
  --worker-extension-cls WorkerReload   -> the reload RPC, with a fix for tied LM heads on CPU
  --logprobs-mode processed_logprobs    -> log-probs of the temperature-scaled distribution,
                                           the convention in `contract/inference.py`

Scoring uses /v1/completions' `prompt_logprobs`, which vLLM computes from the raw logits whatever
the logprobs mode (prompt tokens skip the sampling processors), so only temperature 1 is served.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation, Scores
from composer_prime.inference.engines.base import check_score_args
from composer_prime.utils.proc import die_with_parent
from composer_prime.utils.safetensors_index import tensor_index

READY_TIMEOUT_S = 600.0  # a cold start on a 2-core CPU box takes 65-110 s; a GPU with a big model more
STOP_TIMEOUT_S = 30.0  # grace period between SIGTERM and SIGKILL
RPC_TIMEOUT_S = 600.0  # a weight reload of a big model can take minutes
LOG_TAIL_LINES = 40


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _port_is_free(port: int) -> bool:
    # If something already listens there, /health would answer for *it* and we'd talk to the wrong server.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a closed port in TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tensor_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a directory's *.safetensors, read from the file headers only."""
    return {name: tuple(t["shape"]) for name, t in tensor_index(model_dir).items()}


def _kill_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the child's whole process group (vLLM forks an engine-core process), then SIGKILL."""
    pgid = proc.pid  # start_new_session=True makes the child the leader of its own group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    # Even after a clean exit of the leader, a grandchild may linger in the group: SIGKILL whatever is left.
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    # Orphaned grandchildren are reaped by init, not by us; give it a moment so memory is free on return.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


class WorkerReload:
    """Mixed into vLLM's worker class (--worker-extension-cls) in the child; reached via /collective_rpc.

    One RPC per weight swap, so no decode step runs between the reload and the repack below.
    """

    def composer_reload_weights(self, weights_path: str) -> None:
        self.reload_weights(weights_path=weights_path)  # vLLM's own in-place reload
        # On CPU, linear layers multiply with a packed copy of their weight, made after loading. A tied LM
        # head shares the embedding's weight but loads nothing itself, so the reload never repacks it and it
        # would keep computing logits with the *old* embedding. Repack it from the (updated) shared weight.
        head = getattr(self.model_runner.get_model(), "lm_head", None)
        if head is not None and hasattr(head, "cpu_linear"):
            head.quant_method.process_weights_after_loading(head)


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        model_name: str,
        port: int,
        max_model_len: int = 512,
        dtype: str = "auto",
        extra_args: Sequence[str] = (),
        log_path: str | None = None,
    ) -> None:
        self.model_path = str(Path(model_path).resolve())
        self.model_name = model_name
        self.port = port
        self.max_model_len = max_model_len
        self.dtype = dtype if dtype != "auto" else ("bfloat16" if _cuda_available() else "float32")
        self._copies = None  # the embedded engine's model, for audits (`states`): made at the first one
        self.extra_args = list(extra_args)
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self._served_shapes = _tensor_shapes(Path(self.model_path))  # what any reload must match
        self._proc: subprocess.Popen | None = None
        self._client: httpx.AsyncClient | None = None

    # ---- lifecycle ----

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The child's argv and environment (public so a user can see exactly what runs)."""
        on_gpu = _cuda_available()
        dtype = self.dtype  # auto: bf16 on a GPU; fp32 on the CPU, where bf16 crashes vLLM's attention on some x86
        # `vllm serve` is not usable under the vllm-cpu distribution name; the module entry point is.
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_path,
            "--served-model-name", self.model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", dtype,
            "--max-model-len", str(self.max_model_len),
            "--enable-scale-out",
            "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", f"{__name__}.{WorkerReload.__qualname__}",
        ]  # fmt: skip
        if not on_gpu:
            argv.append("--enforce-eager")  # no CUDA graphs / torch.compile on CPU: faster start, same numbers
        argv += self.extra_args
        env = dict(os.environ)
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["HF_HUB_OFFLINE"] = "1"  # everything is local; never reach for a hub
        # Its engine and workers talk over TCP too (gloo, ZMQ): on our loopback, never the machine's address,
        # which vLLM would otherwise pick. Our server is the only door in (see the --host above).
        env["VLLM_HOST_IP"] = "127.0.0.1"
        if not on_gpu:
            # 1 GiB of KV cache: unset, vLLM sizes it from free RAM, which the trainer on the same box needs.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            # Don't pin OpenMP threads to cores: on a small shared box the other processes need them too.
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return argv, env

    async def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("VLLMEngine already started")
        # find_spec, not `import vllm`: the import costs ~10 s and GBs, and only the child needs it.
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError("vLLM is not installed: run `uv sync --extra vllm-cpu` (CPU) or `uv sync --extra vllm` (GPU)")
        if not _port_is_free(self.port):
            raise RuntimeError(f"port {self.port} is already in use; pick another port for the vLLM engine")
        self._spawn()
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(RPC_TIMEOUT_S, connect=5.0))
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    def _spawn(self) -> None:
        argv, env = self.command()
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix=f"vllm-{self.port}-", suffix=".log")
            os.close(fd)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Own session => own process group, so stop() can kill vLLM and every process it forked.
            self._proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent(),  # backstop if this process is SIGKILLed
            )
        atexit.register(self._kill_now)  # no orphaned vLLM if the caller forgets stop() or crashes

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with code {self._proc.returncode} before it was ready "
                    f"(log: {self.log_path}):\n{self.log_tail()}"
                )
            try:
                if (await self._client.get("/health", timeout=5.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            await asyncio.sleep(1.0)
        raise TimeoutError(f"vLLM not ready after {READY_TIMEOUT_S:.0f} s (log: {self.log_path}):\n{self.log_tail()}")

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except (OSError, TypeError):
            return "<no log>"

    def _kill_now(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc, STOP_TIMEOUT_S)
            self._proc = None

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._proc is not None:
            # Blocking waits (up to STOP_TIMEOUT_S) go to a thread so the event loop keeps serving.
            await asyncio.to_thread(self._kill_now)
        atexit.unregister(self._kill_now)

    # ---- inference ----

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("VLLMEngine is not started")
        return self._client

    async def _post(self, route: str, refused: type[Exception] = RuntimeError, **kw) -> httpx.Response:
        """POST to the child; a 4xx (vLLM refused the request's content) raises `refused`."""
        r = await self._require_client().post(route, **kw)
        if r.status_code != 200:
            error = refused if 400 <= r.status_code < 500 else RuntimeError
            raise error(f"vLLM {route} answered {r.status_code}: {r.text[:2000]}")
        return r

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        body = {
            "model": self.model_name,
            "token_ids": list(prompt_token_ids),
            "sampling_params": {
                **params.model_dump(mode="json"),
                "logprobs": 1,  # >=1 is needed to get the sampled token's own log-prob back
                "skip_special_tokens": False,
            },
        }
        choice = (await self._post("/inference/v1/generate", json=body)).json()["choices"][0]
        token_ids = list(choice["token_ids"])
        logprobs = [float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(token_ids)} tokens")
        return Generation(
            prompt_token_ids=list(prompt_token_ids),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason") or "length",
        )

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        check_score_args(token_ids, start, top_k, temperature, self.max_model_len)
        if len(token_ids) == self.max_model_len:  # vLLM wants room for one generated token, even with echo
            raise ValueError(f"the vLLM engine scores at most max_model_len - 1 = {self.max_model_len - 1} token ids")
        if temperature != 1.0:
            # Re-tempering top-k raw log-probs is not exact: it needs the whole vocabulary's logits.
            raise NotImplementedError(f"the vLLM engine scores at temperature 1 only (vLLM's prompt log-probs are "
                                      f"of the raw distribution), got temperature {temperature}")
        body = {"model": self.model_name, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": top_k}
        # vLLM refuses top_k over its --max-logprobs (20 by default) with a 400: a ValueError here too.
        r = await self._post("/v1/completions", refused=ValueError, json=body)
        # One dict per prompt position (None at 0): token id (a string in JSON) -> {logprob, rank, decoded_token},
        # holding the top-k and the actual token, which may or may not be one of them.
        positions = r.json()["choices"][0]["prompt_logprobs"]
        scores = Scores([], [], [])
        for j in range(start, len(token_ids)):
            entries = sorted(((int(t), float(e["logprob"])) for t, e in positions[j].items()), key=lambda x: -x[1])
            scores.token_logprobs.append(float(positions[j][str(token_ids[j])]["logprob"]))
            scores.top_ids.append([t for t, _ in entries[:top_k]])
            scores.top_logprobs.append([lp for _, lp in entries[:top_k]])
        return scores

    audits_in_place = False  # the server names the weights of every audit (`states`)

    async def states(self, token_ids: list[int], start: int, weights: str, dtype: str | None = None):
        """The embedded engine's `states` (a volunteer's audit): vLLM exposes no hidden states, so one
        prefill on a copy of the model (engines/hf/copies.py) under `weights` (a step directory, or the
        base model's) in `dtype` (default: the served one)."""
        check_score_args(token_ids, start, 1, 1.0, self.max_model_len)
        if self._copies is None:
            from composer_prime.inference.engines.hf.copies import Copies

            self._copies = Copies(self.model_path, "cuda" if _cuda_available() else "cpu", self.max_model_len)
        return await asyncio.to_thread(self._copies.states, token_ids, start, weights, dtype or self.dtype)

    # ---- weights ----

    async def load_weights(self, path: str) -> None:
        """Swap in the weights of a step directory (config.json + *.safetensors), in place, or raise."""
        step_dir = Path(path).resolve()
        # Validate before the RPC: a reload that fails inside vLLM (missing files, a tensor of the wrong
        # name or shape) makes vLLM shut itself down. Refusing here keeps the old weights serving.
        # Dtypes may differ (bf16 checkpoint into an fp32 engine): vLLM casts on copy.
        shapes = _tensor_shapes(step_dir) if step_dir.is_dir() else {}
        if not shapes:
            raise FileNotFoundError(f"no *.safetensors in {step_dir}")
        if self._served_shapes and shapes != self._served_shapes:  # empty: served from a hub cache, unknown
            diff = sorted(set(shapes.items()) ^ set(self._served_shapes.items()))[:5]
            raise ValueError(f"{step_dir} does not match the served model's tensors (names/shapes), e.g. {diff}")
        try:
            await self._post(
                "/collective_rpc",
                json={
                    "method": "composer_reload_weights",
                    "kwargs": {"weights_path": str(step_dir)},
                    "timeout": RPC_TIMEOUT_S,
                },
            )
        except (RuntimeError, httpx.HTTPError) as e:
            raise RuntimeError(
                f"vLLM failed to reload {step_dir}; a failed reload shuts vLLM down, restart the engine "
                f"(log: {self.log_path}):\n{self.log_tail()}"
            ) from e
        # The prefix cache holds KV computed with the old weights; reusing it would mix two policies.
        # reset_running_requests preempts in-flight requests so they recompute their KV under the new weights.
        r = await self._post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        if not r.json().get("success", False):
            raise RuntimeError(f"vLLM could not reset its prefix cache after loading {step_dir}")
