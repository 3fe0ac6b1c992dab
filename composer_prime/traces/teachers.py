"""Teachers for trace replay: OpenAI-compatible chat endpoints, their prices, and one call each.

A teachers file (TOML) lists them; our own `uv run inference` serving any checkpoint is one:

    [[teachers]]
    name = "big"                      # how pairs and the ledger name it
    base_url = "http://127.0.0.1:8000/v1"
    model = "tiny"
    api_key_env = "BIG_API_KEY"       # the key is read from this variable (never from the file)
    price_in = 0.15                   # dollars per million input tokens
    price_out = 0.60                  # ... output tokens
    concurrency = 4
    timeout_s = 60
    retries = 3                       # after the first try, with back-off 0.5 s, 1 s, 2 s ...

`ask` sends the step's history and tools and returns the proposed action with its token usage,
or raises TeacherError once the retries are spent (timeouts, HTTP errors, answers that are not
a chat completion): the replay counts that and goes on without this teacher's vote.
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from composer_prime.traces.record import Step, action, tool_call


class TeacherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    api_key_env: str | None = None
    price_in: float = Field(0.0, ge=0)
    price_out: float = Field(0.0, ge=0)
    concurrency: int = Field(4, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    retries: int = Field(3, ge=0)


class TeachersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    teachers: list[TeacherConfig] = Field(min_length=1)
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0)


class TeacherError(Exception):
    pass


def load_teachers(path: Path) -> TeachersFile:
    """The file, validated; ValueError with one line naming what is wrong."""
    try:
        cfg = TeachersFile.model_validate(tomllib.loads(path.read_text()))
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not TOML ({e})") from None
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    names = [t.name for t in cfg.teachers]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: teacher names must be unique, got {names}")
    for t in cfg.teachers:
        if t.api_key_env and not os.environ.get(t.api_key_env):
            raise ValueError(f"{path}: teacher {t.name}: environment variable {t.api_key_env} is not set")
    return cfg


@dataclass
class Answer:
    action: dict
    tokens_in: int
    tokens_out: int


class Teacher:
    def __init__(self, cfg: TeacherConfig, http: httpx.AsyncClient, max_tokens: int, temperature: float) -> None:
        self.cfg, self.http = cfg, http
        self.sem = asyncio.Semaphore(cfg.concurrency)
        self.sampling = {"max_tokens": max_tokens, "temperature": temperature}
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.cfg.price_in + tokens_out * self.cfg.price_out) / 1e6

    async def ask(self, step: Step) -> Answer:
        body = {"model": self.cfg.model, "messages": step.messages, **self.sampling}
        if step.tools:
            body["tools"] = step.tools
        url = self.cfg.base_url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
            try:
                async with self.sem:
                    r = await self.http.post(url, json=body, headers=self.headers, timeout=self.cfg.timeout_s)
                r.raise_for_status()
                return parse_answer(r.json())
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                last = f"{type(e).__name__}: {str(e)[:120]}"
        raise TeacherError(f"{self.cfg.name}: no answer after {self.cfg.retries + 1} tries ({last})")


def parse_answer(body: dict) -> Answer:
    """An OpenAI chat completion's first choice as an action (KeyError/TypeError when it is not one)."""
    msg = body["choices"][0]["message"]
    calls = [tool_call(c.get("id", ""), c["function"]["name"], c["function"].get("arguments") or "{}")
             for c in msg.get("tool_calls") or []]
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("message content is not a string")
    usage = body.get("usage") or {}
    return Answer(action(content or "", calls, msg.get("reasoning_content") or ""),
                  int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
