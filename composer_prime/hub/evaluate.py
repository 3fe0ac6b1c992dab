"""Evaluate an environment against a running OpenAI-compatible server (ours or any other).

Prompts, the episode (tool session, conversation loop, scoring) are the environment runtime's,
the same the orchestrator's rollouts run (`env_runtime.episode.run_episode`); only generation
differs: turns come from `/v1/chat/completions` as messages instead of the token route as ids.
Scoring runs in a `CallBox` under a time limit (env_runtime/calls.py): a reward that never returns
ends the command in one line naming the task and the place it hung.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from composer_prime.config.sampling import SamplingParams
from composer_prime.env_runtime.calls import CallBox
from composer_prime.env_runtime.episode import TURN_SEED_STRIDE, EpisodeFault, run_episode
from composer_prime.env_runtime.tasksets import messages
from composer_prime.env_runtime.turns import Turn
from composer_prime.hub.errors import ToolError


def chat_url(url: str) -> str:
    base = url.rstrip("/").removesuffix("/chat/completions").removesuffix("/v1")
    if not base.startswith(("http://", "https://")):
        raise ToolError(f"--url must be an http(s) URL, got {url!r}")
    return f"{base}/v1/chat/completions"


async def _chat(http: httpx.AsyncClient, url: str, payload: dict, sem: asyncio.Semaphore) -> tuple[str, str, dict]:
    """(reply, finish_reason, response body) of one chat completion."""
    async with sem:
        try:
            r = await http.post(url, json=payload)
        except httpx.HTTPError as e:
            raise ToolError(f"inference server unreachable at {url}: {type(e).__name__}: {e}") from None
    if r.status_code >= 400:
        raise ToolError(f"inference server answered {r.status_code}: {r.text[:200]}")
    try:
        body = r.json()
        choice = body["choices"][0]
        return choice["message"].get("content") or "", choice.get("finish_reason") or "", body
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ToolError(f"{url} did not answer with an OpenAI chat completion: {r.text[:200]}") from None


class ChatTurns:
    """Turns sampled as chat messages; turn k of task i is seeded seed + i + k * stride."""

    def __init__(self, http: httpx.AsyncClient, url: str, i: int, prompt: list[dict], model: str, sampling: SamplingParams,
                 sem: asyncio.Semaphore) -> None:
        self.http, self.url, self.i, self.model, self.sampling, self.sem = http, url, i, model, sampling, sem
        self.history, self.usage, self.last = list(prompt), 0, {}

    async def sample(self, k: int) -> Turn:
        s = self.sampling  # OpenAI's own fields only: a hosted server refuses others (stop_token_ids is vLLM's)
        payload = {"model": self.model, "messages": self.history, "max_tokens": s.max_tokens, "temperature": s.temperature,
                   "top_p": s.top_p, "seed": (s.seed or 0) + self.i + k * TURN_SEED_STRIDE}
        reply, finish, self.last = await _chat(self.http, self.url, payload, self.sem)
        self.usage += (self.last.get("usage") or {}).get("completion_tokens", 0)
        return Turn(reply, finish)

    def add_tool_reply(self, turn: Turn, message: dict) -> None:
        self.history.extend([{"role": "assistant", "content": turn.text}, message])


async def _episode(http: httpx.AsyncClient, url: str, i: int, task, model: str, sampling: SamplingParams, max_turns: int,
                   sem: asyncio.Semaphore, box: CallBox | None = None) -> dict:
    prompt = messages(task)
    chat = ChatTurns(http, url, i, prompt, model, sampling, sem)
    try:
        ep = await run_episode(task, chat, max_turns, box=box)
    except EpisodeFault as e:  # the environment failed the episode (its reward hung past the box's time)
        raise ToolError(f"episode {i}: {e}") from None
    return {"index": i, "task_id": task.data.id or task.data.name, "prompt": prompt, "reply": ep.reply,
            "reward": ep.reward, "metrics": ep.metrics,
            "finish_reason": ep.turns[-1].finish_reason if ep.turns else "",
            "turns": [{"reply": t.text, "tool_call": t.call.name if t.call else None, "tool_result": t.result}
                      for t in ep.turns] if ep.multi_turn else None,
            "completion_tokens": chat.usage, "weight_version": chat.last.get("weight_version")}


async def evaluate(tasks: list, url: str, model: str, max_tokens: int = 64, temperature: float = 0.0,
                   seed: int = 0, concurrency: int = 8, api_key: str | None = None, max_turns: int = 8,
                   timeout_s: float = 300.0, box: CallBox | None = None) -> list[dict]:
    """One episode per task against the server at `url`, `concurrency` at a time; scoring in `box`."""
    endpoint = chat_url(url)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(max(1, concurrency))
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
        return list(await asyncio.gather(*(_episode(http, endpoint, i, t, model, sampling, max_turns, sem, box)
                                           for i, t in enumerate(tasks))))


def write_rows(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path
