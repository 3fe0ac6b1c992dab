"""The validator's calibration (benchmarks/volunteers.py --result calibration): per model and dtype, an honest
worker and every red-team cheat answer leases from the real pool, whose validator audits each on a trusted
server; every audit's raw measurements are kept beside its verdict. Split from volunteers.py, which runs
it, prints its table and writes its JSON; the cheats are tests/support/volunteers.py's."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from replay_ab import serving

from composer_prime.model.resolve import resolve_model
from composer_prime.utils.progress import Progress
from composer_prime.volunteer.worker import Worker
from tests.support import volunteers as V


CHEATS = {  # name: (class, attributes)
    "another model": (V.OtherWeights, {"scale": 1.0}),
    "weights 1e-2": (V.OtherWeights, {"scale": 1e-2}),
    "weights 1e-3": (V.OtherWeights, {"scale": 1e-3}),
    "tampered token": (V.TamperedTokens, {}),
    "picked tokens": (V.PicksTokens, {}),
    "changed prompt token": (V.ChangedPrompt, {}),
    "claimed log-probs": (V.WrongLogprobs, {}),
    "replayed proofs": (V.Proofs, {"edit": None}),
    "one step behind": (V.OldWeights, {}),  # still v0, the model one trainer step before the leased v1
    "cut short": (V.CutsShort, {}),  # the first half of its honest completion, all honest
    "past its stop token": (V.RunsPastStop, {}),  # the seeded draws continued to max_tokens
    "a version never leased": (V.ClaimsNewerVersion, {}),
}
SENTENCES = ["the quick brown fox jumps over the lazy dog", "a journey of a thousand miles begins with one step",
             "all that glitters is not gold", "to be or not to be, that is the question",
             "the early bird catches the worm", "time flies like an arrow; fruit flies like a banana",
             "practice makes perfect", "where there is smoke there is fire"]


def prompts(model: str, n: int) -> tuple[list[list[int]], int]:
    """n chat prompts, and the end of sequence every lease stops at (as a run's rollouts do)."""
    from transformers import AutoTokenizer

    from composer_prime.utils.chat import encode_chat

    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    return [encode_chat(tok, [{"role": "user", "content": f"Repeat this back, then reverse it ({i}): "
                                                        f"{SENTENCES[i % len(SENTENCES)]}"}]) for i in range(n)], tok.eos_token_id


def raw(m: dict) -> dict:
    """One audit's measurements, each the worst over the completion's chunks."""
    return {"exp_mismatches": max(c["exp_mismatches"] for c in m["chunks"]),
            "mant_err_mean": max(c["mant_err_mean"] for c in m["chunks"]),
            "mant_err_median": max(c["mant_err_median"] for c in m["chunks"]),
            "logprob_max_err": m["logprob_max_err"], "max_draw_distance": m["max_draw_distance"],
            "min_pvalue": m["min_pvalue"], "surprisal_z": m["surprisal_z"]}


async def answers(client, pool, worker: Worker, ps: list[list[int]], seed0: int, audits: dict,
                  eos: int) -> list[tuple[str, dict, bool]]:
    """(verdict, raw measurements or {}, how many stop tokens it holds) per prompt,
    8 leases in flight at once; `audits` holds each audit's answer by the seed it was asked for (the
    leases' seeds are distinct)."""
    sem = asyncio.Semaphore(8)

    async def one(i: int, p: list[int]):
        async with sem:
            lease, sub, verdict = await V.lease_once(client, pool, worker, p, seed0 + i, 64, (eos,))
            m = audits.get(seed0 + i) or {}
            return verdict, (raw(m) if "chunks" in m else {}), sub.token_ids.count(eos)
    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(ps))))


