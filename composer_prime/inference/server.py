"""The inference HTTP server: OpenAI-compatible routes plus what RL needs, over any engine.

Routes: /v1/models, /v1/completions, /v1/chat/completions (OpenAI shapes, with logprobs),
/inference/v1/generate (token ids in, token ids + one log-prob per token out: the route
verifiers' training client calls; `n` completions of one prompt in one request), /inference/v1/score (top-k next-token log-probs of a given
sequence: a teacher's distribution for distillation), /inference/v1/audit (a volunteer's completion
measured against this server's weights: TOPLOC proofs and sampling, verify/), /update_weights
(hot-load a step directory), /health (with `running`: what the engine runs, read from its objects).
Every response carries the serving weight version (header X-Weight-Version, and in JSON).
With a token, the routes that change state (/update_weights) want `Authorization: Bearer <token>`
and answer 401 without it; serve.py insists on one when the server listens beyond loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
import uuid
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator
from transformers import AutoTokenizer

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.audit import AuditAnswer, AuditRequest
from composer_prime.contract.inference import generate_answer
from composer_prime.inference.engines.base import Engine
from composer_prime.utils import watchdog
from composer_prime.utils.chat import encode_chat


class GenerateRequest(BaseModel):
    model: str | None = None
    token_ids: list[int]
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    n: int = Field(1, ge=1, le=1024, description="completions of this prompt; choice i samples with seed + i")

    @field_validator("sampling_params", mode="before")
    @classmethod
    def _sampling_only(cls, v: object) -> object:
        # verifiers' client also sends logprobs / skip_special_tokens: every answer has both anyway
        return {k: x for k, x in v.items() if k in SamplingParams.model_fields} if isinstance(v, dict) else v


class ScoreRequest(BaseModel):
    token_ids: list[int]
    start: int
    top_k: int
    temperature: float = 1.0


class UpdateWeights(BaseModel):
    path: str
    version: int


class ServerState:
    def __init__(self, engine: Engine, tokenizer_path: str, version: int = 0, weights_path: str | None = None) -> None:
        self.engine = engine
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.version = version
        self.weights_path = weights_path
        self.paths: dict[int, str] = {}  # every version loaded: where its step is (an audit of an older one reads it)
        self.update_lock = asyncio.Lock()
        self.stats = {"updates": 0, "failed_updates": 0, "requests": 0, "unauthorized": 0}

    async def load(self, path: str, version: int) -> None:
        """Hot-load a step directory: the one way weights change, whoever delivers them."""
        async with self.update_lock:
            t = time.time()
            try:
                await self.engine.load_weights(path)
            except Exception:
                self.stats["failed_updates"] += 1
                raise
            self.version, self.weights_path = version, path
            self.paths[version] = path
            self.stats["updates"] += 1
            watchdog.advanced("weights", version)
            self.stats["load_s"] = self.stats.get("load_s", 0.0) + time.time() - t  # incl. waiting for a decode to end


class VersionHeader:
    """Adds X-Weight-Version to every HTTP response. Plain ASGI: Starlette's `BaseHTTPMiddleware`
    (`@app.middleware("http")`) runs each request through a streamed response and a task group,
    which was a third of this server's per-request CPU at 128 concurrent requests."""

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def stamped(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-weight-version", str(self.state.version).encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


def running(engine: Engine) -> dict:
    """What the engine runs, read from its objects rather than from its config: the loaded weights'
    device and dtype, and how the decode step runs: "off" (op by op), "compile" (torch.compile'd; on
    CUDA then recorded) or "capture" (recorded CUDA graphs), with the graphs recorded so far. Empty for an
    engine that exposes neither (vLLM), and before the engine has loaded."""
    out: dict = {}
    model = getattr(engine, "model", None)
    if hasattr(model, "parameters"):  # a torch module (an engine may name its model by a string)
        params = list(model.parameters())
        out["device"] = ",".join(sorted({p.device.type for p in params}))
        out["dtype"] = ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))
    step = getattr(getattr(engine, "scheduler", None), "step", None)
    if step is not None:
        from composer_prime.inference.engines.hf.graphs import GraphedStep

        graphed = isinstance(step, GraphedStep)
        compiled = hasattr(step.step if graphed else step, "_torchdynamo_orig_callable")  # what torch.compile returns
        out["graphs"] = "compile" if compiled else "capture" if graphed else "off"
        out["graphs_recorded"] = len(step.graphs) if graphed else 0
    return out


