"""``log_to``: W&B online when logged in and offline otherwise, the project from the run
file, and grid cells honour it as ``race train`` does (wandb itself is not installed here:
a stand-in module records what RACE asks of it)."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types

import pytest

from race.engines.sinks import check_installed, wandb_mode, wandb_project


def test_wandb_mode_without_wandb_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k" * 40}) == "online"
    assert wandb_mode({"WANDB_API_KEY": " "}) == "offline"
    for mode, want in (("online", "online"), ("offline", "offline"), ("disabled", "disabled"), ("dryrun", "offline")):
        assert wandb_mode({"WANDB_MODE": mode, "WANDB_API_KEY": "k"}) == want
    with pytest.raises(RuntimeError, match=r"log_to: wandb needs the wandb package.*race-rl\[logging\]"):
        check_installed(["wandb"])


def _fake_wandb(monkeypatch, api_key):
    wb = types.ModuleType("wandb")
    wb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wb.api = types.SimpleNamespace(api_key=api_key)
    wb.runs = []

    class Run:
        def __init__(self, **kw):
            self.kw, self.logged, self.finished = kw, [], False

        def log(self, row, step=None):
            self.logged.append((step, row))

        def finish(self):
            self.finished = True

    def init(**kw):
        wb.runs.append(Run(**kw))
        return wb.runs[-1]

    wb.init = init
    monkeypatch.setitem(sys.modules, "wandb", wb)
    return wb


def test_wandb_mode_reads_the_stored_login(monkeypatch):
    _fake_wandb(monkeypatch, api_key="k" * 40)
    assert wandb_mode({}) == "online"
    _fake_wandb(monkeypatch, api_key=None)
    assert wandb_mode({}) == "offline"
    assert wandb_project("mine", {"WANDB_PROJECT": "env"}) == "mine"
    assert wandb_project(None, {"WANDB_PROJECT": "env"}) == "env"
    assert wandb_project(None, {}) == "race"


def test_grid_cells_log_to_wandb(monkeypatch, tmp_path):
    """A grid cell (the default cell function, in process) streams its metrics rows to W&B:
    online when logged in, into the run file's project."""
    import race.engines as engines
    from race.grid.cell import execute_cell
    from race.spec.grid import DEFAULT_CELL_FN

    class Engine:  # a stand-in engine: two metrics rows, then run.json
        name = "builtin"

        def __init__(self, cfg, run_dir, progress):
            self.run_dir, self.progress = run_dir, progress

        def run(self):
            for step in (1, 2) if self.progress else ():
                self.progress({"step": step, "flops": 10 * step, "budget": 100, "reward_mean": 0.5})
            out = {"status": "complete"}
            (self.run_dir / "run.json").write_text(json.dumps(out))
            return out

    monkeypatch.setitem(engines.ENGINES, "builtin", Engine)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    wb = _fake_wandb(monkeypatch, api_key="k" * 40)
    spec = {"name": "cell-a", "budget_flops": 100.0, "log_to": ["wandb"], "wandb_project": "my-study"}
    res = execute_cell(DEFAULT_CELL_FN, spec, str(tmp_path / "a"))
    assert res["ok"], res.get("error")
    (run,) = wb.runs
    assert run.kw["project"] == "my-study" and run.kw["mode"] == "online" and run.kw["name"] == "cell-a"
    assert [s for s, _ in run.logged] == [1, 2] and run.logged[1][1]["train/flops"] == 20 and run.finished
    # without log_to nothing is opened; a logged-out user gets an offline run
    assert execute_cell(DEFAULT_CELL_FN, {"budget_flops": 100.0}, str(tmp_path / "b"))["ok"] and len(wb.runs) == 1
    wb.api.api_key = None
    assert execute_cell(DEFAULT_CELL_FN, spec, str(tmp_path / "c"))["ok"]
    assert wb.runs[-1].kw["mode"] == "offline" and wb.runs[-1].kw["project"] == "my-study"


def test_wandb_mode_reads_the_netrc_login_without_importing_wandb(monkeypatch, tmp_path):
    """``wandb login`` writes the key to ~/.netrc: that alone means online, wandb not imported."""
    from race.engines.sinks import netrc_has_wandb_key

    monkeypatch.setitem(sys.modules, "wandb", None)  # importing wandb would fail
    rc = tmp_path / "netrc"
    rc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    rc.chmod(0o600)
    assert netrc_has_wandb_key({"NETRC": str(rc)}) and wandb_mode({"NETRC": str(rc)}) == "online"
    # HOME's .netrc is read when NETRC is not set
    (tmp_path / ".netrc").write_text(rc.read_text())
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode({"HOME": str(tmp_path)}) == "online"
    # a key for another host (a private W&B server is logged in elsewhere) is not a login here
    assert wandb_mode({"NETRC": str(rc), "WANDB_BASE_URL": "https://wandb.example.org"}) == "offline"
    rc.write_text("machine wandb.example.org\n  login user\n  password k\n")
    assert wandb_mode({"NETRC": str(rc), "WANDB_BASE_URL": "https://wandb.example.org"}) == "online"
    # no file, an unreadable file, an explicit WANDB_MODE
    assert wandb_mode({"NETRC": str(tmp_path / "none")}) == "offline"
    rc.write_text("machine api.wandb.ai login\n")
    assert not netrc_has_wandb_key({"NETRC": str(rc)})
    assert wandb_mode({"NETRC": str(tmp_path / ".netrc"), "WANDB_MODE": "offline"}) == "offline"