def calibrate(model: str, dtype: str, honest: int, cheats: int, work: Path, progress: Progress, isa: str = "",
              served: str = "", engine: str = "hf", draws: str = "seeded", device: str = "cpu") -> dict:
    import httpx

    work.mkdir(parents=True, exist_ok=True)
    ps, eos = prompts(model, max(honest, cheats))
    env = {"ONEDNN_MAX_CPU_ISA": isa} if isa else None
    # v1 in the run's weights directory (pool_run's, where the pool tells workers to pull from)
    v1 = V.one_step(Path(resolve_model(model)), work / "run" / "weights", SENTENCES)
    with serving({"trusted": Path(resolve_model(model))}, work, ("--dtype", served or dtype, "--device", device), env) as urls:
        httpx.post(f"{urls['trusted']}/update_weights", json={"path": str(v1), "version": 1}, timeout=600).raise_for_status()
        async def go() -> dict:
            # the shipped beat (2 s, dead after 3 missed): a vLLM worker starting takes this machine's cores
            async with V.pool_run(urls["trusted"], model, work / "run", eject_after=10**9, lease_s=900.0,
                                  dtype=dtype, heartbeat_s=2.0, samplers=["seeded", "any"]) as (client, pool):
                validator = pool.validator
                audits: dict = {}
                real = validator.audit

                async def spy(body):
                    m = await real(body)
                    audits[body.seed] = m.model_dump() if m else {}
                    return m
                validator.audit = spy
                out = {}
                for name, (cls, attrs) in {"honest": (Worker, {}), **CHEATS}.items():
                    w = V.make_worker(cls, pool, work, name.replace(" ", "-"), dtype="auto", max_model_len=1024,
                                      engine=engine, draws=draws, device=device)
                    for k, v in attrs.items():
                        setattr(w, k, v)
                    async with V.working(w):
                        if name == "replayed proofs":  # another rollout's proofs, as many as each answer needs
                            kept: list = []
                            w.edit = lambda proofs: kept.append(proofs) or proofs
                            await V.lease_once(client, pool, w, ps[-1], 2**40, 64, (eos,))
                            w.edit = lambda proofs: (kept[0] * len(proofs))[:len(proofs)]
                        n = honest if name == "honest" else cheats
                        out[name] = await answers(client, pool, w, ps[:n], 10**6 * len(out), audits, eos)
                    progress.advance(1, note=f"{model} {dtype} {name}: {dict(Counter(v or 'passed' for v, *_ in out[name]))}")
                return out
        return asyncio.run(go())


def as_drawn(name: str, verdict: str, m: dict, stops: int) -> bool:
    """A cheat's answer that is exactly what an honest worker sends, so accepted and no false accept: picked
    tokens whose every token is the lease's seeded draw (draw distance 0: the likeliest tokens were the
    draws; log-probs and proofs rebuilt honestly); a completion cut short whose honest draw had stopped
    within the cut, or one drawn past its stop token that never drew one (`stops`: its stop tokens; the
    validator accepts one only at the end)."""
    if verdict != "":
        return False
    return ((name == "picked tokens" and m.get("max_draw_distance") == 0.0) or (name == "cut short" and stops == 1)
            or (name == "past its stop token" and stops == 0))


def summarise(got: dict) -> dict:
    fields = ("exp_mismatches", "mant_err_mean", "mant_err_median", "logprob_max_err", "max_draw_distance")
    low = ("min_pvalue", "surprisal_z")  # the statistics reject low values: their honest worst is the least
    honest = [m for _, m, _ in got["honest"] if m]
    return {"honest": {"n": len(got["honest"]), "false_rejects": sum(v != "" for v, _, _ in got["honest"]),
                       "verdicts": dict(Counter(v for v, _, _ in got["honest"])),
                       "max": {f: max((m[f] for m in honest), default=None) for f in fields},
                       "min": {f: min((m[f] for m in honest), default=None) for f in low}},
            "audits": {name: [{**m, "verdict": v} for v, m, _ in rows] for name, rows in got.items()},  # to judge other thresholds by
            "cheats": {name: {"n": len(rows), "as_drawn": sum(as_drawn(name, v, m, w) for v, m, w in rows),
                              "false_accepts": sum(v == "" and not as_drawn(name, v, m, w) for v, m, w in rows),
                              "verdicts": dict(Counter(v for v, _, _ in rows)),
                              "min": {f: min((m[f] for _, m, _ in rows if m), default=None) for f in fields}}
                       for name, rows in got.items() if name != "honest"}}