def build_app(state: ServerState, token: str | None = None) -> FastAPI:
    """The routes over `state`; with `token`, control routes need it as a Bearer token."""
    app = FastAPI(title="composer-prime inference")
    tok = state.tokenizer
    expected = f"Bearer {token}".encode() if token else None

    def control(request: Request) -> None:
        if expected is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
            state.stats["unauthorized"] += 1
            raise HTTPException(status_code=401, detail="this route needs the run's token (Authorization: Bearer ...)",
                                headers={"WWW-Authenticate": "Bearer"})

    app.add_middleware(VersionHeader, state=state)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": state.engine.model_name, "dtype": getattr(state.engine, "dtype", None),
                "running": running(state.engine), "weight_version": state.version,
                "weights_path": state.weights_path, **state.stats}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.engine.model_name, "object": "model",
                                             "max_model_len": state.engine.max_model_len}]}

    @app.post("/update_weights", dependencies=[Depends(control)])
    async def update_weights(req: UpdateWeights) -> dict:
        try:
            await state.load(req.path, req.version)
        except Exception as e:  # noqa: BLE001 - a bad step is refused, the old weights keep serving
            raise HTTPException(status_code=400, detail=f"weights at {req.path} refused: {e}") from None
        return {"weight_version": state.version}

    async def call(method, *args):
        """An engine call stamped with the weight version in force when it was made; bad input is a 400."""
        state.stats["requests"] += 1
        version = state.version
        try:
            out = await method(*args)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        except NotImplementedError as e:
            raise HTTPException(status_code=501, detail=str(e)) from None
        out.weight_version = version
        return out

    async def run(prompt_ids: list[int], params: SamplingParams):
        return await call(state.engine.generate, prompt_ids, params)

    def openai_params(body: dict) -> SamplingParams:
        try:
            return SamplingParams.from_openai(body).or_eos(tok.eos_token_id)
        except ValueError as e:  # pydantic's: a temperature below 0, a top_p above 1 ...
            raise HTTPException(status_code=400, detail=str(e)) from None

    @app.post("/inference/v1/generate")
    async def generate(req: GenerateRequest) -> dict:
        """n choices, choice i exactly what a request with seed + i gets (no seed: each draws its own)."""
        params = req.sampling_params.or_eos(tok.eos_token_id)
        seeds = [None if params.seed is None else params.seed + i for i in range(req.n)]
        gens = await asyncio.gather(*(run(req.token_ids, params.model_copy(update={"seed": s})) for s in seeds))
        return {"request_id": uuid.uuid4().hex, **generate_answer(req.token_ids, list(gens))}

    @app.post("/inference/v1/score")
    async def score(req: ScoreRequest) -> dict:
        scores = await call(state.engine.score, req.token_ids, req.start, req.top_k, req.temperature)
        return dataclasses.asdict(scores)

    @app.post("/inference/v1/audit")
    async def audit(req: AuditRequest) -> dict:
        """Raw measurements of a volunteer's completion; the validator applies the thresholds."""
        from composer_prime.verify import sampling, toploc

        if len(req.logprobs) != len(req.token_ids) - req.prompt_len:
            raise HTTPException(status_code=400, detail="one log-prob per completion token")
        try:
            params = SamplingParams(**req.sampling_params)
        except ValueError as e:  # pydantic's ValidationError is one
            raise HTTPException(status_code=400, detail=f"sampling_params: {e}") from None
        version, served = state.version, getattr(state.engine, "dtype", None)
        dtype = req.dtype or served
        # the served model measures the served version in its dtype (an engine that can); else a copy of the
        # version's weights from disk (engines/hf/copies.py)
        in_place = req.weight_version == version and dtype == served and getattr(state.engine, "audits_in_place", False)
        copy = None if in_place else state.paths.get(req.weight_version)
        base = Path(getattr(state.engine, "model_path", "")).resolve()
        readable = copy is not None and (Path(copy).resolve() == base or Path(copy, "model.safetensors").exists())
        if not in_place and not readable:
            raise HTTPException(status_code=409, detail=f"serving v{version}; v{req.weight_version}'s step is not here")
        try:
            hidden, logits = await state.engine.states(req.token_ids, req.prompt_len, copy, dtype)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        except AttributeError:
            raise HTTPException(status_code=501, detail=f"{type(state.engine).__name__} exposes no hidden "
                                                        "states: audit with the embedded engine") from None
        if copy is None and state.version != version:  # the served weights changed under the prefill
            raise HTTPException(status_code=409, detail=f"serving v{state.version}, not v{req.weight_version}")
        try:
            chunks = toploc.measure(hidden, req.proofs)
        except toploc.ProofError as e:  # toploc is not installed here
            raise HTTPException(status_code=501, detail=str(e)) from None
        except (RuntimeError, ValueError) as e:  # toploc missing, or proofs it cannot parse
            raise HTTPException(status_code=422, detail=f"proofs not measurable: {e}") from None
        checked = sampling.check(logits, req.token_ids[req.prompt_len:], req.logprobs, params, req.seed)
        return AuditAnswer(weight_version=req.weight_version, dtype=dtype, chunks=[dataclasses.asdict(c) for c in chunks],
                           **dataclasses.asdict(checked)).model_dump()

    def openai_response(kind: str, gen, body: dict) -> JSONResponse:
        text = tok.decode([t for t in gen.token_ids if t not in (tok.eos_token_id,)], skip_special_tokens=True)
        choice = {"index": 0, "finish_reason": gen.finish_reason}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": tok.convert_ids_to_tokens(t), "token_id": t, "logprob": lp}
                                              for t, lp in zip(gen.token_ids, gen.logprobs)]}
        n_prompt, n_out = len(gen.prompt_token_ids), len(gen.token_ids)
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": state.engine.model_name, "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "weight_version": gen.weight_version,
        })

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(status_code=400, detail="streaming is not supported by the embedded engine")
        gen = await run(encode_chat(tok, body["messages"]), openai_params(body))
        return openai_response("chat", gen, body)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else tok.encode(prompt, add_special_tokens=False)
        gen = await run(ids, openai_params(body))
        return openai_response("text", gen, body)

    return app
