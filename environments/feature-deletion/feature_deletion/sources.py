"""Build one task set from many sources: a file of `pypi:name==version` lines (directories and
sdists too), built in parallel within the machine's cores, resumable after a crash, one index.

    # comment
    pypi:inflection==0.5.1
    pypi:python-dateutil==2.9.0.post0  pytz      # more requirements for its test environment
    ./vendor/mylib

    <out>/build.json                  the build's settings: a resume must use the same ones
    <out>/sources/<slug>/             a complete single-source task set (generate.build), own testenv
    <out>/sources/<slug>.build.log    its build log, whatever happened
    <out>/sources/<slug>.error.json   why it failed (not retried on resume without retry_failed)
    <out>/manifest.json               the index: every finished source's tasks, rewritten after each

A source whose set is complete (its manifest.json exists) is never built again. Sources build in
worker processes (`jobs` cores in all: up to `jobs` sources at once, the rest of the cores
checking one source's candidates in parallel).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from feature_deletion import taskdir
from feature_deletion.baseline import BuildError
from feature_deletion.buildlog import Counted, stderr, uncounted
from feature_deletion.candidates import Settings

INDEX_FORMAT = "index"


@dataclass
class Source:
    source: str
    deps: list[str] = field(default_factory=list)
    line: int = 0

    @property
    def slug(self) -> str:
        text = self.source[5:].replace("==", "-") if self.source.startswith("pypi:") else Path(self.source).name
        text = re.sub(r"\.(tar\.gz|tgz|tar\.bz2|tar\.xz|tar|zip)$", "", text)
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or f"source{self.line}"


def parse_sources(path: Path) -> list[Source]:
    """The sources of a list file; BuildError naming the line for anything malformed."""
    if not path.is_file():
        raise BuildError(f"sources file not found: {path}")
    out, slugs = [], {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        src = Source(words[0], words[1:], n)
        if src.source.startswith("pypi:"):
            if not re.fullmatch(r"pypi:[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", src.source):
                raise BuildError(f"{path}:{n}: a pypi source pins one version, e.g. pypi:inflection==0.5.1 "
                                 f"(got {src.source})")
        else:
            p = Path(src.source).expanduser()
            if not p.is_absolute():  # relative to the list file, wherever the command runs
                src.source = str((path.parent / p).resolve())
            if not Path(src.source).exists():
                raise BuildError(f"{path}:{n}: source not found: {words[0]}")
        if src.slug in slugs:
            raise BuildError(f"{path}:{n}: {words[0]} repeats the source of line {slugs[src.slug]}")
        slugs[src.slug] = n
        out.append(src)
    if not out:
        raise BuildError(f"{path} lists no sources")
    return out


def _build_one(src: Source, out: Path, seed: int, max_tasks: int | None, variant: str, jobs: int,
               settings: Settings) -> dict:
    """In a worker process: build one source's set; a failure is recorded, never raised."""
    from feature_deletion.generate import build

    dest = out / "sources" / src.slug
    prefix = f"[{src.slug}] "
    s = Settings(**{**asdict(settings), "deps": [*settings.deps, *src.deps]})
    try:
        build(src.source, dest, seed=seed, max_tasks=max_tasks, variant=variant, force=True, jobs=jobs,
              settings=s, log=lambda m: stderr(prefix + m))
        return {"slug": src.slug, "ok": True}
    except BuildError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - one source's bug must not stop the others
        error = f"crashed: {type(e).__name__}: {e}"
    (out / "sources" / f"{src.slug}.error.json").write_text(taskdir.dump({"source": src.source, "error": error}))
    stderr(f"{prefix}failed: {error}")
    return {"slug": src.slug, "ok": False}


