"""One YAML config for every stage, validated up front with errors that name the key.

Every problem found is reported at once, one line each, as ``key.path: what is wrong (how to fix)``,
e.g. ``sources[2].path: file not found: /data/metamath.jsonl``. Relative paths are resolved
against the directory of the config file. ``servers``, ``model``, ``sampling`` and the ``generate``
section belong to the generate stage, and only its settings (``datagen.gen.settings``) judge them; they
pass through here untouched (``check-config`` runs both).
See ``datagen.example.yml`` next to the package for a documented example.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

from datagen.util import did_you_mean

DATA_EXTENSIONS = (".jsonl", ".json", ".parquet")


class ConfigError(ValueError):
    """The config is unusable; ``errors`` holds one ``key.path: message`` line per problem."""

    def __init__(self, errors: Any) -> None:
        self.errors: List[str] = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("invalid datagen config:\n  " + "\n  ".join(self.errors))


@dataclass
class SourceSpec:
    name: str
    adapter: str
    files: List[str] = field(default_factory=list)
    hub: Optional[Dict[str, Any]] = None
    category: Optional[str] = None
    count: Optional[int] = None
    weight: float = 1.0
    limit: Optional[int] = None
    languages: List[str] = field(default_factory=lambda: ["en"])


@dataclass
class ExistingSpec:
    files: List[str]
    category_field: Optional[str] = "category"
    category_map: Dict[str, str] = field(default_factory=dict)
    default_category: Optional[str] = None
    messages_field: Optional[str] = None


@dataclass
class PrepareOptions:
    min_prompt_chars: int = 2
    max_prompt_chars: int = 32000


@dataclass
class TokenizeOptions:
    shard_rows: int = 50000
    batch_size: int = 256
    supervise: str = "all"  # all assistant turns, or only the last (the generated one)
    prompt_check: str = "warn"  # warn | drop | fail when the rendered prompt's ids != the server's prompt_token_ids
    prompt_check_tolerance: int = 0


@dataclass
class MergeOptions:
    allow_downsample: bool = False
    shard_rows: int = 50000


@dataclass
class Config:
    path: str
    work_dir: str
    tokenizer: Optional[str]
    existing: Optional[ExistingSpec]
    target_total: int
    target_mix: Dict[str, float]
    sources: List[SourceSpec]
    max_length: int
    seed: int
    prepare: PrepareOptions
    tokenize: TokenizeOptions
    merge: MergeOptions
    raw: Dict[str, Any]


TOP_KEYS = {
    "work_dir", "model", "tokenizer", "existing_dataset", "target_total", "target_mix", "sources",
    "servers", "sampling", "max_length", "seed", "generate", "prepare", "tokenize", "merge", "report",
}
SOURCE_KEYS = {"name", "adapter", "path", "hub", "category", "count", "weight", "limit", "languages"}
HUB_KEYS = {"repo", "config", "split", "revision", "data_files"}
EXISTING_KEYS = {"path", "category_field", "category_map", "default_category", "messages_field"}


class _Checker:
    def __init__(self, base_dir: str, check_inputs: bool = True) -> None:
        self.errors: List[str] = []
        self.base_dir = base_dir
        self.check_inputs = check_inputs

    def err(self, key: str, msg: str) -> None:
        self.errors.append(f"{key}: {msg}")

    def mapping(self, key: str, value: Any, known: Optional[set] = None) -> Dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.err(key, f"must be a mapping, got {type(value).__name__}")
            return {}
        if known is not None:
            for k in sorted(set(value) - known, key=str):
                self.err(f"{key}.{k}" if key else str(k),
                         f"unknown key{did_you_mean(k, known)} (known: {', '.join(sorted(known))})")
        return value

    def int_(self, key: str, value: Any, default: Optional[int], minimum: int = 0) -> Optional[int]:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(key, f"must be an integer, got {value!r}")
            return default
        if value < minimum:
            self.err(key, f"must be >= {minimum}, got {value}")
            return default
        return value

    def str_(self, key: str, value: Any, default: Optional[str] = None, required: bool = False) -> Optional[str]:
        if value is None or value == "":
            if required:
                self.err(key, "is required")
            return default
        if not isinstance(value, str):
            self.err(key, f"must be a string, got {value!r}")
            return default
        return value

    def choice(self, key: str, value: Any, default: str, choices: tuple) -> str:
        if value is None:
            return default
        if value not in choices:
            self.err(key, f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def bool_(self, key: str, value: Any, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.err(key, f"must be true or false, got {value!r}")
            return default
        return value

    def path(self, p: str) -> str:
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(p)))

    def data_files(self, key: str, value: Any) -> List[str]:
        """A file, a directory (its data files, sorted), a glob, or a list of those; each must be readable."""
        items = value if isinstance(value, list) else [value]
        files: List[str] = []
        if not self.check_inputs:  # stages after prepare do not read the sources
            return files
        for i, item in enumerate(items):
            k = f"{key}[{i}]" if isinstance(value, list) else key
            if not isinstance(item, str) or not item:
                self.err(k, f"must be a path string, got {item!r}")
                continue
            p = self.path(item)
            if any(c in item for c in "*?["):
                found = sorted(f for f in glob.glob(p) if f.endswith(DATA_EXTENSIONS))
                if not found:
                    self.err(k, f"no .jsonl/.json/.parquet file matches {p}")
                files.extend(found)
            elif os.path.isdir(p):
                found = sorted(
                    os.path.join(root, f) for root, _dirs, names in os.walk(p) for f in names if f.endswith(DATA_EXTENSIONS)
                )
                if not found:
                    self.err(k, f"directory holds no .jsonl/.json/.parquet file: {p}")
                files.extend(found)
            elif not os.path.exists(p):
                self.err(k, f"file not found: {p}")
            elif not os.access(p, os.R_OK):
                self.err(k, f"file not readable (permissions): {p}")
            elif not p.endswith(DATA_EXTENSIONS):
                self.err(k, f"unsupported file type (use .jsonl, .json or .parquet): {p}")
            else:
                files.append(p)
        for f in files:
            if not os.access(f, os.R_OK):
                self.err(key, f"file not readable (permissions): {f}")
        return files


def _check_sources(c: _Checker, value: Any, mix: Dict[str, float]) -> List[SourceSpec]:
    from datagen.adapters import ADAPTERS

    if not isinstance(value, list) or not value:
        c.err("sources", "must be a non-empty list of sources (name, adapter, path or hub)")
        return []
    specs: List[SourceSpec] = []
    names: set = set()
    for i, raw in enumerate(value):
        key = f"sources[{i}]"
        if not isinstance(raw, dict):
            c.err(key, f"must be a mapping, got {type(raw).__name__}")
            continue
        c.mapping(key, raw, SOURCE_KEYS)
        adapter = c.choice(f"{key}.adapter", raw.get("adapter"), "", tuple(sorted(ADAPTERS)))
        if raw.get("adapter") is None:
            c.err(f"{key}.adapter", f"is required (one of {', '.join(sorted(ADAPTERS))})")
        name = c.str_(f"{key}.name", raw.get("name"), default=adapter or f"source{i}")
        if name in names:
            c.err(f"{key}.name", f"duplicate source name {name!r}: names must be unique (they go into every id)")
        names.add(name)
        has_path, has_hub = raw.get("path") is not None, raw.get("hub") is not None
        if has_path == has_hub:
            c.err(key, "set exactly one of path (local .jsonl/.json/.parquet) or hub (repo + revision)")
        files = c.data_files(f"{key}.path", raw["path"]) if has_path else []
        hub = None
        if has_hub:
            hub = c.mapping(f"{key}.hub", raw["hub"], HUB_KEYS)
            c.str_(f"{key}.hub.repo", hub.get("repo"), required=True)
            if hub.get("revision") is None or hub.get("revision") == "":
                c.err(f"{key}.hub.revision", "is required: pin a commit sha so reruns read the same data")
            elif not isinstance(hub["revision"], str):
                c.err(f"{key}.hub.revision", f"must be a string, got {hub['revision']!r} (quote the sha in YAML)")
        category = c.str_(f"{key}.category", raw.get("category"))
        if category is not None and mix and category not in mix:
            c.err(f"{key}.category", f"{category!r} is not in target_mix{did_you_mean(category, mix)} "
                                     f"({', '.join(sorted(mix))})")
        if adapter and category is None and ADAPTERS[adapter].needs_category:
            c.err(f"{key}.category", f"is required for adapter {adapter} (one of {', '.join(sorted(mix))})")
        elif adapter and category is None and mix:
            fixed = ADAPTERS[adapter].default_category
            if fixed is not None and fixed not in mix:
                c.err(f"{key}.category", f"adapter {adapter} files rows under {fixed!r}, which is not in "
                      f"target_mix{did_you_mean(fixed, mix)} ({', '.join(sorted(mix))}); set category or add it "
                      f"to target_mix")
        weight = raw.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            c.err(f"{key}.weight", f"must be a number > 0, got {weight!r}")
            weight = 1.0
        langs = raw.get("languages", ["en"])
        if not isinstance(langs, list) or not all(isinstance(x, str) for x in langs):
            c.err(f"{key}.languages", f"must be a list of language codes like [en], got {langs!r}")
            langs = ["en"]
        specs.append(SourceSpec(
            name=name or f"source{i}", adapter=adapter, files=files, hub=hub, category=category,
            count=c.int_(f"{key}.count", raw.get("count"), None), weight=float(weight),
            limit=c.int_(f"{key}.limit", raw.get("limit"), None, minimum=1), languages=[x.lower() for x in langs],
        ))
    return specs


def _check_mix(c: _Checker, value: Any) -> Dict[str, float]:
    if not isinstance(value, dict) or not value:
        c.err("target_mix", "must be a mapping of category to fraction, e.g. {coding: 0.45, math: 0.2, ...}")
        return {}
    mix: Dict[str, float] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            c.err(f"target_mix.{k}", f"must be a fraction between 0 and 1, got {v!r}")
            continue
        mix[str(k)] = float(v)
    total = sum(mix.values())
    if mix and abs(total - 1.0) > 0.01:
        c.err("target_mix", f"fractions sum to {total:.4g}; they must sum to 1")
    return mix


def validate(raw: Any, path: str = "<config>", check_inputs: bool = True) -> Config:
    """Check every key; ``check_inputs=False`` skips the existence checks of source and existing files."""
    base_dir = os.path.dirname(os.path.abspath(path)) if path != "<config>" else os.getcwd()
    c = _Checker(base_dir, check_inputs)
    if not isinstance(raw, dict):
        raise ConfigError(f"(top level): must be a mapping of keys, got {type(raw).__name__}")
    c.mapping("", raw, TOP_KEYS)
    work_dir = c.str_("work_dir", raw.get("work_dir"), required=True)
    tokenizer = c.str_("tokenizer", raw.get("tokenizer"))
    if tokenizer and (tokenizer.startswith((".", "/", "~")) or os.path.isabs(tokenizer)):
        tokenizer = c.path(tokenizer)
        if c.check_inputs and not os.path.isdir(tokenizer):
            c.err("tokenizer", f"directory not found: {tokenizer} (a local tokenizer dir, or a Hub model id)")
    mix = _check_mix(c, raw.get("target_mix"))
    existing = None
    if raw.get("existing_dataset") is not None:
        e = raw["existing_dataset"]
        if isinstance(e, str):
            e = {"path": e}
        e = c.mapping("existing_dataset", e, EXISTING_KEYS)
        if e:
            if e.get("path") is None:
                c.err("existing_dataset.path", "is required")
            cmap = c.mapping("existing_dataset.category_map", e.get("category_map"))
            existing = ExistingSpec(
                files=c.data_files("existing_dataset.path", e["path"]) if e.get("path") is not None else [],
                category_field=c.str_("existing_dataset.category_field", e.get("category_field"), "category"),
                category_map={str(k): str(v) for k, v in cmap.items()},
                default_category=c.str_("existing_dataset.default_category", e.get("default_category")),
                messages_field=c.str_("existing_dataset.messages_field", e.get("messages_field")),
            )
    target_total = c.int_("target_total", raw.get("target_total"), 0, minimum=1)
    if raw.get("target_total") is None:
        c.err("target_total", "is required (number of new prompts to prepare, e.g. 200000)")
    sources = _check_sources(c, raw.get("sources"), mix)
    max_length = c.int_("max_length", raw.get("max_length"), 4096, minimum=16)
    seed = c.int_("seed", raw.get("seed"), 0)

    p = c.mapping("prepare", raw.get("prepare"), {"min_prompt_chars", "max_prompt_chars"})
    prepare = PrepareOptions(
        min_prompt_chars=c.int_("prepare.min_prompt_chars", p.get("min_prompt_chars"), 2),
        max_prompt_chars=c.int_("prepare.max_prompt_chars", p.get("max_prompt_chars"), 32000, minimum=1),
    )
    t = c.mapping("tokenize", raw.get("tokenize"),
                  {"shard_rows", "batch_size", "supervise", "prompt_check", "prompt_check_tolerance"})
    tok = TokenizeOptions(
        shard_rows=c.int_("tokenize.shard_rows", t.get("shard_rows"), 50000, minimum=1),
        batch_size=c.int_("tokenize.batch_size", t.get("batch_size"), 256, minimum=1),
        supervise=c.choice("tokenize.supervise", t.get("supervise"), "all", ("all", "last")),
        prompt_check=c.choice("tokenize.prompt_check", t.get("prompt_check"), "warn", ("warn", "drop", "fail")),
        prompt_check_tolerance=c.int_("tokenize.prompt_check_tolerance", t.get("prompt_check_tolerance"), 0),
    )
    m = c.mapping("merge", raw.get("merge"), {"allow_downsample", "shard_rows"})
    merge = MergeOptions(
        allow_downsample=c.bool_("merge.allow_downsample", m.get("allow_downsample"), False),
        shard_rows=c.int_("merge.shard_rows", m.get("shard_rows"), 50000, minimum=1),
    )
    c.mapping("report", raw.get("report"), set())
    if c.errors:
        raise ConfigError(c.errors)
    return Config(
        path=os.path.abspath(path) if path != "<config>" else path,
        work_dir=c.path(work_dir or "."), tokenizer=tokenizer, existing=existing,
        target_total=target_total or 0, target_mix=mix, sources=sources,
        max_length=max_length or 4096, seed=seed or 0, prepare=prepare, tokenize=tok, merge=merge, raw=raw,
    )


def load_raw(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of keys, got {type(raw).__name__}")
    return raw


def load_config(path: str, check_inputs: bool = True) -> Config:
    return validate(load_raw(path), path, check_inputs)


def declared_inputs(raw: Dict[str, Any], base_dir: str) -> List[Tuple[str, str]]:
    """``(key, absolute path)`` of every local input the config names, without opening any of them.

    The sources' ``path`` entries (files, directories or globs), ``existing_dataset.path`` and a local
    ``tokenizer`` directory, resolved against ``base_dir`` (where the config lives on the node). Lets a
    controller check a config whose inputs live on another machine.
    """
    def resolve(p: str) -> str:
        return os.path.normpath(os.path.join(base_dir, os.path.expanduser(p)))

    def listed(key: str, value: Any) -> List[Tuple[str, str]]:
        items = value if isinstance(value, list) else [value]
        return [(f"{key}[{i}]" if isinstance(value, list) else key, resolve(item))
                for i, item in enumerate(items) if isinstance(item, str) and item]

    out: List[Tuple[str, str]] = []
    sources = raw.get("sources")
    for i, src in enumerate(sources if isinstance(sources, list) else []):
        if isinstance(src, dict) and src.get("path") is not None:
            out += listed(f"sources[{i}].path", src["path"])
    existing = raw.get("existing_dataset")
    if isinstance(existing, str):
        existing = {"path": existing}
    if isinstance(existing, dict) and existing.get("path") is not None:
        out += listed("existing_dataset.path", existing["path"])
    tokenizer = raw.get("tokenizer")
    if isinstance(tokenizer, str) and (tokenizer.startswith((".", "/", "~")) or os.path.isabs(tokenizer)):
        out.append(("tokenizer", resolve(tokenizer)))
    return out
