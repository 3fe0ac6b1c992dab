"""Start an engine and serve it: the `inference` process."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from composer_prime.config import InferenceConfig
from composer_prime.inference.server import ServerState, build_app
from composer_prime.model.resolve import resolve_model
from composer_prime.transports import auth
from composer_prime.utils.proc import long_lived

log = logging.getLogger(__name__)


def make_engine(cfg: InferenceConfig, model_path: str):
    if cfg.resolved_engine() == "vllm":
        from composer_prime.inference.engines.vllm import VLLMEngine

        return VLLMEngine(model_path, cfg.model, port=cfg.port + 1000, max_model_len=cfg.max_model_len,
                          extra_args=cfg.vllm_args, log_path=str(cfg.output_dir / "logs" / "vllm.log"))
    from composer_prime.inference.engines.hf.engine import HFEngine

    return HFEngine(model_path, cfg.model, max_model_len=cfg.max_model_len, max_batch=cfg.max_batch, device=cfg.device,
                    dtype=cfg.dtype, graphs=cfg.graphs)


async def serve(cfg: InferenceConfig, token: str | None = None) -> None:
    base = resolve_model(cfg.model)
    engine = make_engine(cfg, base)
    await engine.start()
    state = ServerState(engine, base)
    if cfg.weights_path is not None:  # resume: serve the step the trainer will continue from
        await engine.load_weights(str(cfg.weights_path))
        state.version, state.weights_path = cfg.weight_version, str(cfg.weights_path)
    state.paths[state.version] = state.weights_path or base  # where these weights are, for an audit once they are not served
    log.info(f"{type(engine).__name__} serving {cfg.model} v{state.version} on http://{cfg.host}:{cfg.port}")
    server = uvicorn.Server(uvicorn.Config(build_app(state, token), host=cfg.host, port=cfg.port, log_level="warning"))
    follower = None
    if cfg.weight_broadcast.type == "shardcast":
        from composer_prime.contract.weights import Shardcast
        from composer_prime.transports.weights.shardcast.follow import follow

        wb = cfg.weight_broadcast
        follower = asyncio.create_task(follow(
            Shardcast(tuple(wb.servers), auth.public_key(wb.public_key)), base, cfg.output_dir / f"inference-{cfg.port}", lambda: state.version,
            state.load, keep=wb.keep_last))
        follower.add_done_callback(lambda t: setattr(server, "should_exit", True))  # it never ends unless it failed
    try:
        with long_lived():  # the engine, torch and the tokenizer: never collected, no longer walked either
            await server.serve()
    finally:
        if follower is not None:
            follower.cancel()
        await engine.stop()
    if follower is not None and follower.done() and not follower.cancelled() and follower.exception():
        raise follower.exception()
