"""What `rl` starts: one resolved config per process, derived from one RLConfig.

Usually three processes. `inference_replicas = N` adds inference servers on consecutive ports
(the orchestrator spreads requests over all of them); with `[weight_broadcast] type =
"shardcast"` the trainer runs the SHARDCAST origin, `relays = K` starts K local relays, every
inference server pulls from the relays (or the origin when K = 0) and verifies each step
against the trainer's public key (`keys/trainer.ed25519.pub`). When a process listens beyond
loopback, all three get `auth.keys_dir = <output_dir>/keys` (transports/auth.py). Planning only
names key files: `rl` creates them when it launches (never for --dry-run), `composer-prime keys
make` for processes started by hand.

Cores: on a machine without a GPU, where no section sets `cpus`, one embedded-engine inference
server and one trainer rank each get their own half of the cores `rl` may use (the orchestrator
floats), so decoding and training overlap instead of taking turns: 0.52 -> 0.42 s a quickstart
step on 2 cores. With a GPU, vLLM (it binds its own threads), more replicas or ranks, or any
`cpus` given, nothing is pinned but what is asked.

DiLoCo islands (`[diloco]`, `plan_islands`): every island is such a plan of its own, in its own
directory and ports, plus torchft's lighthouse when `rl` starts every island itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from composer_prime.config.diloco import LighthouseConfig
from composer_prime.config.loader import ConfigError, alias, place_of
from composer_prime.config.links import AuthConfig, RelayConfig, WeightBroadcastConfig
from composer_prime.config.models import InferenceConfig
from composer_prime.config.rl import RLConfig
from composer_prime.transports.auth import is_loopback, zmq_host
from composer_prime.utils.proc import has_gpu


@dataclass
class Process:
    name: str  # "inference", "inference-1", "relay-0", ...: its config file and log are named after it
    entrypoint: str  # module under composer_prime.entrypoints
    config: BaseModel


def split_cores(cfg: RLConfig, engine: str, nproc: int) -> tuple[list[int], list[int]] | None:
    """(inference cores, trainer cores), or None where `rl` should not pin (see the module docstring)."""
    asked = any("cpus" in getattr(cfg, name) for name in ("inference", "orchestrator", "trainer"))
    cores = sorted(os.sched_getaffinity(0))
    if asked or engine != "hf" or has_gpu() or len(cores) < 2 or cfg.inference_replicas > 1 or nproc > 1:
        return None
    half = len(cores) // 2
    return cores[:half], cores[half:]


def plan(cfg: RLConfig, provenance: dict[str, str] | None = None, resume_from: tuple[int, Path] | None = None) -> list[Process]:
    """The processes; `provenance` gains where each process's keys were set, under its name."""
    provenance = {} if provenance is None else provenance
    inf, orch, trainer = cfg.split(provenance)
    if resume_from is not None:  # inference starts on the step the trainer continues from
        inf = inf.model_copy(update={"weight_version": resume_from[0], "weights_path": resume_from[1]})
    if cores := split_cores(cfg, inf.engine, trainer.nproc):
        inf, trainer = inf.model_copy(update={"cpus": cores[0]}), trainer.model_copy(update={"cpus": cores[1]})
    relays: list[RelayConfig] = []
    wb = trainer.weight_broadcast
    if not all(is_loopback(h) for h in (inf.host, zmq_host(trainer.transport.address))):
        keys = AuthConfig(keys_dir=Path(cfg.output_dir) / "keys")
        inf, orch, trainer = (c if c.auth.keys_dir else c.model_copy(update={"auth": keys}) for c in (inf, orch, trainer))
    if wb.type == "shardcast":
        if wb.keep_last < orch.max_async_level + 1:  # a node one async window behind must still find its step
            raise ConfigError(f"weight_broadcast.keep_last: {wb.keep_last} is below orchestrator.max_async_level + 1 "
                              f"= {orch.max_async_level + 1} ({place_of('trainer.weight_broadcast.keep_last', provenance)})")

        key_path = trainer.signing_key()
        public = str(key_path.with_name(key_path.name + ".pub"))  # written beside the key when it is made
        trainer = trainer.model_copy(update={"weight_broadcast": wb.model_copy(update={"key_path": key_path})})
        origin = f"http://{wb.host}:{wb.port}"
        relays = [RelayConfig(upstream=[origin], public_key=public, host=wb.host, port=wb.port + 1 + i,
                              data_dir=Path(cfg.output_dir) / f"relay-{i}", keep_last=wb.keep_last)
                  for i in range(cfg.relays)]
        servers = [f"http://{r.host}:{r.port}" for r in relays] or [origin]
        inf = InferenceConfig.model_validate({**inf.model_dump(), "weight_broadcast": WeightBroadcastConfig(
            type="shardcast", servers=servers, public_key=public, keep_last=wb.keep_last).model_dump()})
        if orch.volunteers.enabled and not orch.volunteers.relays:  # volunteers pull from the run's own relays
            orch = orch.model_copy(update={"volunteers": orch.volunteers.model_copy(
                update={"relays": servers, "public_key": public})})
    infs = [inf.model_copy(update={"port": inf.port + i}) for i in range(cfg.inference_replicas)]
    if len(infs) > 1:
        urls = [f"http://{i.host}:{i.port}" for i in infs]
        orch = orch.model_copy(update={"inference_urls": urls})
        trainer = trainer.model_copy(update={"inference_urls": urls})
    names = ["inference"] if len(infs) == 1 else [f"inference-{i}" for i in range(len(infs))]
    if len(names) > 1:  # replicas: port + i, all else as the section says
        for name in names:
            alias(provenance, "inference", name)
    for i in range(len(relays)):  # port + 1 + i, on the origin's host
        for key in ("host", "port"):
            alias(provenance, f"trainer.weight_broadcast.{key}", f"relay-{i}.{key}")
    return [*(Process(n, "inference", c) for n, c in zip(names, infs)),
            Process("trainer", "trainer", trainer),
            *(Process(f"relay-{i}", "relay", r) for i, r in enumerate(relays)),
            Process("orchestrator", "orchestrator", orch)]


