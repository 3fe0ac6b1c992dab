"""Claude Code session JSONL (`~/.claude/projects/<project>/<session>.jsonl`) to `Step`s.

There is no official schema; what this reads is what the public parsers (claude-code-log,
ccusage) document and what real sessions contain:

- Entries form a tree through `uuid` / `parentUuid` (an edit or a resume starts a branch). Only
  the branch ending at the session's leaf is the session; entries on abandoned branches are
  counted and left out. The leaf is the last user or assistant message written, or the message
  a `summary` written after it names by `leafUuid` (a `leafUuid` naming nothing in the file is
  ignored): records of other types after the last message (a hook's, an unknown type's, with or
  without a parent) never are the leaf, or one of them would make the whole session abandoned.
- One API response is written as several lines, one content block each, sharing `message.id`:
  they are merged into one step.
- `isSidechain` entries (a sub-agent's work inside the main file) are skipped unless kept.
- Fake assistant rows for API errors (`isApiErrorMessage`, model `<synthetic>`) are dropped.
- `thinking` blocks stay in the step's action, never in the history shown to teachers.
- `tool_result` blocks keep `is_error`: a step whose call came back an error is marked.
- `summary`, `system` (incl. `compact_boundary`), `file-history-snapshot` and any type not
  known here are counted and skipped (they stay in the tree: children point through them). A
  compaction boundary continues its `logicalParentUuid`; steps after it saw only the summary.
- An image block becomes the placeholder "[image]". A line that is truncated or not UTF-8 is
  counted and skipped, never fatal. A `version` outside the tested range is a warning.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from composer_prime.traces.record import Step, action, assistant_message, tool_call

TESTED = ((1, 0), (2, 1))  # Claude Code versions (major, minor) whose sessions this was tried on
IMAGE = "[image]"
MESSAGES = ("user", "assistant")  # the conversation's own records; every other type is counted and skipped


def _version_ok(v: str) -> bool:
    try:
        major_minor = tuple(int(x) for x in v.split(".")[:2])
    except ValueError:
        return False
    return TESTED[0] <= major_minor <= TESTED[1]


def _text(content: object) -> str:
    """A tool result's or message's content (a string or a list of blocks) as text."""
    if isinstance(content, str):
        return content
    parts = []
    for b in content or []:
        if isinstance(b, dict) and b.get("type") == "text":
            parts.append(b.get("text", ""))
        elif isinstance(b, dict) and b.get("type") == "image":
            parts.append(IMAGE)
    return "\n".join(parts)


def read_entries(path: Path, counts: Counter) -> list[tuple[int, dict]]:
    """(line number, entry) of every line that parses; the others are counted by reason."""
    out = []
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            counts["skipped/not_utf8"] += 1
            continue
        except json.JSONDecodeError:
            counts["skipped/truncated"] += 1
            continue
        if not isinstance(entry, dict):
            counts["skipped/truncated"] += 1
            continue
        counts["records"] += 1
        out.append((n, entry))
    return out


def leaf_branch(entries: list[tuple[int, dict]], sidechain: bool) -> list[tuple[int, dict]]:
    """The entries from the root to the leaf of the main session, or of the sidechain (a
    sub-agent's work inside the file), in order. The leaf: the last message written, where a
    `summary` stands for the message its `leafUuid` names."""
    by_uuid = {e["uuid"]: (n, e) for n, e in entries if e.get("uuid")}

    def message(node: tuple[int, dict] | None) -> bool:
        return node is not None and node[1].get("type") in MESSAGES and bool(node[1].get("isSidechain")) == sidechain

    candidates = [by_uuid.get(e.get("leafUuid")) if e.get("type") == "summary" else (n, e) for n, e in entries]
    candidates = [c for c in candidates if message(c)]
    path, seen, node = [], set(), candidates[-1] if candidates else None
    while node is not None and node[1]["uuid"] not in seen and bool(node[1].get("isSidechain")) == sidechain:
        seen.add(node[1]["uuid"])
        path.append(node)
        e = node[1]  # a compaction boundary is a root that remembers what it continues (logicalParentUuid)
        node = by_uuid.get(e.get("parentUuid") or e.get("logicalParentUuid"))
    return path[::-1]


def parse(path: Path, keep_sidechains: bool = False) -> tuple[list[Step], Counter, list[str]]:
    """Steps of one session file (and of its sidechain, kept as its own trace), counts, warnings."""
    counts: Counter = Counter()
    warnings: list[str] = []
    entries = read_entries(path, counts)
    versions = sorted({e["version"] for _, e in entries if isinstance(e.get("version"), str)})
    if bad := [v for v in versions if not _version_ok(v)]:
        warnings.append(f"{path.name}: Claude Code version {', '.join(bad)} is outside the tested "
                        f"{TESTED[0][0]}.{TESTED[0][1]}-{TESTED[1][0]}.{TESTED[1][1]}; read it as the tested ones")
    for _, e in entries:
        if e.get("type") not in MESSAGES:
            counts[f"skipped/{e.get('type') or 'untyped'}"] += 1
    branches = [leaf_branch(entries, sidechain=False)] + ([leaf_branch(entries, sidechain=True)] if keep_sidechains else [])
    kept = {e["uuid"] for b in branches for _, e in b}
    for _, e in entries:
        if e.get("type") in MESSAGES and e.get("uuid") not in kept:
            counts["skipped/sidechain" if e.get("isSidechain") and not keep_sidechains else "skipped/abandoned_branch"] += 1
    steps = [s for b in branches for s in _steps(b, path, counts)]
    counts["steps"] = len(steps)
    return steps, counts, warnings


def _steps(branch: list[tuple[int, dict]], path: Path, counts: Counter) -> list[Step]:
    """One step per assistant turn of the branch (its lines merged by message id)."""
    messages: list[dict] = []
    steps: list[Step] = []
    open_calls: dict[str, Step] = {}  # tool_use id -> the step that made the call
    turn: tuple[str, int, dict, dict] | None = None  # message id, first line, the merged action, meta

    def close_turn() -> None:
        nonlocal turn
        if turn is None:
            return
        _, line, act, meta = turn
        step = Step(id=f"{path.name}:{line}", messages=list(messages), action=act, source=str(path), line=line, meta=meta)
        steps.append(step)
        messages.append(assistant_message(act))
        for call in act["tool_calls"]:
            open_calls[call["id"]] = step
        turn = None

    for line, e in branch:
        kind, msg = e.get("type"), e.get("message") or {}
        if kind == "system" and e.get("subtype") == "compact_boundary":
            close_turn()
            messages = []  # the context was replaced by the summary that follows: later steps saw only that
        elif kind == "assistant":
            if e.get("isApiErrorMessage") or msg.get("model") == "<synthetic>":
                counts["skipped/api_error"] += 1
                continue
            if turn is not None and msg.get("id") and msg.get("id") == turn[0]:
                act = turn[2]
                counts["merged_lines"] += 1
            else:
                close_turn()
                act = action("", [])
                turn = (msg.get("id"), line, act, {"model": msg.get("model"), "session": e.get("sessionId")})
            for b in msg.get("content") or []:
                if b.get("type") == "text":
                    act["content"] = "\n".join(x for x in (act["content"], b.get("text", "")) if x)
                elif b.get("type") == "thinking":
                    act["thinking"] = "\n".join(x for x in (act["thinking"], b.get("thinking", "")) if x)
                elif b.get("type") == "tool_use":
                    act["tool_calls"].append(tool_call(b.get("id", ""), b.get("name", ""), b.get("input") or {}))
        elif kind == "user":
            close_turn()
            content = msg.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
            texts = []
            for b in blocks:
                if b.get("type") == "tool_result":
                    messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": _text(b.get("content"))})
                    if (maker := open_calls.get(b.get("tool_use_id", ""))) is not None:
                        maker.error = bool(maker.error) or bool(b.get("is_error"))
                elif b.get("type") == "image":
                    texts.append(IMAGE)
                elif b.get("type") == "text":
                    texts.append(b.get("text", ""))
            if texts:
                messages.append({"role": "user", "content": "\n".join(texts)})
    close_turn()
    return steps