def _entry(src: Source, out: Path) -> tuple[dict, list[dict]]:
    d = out / "sources" / src.slug
    entry = {"source": src.source, "slug": src.slug, "dir": f"sources/{src.slug}",
             "log": f"sources/{src.slug}.build.log"}
    if (d / taskdir.MANIFEST).is_file():
        m = json.loads((d / taskdir.MANIFEST).read_text())
        tasks = [{"id": f"{src.slug}/{t['id']}", "dir": f"sources/{src.slug}/tasks/{t['id']}", "source": src.source,
                  "file": t["file"], "qualname": t["qualname"], "n_tests": t["n_tests"]} for t in m["tasks"]]
        return {**entry, "status": "ok", "accepted": len(tasks), "report": m["report"]}, tasks
    err = out / "sources" / f"{src.slug}.error.json"
    if err.is_file():
        return {**entry, "status": "failed", "error": json.loads(err.read_text())["error"]}, []
    return {**entry, "status": "pending"}, []


def write_index(sources: list[Source], out: Path, args: dict) -> dict:
    entries, tasks = [], []
    for src in sources:
        e, t = _entry(src, out)
        entries.append(e)
        tasks += t
    index = {"format": 1, "env": "feature-deletion", "kind": INDEX_FORMAT, **args, "sources": entries, "tasks": tasks}
    tmp = out / f".{taskdir.MANIFEST}.tmp"
    tmp.write_text(taskdir.dump(index))
    tmp.replace(out / taskdir.MANIFEST)  # atomic: a crash leaves the previous index whole
    return index


def build_many(sources: list[Source], out: Path, seed: int = 0, max_tasks: int | None = None, variant: str = "body",
               jobs: int | None = None, settings: Settings | None = None, force: bool = False,
               retry_failed: bool = False, log: Callable[[str], None] = stderr, progress: Counted = uncounted) -> dict:
    """Build every source not built yet into `out` and return the index; `progress` is told
    (sources built, sources to build) as they finish."""
    s = settings or Settings()
    out = Path(out).resolve()
    args = {"seed": seed, "max_tasks": max_tasks, "variant": variant, "settings": asdict(s)}
    if force and out.exists():
        shutil.rmtree(out)
    if out.is_dir() and any(out.iterdir()) and not (out / "build.json").is_file():
        raise BuildError(f"--out is not empty and holds no list build: {out} (pass --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources").mkdir(exist_ok=True)
    with open(out / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"another build is writing {out}") from None
        _check_args(out, args, force)
        for stale in (out / "sources").glob(".*.partial-*"):  # left by a build that crashed
            shutil.rmtree(stale, ignore_errors=True)
        if retry_failed:
            for err in (out / "sources").glob("*.error.json"):
                err.unlink()
        todo = [x for x in sources if _entry(x, out)[0]["status"] == "pending"]
        done = len(sources) - len(todo)
        log(f"{len(sources)} sources: {done} already finished, {len(todo)} to build")
        cores = jobs or len(os.sched_getaffinity(0))
        parallel = max(1, min(cores, len(todo)))
        per_source = max(1, cores // parallel)
        write_index(sources, out, args)
        progress(0, len(todo))
        if todo:
            ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
            with ProcessPoolExecutor(parallel, mp_context=ctx) as pool:
                futures = [pool.submit(_build_one, x, out, seed, max_tasks, variant, per_source, s) for x in todo]
                for built, fut in enumerate(as_completed(futures), 1):
                    fut.result()
                    write_index(sources, out, args)
                    progress(built, len(todo))
        return write_index(sources, out, args)


def _check_args(out: Path, args: dict, force: bool) -> None:
    path = out / "build.json"
    if path.is_file() and not force:
        before = json.loads(path.read_text())
        if before != json.loads(json.dumps(args)):
            diff = sorted(k for k in args if before.get(k) != json.loads(json.dumps(args))[k])
            raise BuildError(f"{out} was built with other settings ({', '.join(diff)} differ): "
                             "use the same ones to resume, or --force to start over")
    path.write_text(taskdir.dump(args))
