"""The bases every config model is built from: strict models, the keys all processes share,
per-process pinning, and `Sections` (a model whose extra keys are plug-ins' own sections).

Kept apart from the process configs (config/models.py) so a plug-in's config can build on them
without importing every process's settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Iterable

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import InitErrorDetails

from composer_prime.utils import plugins

# A list given as "a,b" on the command line or as a TOML array.
CommaList = Annotated[list[str], BeforeValidator(lambda v: [x for x in v.split(",") if x] if isinstance(v, str) else v)]
Port = Annotated[int, Field(ge=1, le=65535)]


class FieldError(ValueError):
    """A model's own check failing on one key below the model (`key`, dotted, relative to it): the
    config error names that key and where it was set, not the whole section (config/loader.py)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Shared(Strict):
    """Keys every process reads; `rl` fills them in from the top level."""

    model: str = Field("tiny", description='"tiny" (built offline), "smollm2-135m", a local directory, a GGUF '
                                           "file (converted once) or a Hugging Face id")
    seq_len: int = Field(512, ge=2, description="longest sequence (prompt + completion) in tokens")
    max_steps: int = Field(20, ge=1, description="trainer steps in the run")
    output_dir: Path = Field(Path("outputs/run"), description="run directory: configs, logs, metrics, checkpoints, "
                                                              "weights")
    seed: int = Field(0, ge=0, description="seeds task choice, sampling and the model's initialisation")


class Pinned(Strict):
    """Per process, never shared: `rl` passes each section's own value."""

    cpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list,
                                                    description="pin this process to these cores; [] = all")


class Sections(Strict):
    """A model whose extra keys are plug-ins' own sections: the plug-ins are the entry points of
    `GROUP` plus the "module:Class" refs in `plugins`; each section is validated by the `Config`
    its class declares (and defaults when absent). Any other extra key is an unknown key."""

    model_config = ConfigDict(extra="allow")
    GROUP: ClassVar[str]
    KIND: ClassVar[str]  # what a plug-in is called in errors
    _classes: dict[str, type] = PrivateAttr(default_factory=dict)
    plugins: list[str] = Field(default_factory=list, description='plug-ins outside the package, "module:Class"')

    def _load_sections(self, named: Iterable[str] = (), field: str = "") -> None:
        """Validate the sections; `named`: names used elsewhere in the model (the keys of `field`)
        that must be plug-ins."""
        if not self.plugins:  # names first, from metadata: a typo fails before the plug-ins' imports (torch: seconds)
            self._check_names(plugins.names(self.GROUP), named, field)
        try:
            classes = plugins.load(self.GROUP, self.plugins)
        except ValueError as e:
            raise FieldError("plugins", str(e)) from None
        self._check_names(set(classes), named, field)
        extra = self.__pydantic_extra__
        errors = []
        for name, cls in classes.items():
            try:
                extra[name] = cls.Config.model_validate(extra.get(name, {}))
            except ValidationError as e:  # re-raised with the plug-in's name in each location
                errors += [InitErrorDetails(type=x["type"], loc=(name, *x["loc"]), input=x["input"], ctx=x.get("ctx", {}))
                           for x in e.errors()]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        self._classes = classes

    def _check_names(self, known: set[str], named: Iterable[str], field: str) -> None:
        for name in named:
            if name not in known:
                raise FieldError(f"{field}.{name}", f"unknown {self.KIND} '{name}' (known: {', '.join(sorted(known))})")
        if unknown := [k for k in self.__pydantic_extra__ if k not in known]:
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type="extra_forbidden", loc=(k,), input=self.__pydantic_extra__[k]) for k in unknown])

    def section(self, name: str) -> BaseModel:
        return self.__pydantic_extra__[name]
