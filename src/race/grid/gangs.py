"""Gangs in a grid (``gang: true``): which cells train together, and the worker side.

Composition is a pure function of the grid spec: the runnable cells (the plan's, in grid
order) are grouped by ``race.engines.gang.gang_key`` (same base model, task, maximum
lengths and load settings; LoRA without dropout on the built-in engine), and each group
is cut, in grid order, into consecutive gangs of at most ``gang_size`` members. Which
cells are finished, which are selected (``only=``) or how many workers run does not
change it, so a rerun or a resumed study forms the same gangs (a member's float rounding
depends on the rows it shares its passes with). A cell that cannot join a gang is a gang
of one and runs alone, as with ``gang: false``.

A gang is one task for a worker (``execute_gang``): its members' run directories are the
cells' own (``<study>/runs/<run_id>``), its checkpoint lives in
``<study>/gangs/<gang_id>``, and it returns one result per member, which the driver stores
exactly as it stores a cell's (the store does not know about gangs).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from race.spec.cells import Cell


def gang_units(cells: list[Cell], *, gang: bool, gang_size: int) -> list[list[Cell]]:
    """The grid's units of work: gangs of cells (module docstring), or one cell each
    when ``gang`` is off; in the order of each unit's first cell."""
    if not gang:
        return [[c] for c in cells]
    from race.engines.gang.members import gang_key

    groups: dict[str, list[Cell]] = {}
    units: list[list[Cell]] = []
    for c in cells:
        key = gang_key(c.config)
        if key is None:
            units.append([c])
            continue
        groups.setdefault(key, []).append(c)
    for group in groups.values():
        units.extend(units_of(group, gang_size))
    return sorted(units, key=lambda u: u[0].index)


def units_of(group: list[Cell], size: int) -> list[list[Cell]]:
    """``group`` cut into consecutive pieces of at most ``size``."""
    return [group[i:i + size] for i in range(0, len(group), size)]


def gang_id(unit: list[Cell]) -> str:
    """A stable id for a gang: a hash of its members' run ids, in order."""
    return hashlib.sha256(",".join(c.run_id for c in unit).encode()).hexdigest()[:12]


def execute_gang(cell_fn: str, specs: list[dict[str, Any]], run_dirs: list[str], gang_dir: str) -> dict[str, Any]:
    """Train one gang in this process; ``{"ok": True, "members": [cell results]}`` (each as
    ``execute_cell`` returns it) or ``{"ok": False, "error": ...}`` for the whole gang."""
    from race.grid.cell import quiet_transformers, collect_run_dir
    from race.grid.lock import run_dir_lock

    t0 = time.time()
    info = {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        from race.engines.gang import run_gang
        from race.spec.run import run_config_from_dict

        quiet_transformers()
        dirs = [Path(d) for d in run_dirs]
        members = []
        for spec, rd in zip(specs, dirs):
            rd.mkdir(parents=True, exist_ok=True)
            members.append((run_config_from_dict({**spec, "output_dir": str(rd)}, source=f"cell {rd.name}"), rd))
        with ExitStack() as stack:
            for rd in dirs:
                stack.enter_context(run_dir_lock(rd))
            outs = run_gang(members, Path(gang_dir))
            results = [collect_run_dir(rd, out) for rd, out in zip(dirs, outs)]
        wall = time.time() - t0
        return {"ok": True, "members": [{"ok": True, "result": r, "seconds": wall, **info} for r in results],
                "seconds": wall, **info}
    except BaseException as e:  # noqa: BLE001 - report everything, as execute_cell does
        if isinstance(e, SystemExit) and e.code == 0:
            raise
        return {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"[-6000:],
                "seconds": time.time() - t0, **info}


__all__ = ["execute_gang", "gang_id", "gang_units"]