ISLAND_PORTS = 10  # island k's ports: the first island's + 10 k (inference, batches, SHARDCAST and its relays)


def shifted(address: str, by: int) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + by}"


def plan_islands(cfg: RLConfig, provenance: dict[str, str] | None = None,
                 resume_of: Callable[[Path], tuple[int, Path] | None] | None = None) -> list[Process]:
    """DiLoCo islands (`[diloco]`): each island a whole `plan` of its own (processes named
    island<k>-<name>, output in <output_dir>/island<k>, ports shifted by ISLAND_PORTS k), its
    trainer one torchft replica, its orchestrator drawing from its own share of the tasks; and
    the lighthouse when every island runs here and none is named. `resume_of(island_dir)`: where
    that island resumes."""
    d = cfg.diloco
    lighthouse = d.lighthouse or f"127.0.0.1:{d.lighthouse_port}"
    out = [Process("lighthouse", "lighthouse", LighthouseConfig.of(d))] if d.island is None and d.lighthouse is None else []
    first, _, _ = cfg.split()
    for k in range(d.islands) if d.island is None else [d.island]:
        run, shift = Path(cfg.output_dir) / f"island{k}", ISLAND_PORTS * k
        island = cfg.model_copy(update={
            "output_dir": run, "diloco": None,
            "transport": cfg.transport.model_copy(update={"address": shifted(cfg.transport.address, shift)}),
            "weight_broadcast": cfg.weight_broadcast.model_copy(update={"port": cfg.weight_broadcast.port + shift}),
            "inference": {**cfg.inference, "port": first.port + shift},
            "orchestrator": {**cfg.orchestrator, "island": k, "islands": d.islands},
            "trainer": {**cfg.trainer, "diloco": d.model_copy(update={"island": k, "lighthouse": lighthouse}).model_dump()}})
        out += [Process(f"island{k}-{p.name}", p.entrypoint, p.config)
                for p in plan(island, provenance, resume_of(run) if resume_of else None)]
    return out
