"""``race --version`` (the installed package's metadata, else the source tree's version), and
the project's LICENSE and CITATION.cff agree with pyproject.toml (issue 49)."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import yaml
from typer.testing import CliRunner

import race
from race.cli.app import app, package_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_race_version_prints_the_installed_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"race {metadata.version('race-rl')}"


def test_race_version_falls_back_to_the_source_tree(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert package_version() == race.__version__ == PROJECT["version"]
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"race {race.__version__}"


def test_the_license_is_the_apache_2_0_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text


def test_the_citation_file_cites_the_software_and_the_seed_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["authors"]
    assert cff["version"] == PROJECT["version"] and cff["license"] == PROJECT["license"]
    paper = cff["references"][0]
    assert paper["title"].startswith("Where Should RL Post-Training Compute Go?")
    assert paper["year"] == 2026 and paper["month"] == 7 and paper["authors"]
    assert "arXiv:2607.13389" in [i["value"] for i in paper["identifiers"]]
