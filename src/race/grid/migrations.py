"""The study store's schema, version by version (:data:`MIGRATIONS`: version -> SQL
statements); :func:`race.grid.store.migrate` applies the versions a file lacks. The text is
history: a migration never changes once shipped, so an old store migrates the same; a change
of schema is a new version at the end."""

from __future__ import annotations

#: the columns of ``runs`` from schema 3 on, in order (schema 3 copies them from schema 2's table)
_RUNS_V3 = ("run_id, study, position, spec_json, allocation_json, label, engine, model, num_generations, "
            "prompts_per_step, num_iterations, learning_rate, reward, lora_r, budget, seed, status, attempts, error, "
            "started_at, finished_at, wall_s, total_flops, steps, model_params, run_json, prefix_of, prefix_step")

#: Frozen: a migration's text never changes once shipped, so an old store migrates the same;
#: the status CHECKs below spell out schema 1's statuses (race.schema.STATUSES then) literally.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE studies (
             name TEXT PRIMARY KEY, spec_json TEXT NOT NULL,
             created_at REAL NOT NULL, updated_at REAL NOT NULL)""",
        """CREATE TABLE runs (
             run_id TEXT PRIMARY KEY, study TEXT NOT NULL, position INTEGER NOT NULL,
             spec_json TEXT NOT NULL, allocation_json TEXT NOT NULL, label TEXT NOT NULL,
             engine TEXT, model TEXT, num_generations INTEGER, prompts_per_step INTEGER,
             num_iterations INTEGER, learning_rate REAL, reward TEXT, lora_r INTEGER,
             budget REAL NOT NULL, seed INTEGER NOT NULL,
             status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'complete', 'failed', 'diverged')),
             attempts INTEGER NOT NULL DEFAULT 0, error TEXT,
             started_at REAL, finished_at REAL, wall_s REAL,
             total_flops REAL, steps INTEGER, model_params INTEGER,
             final_json TEXT, run_json TEXT)""",
        "CREATE INDEX runs_status ON runs(status)",
        """CREATE TABLE ledger (
             run_id TEXT NOT NULL REFERENCES runs(run_id), step INTEGER NOT NULL,
             phase TEXT NOT NULL, component TEXT NOT NULL, flops REAL NOT NULL,
             tokens INTEGER, seconds REAL, counted INTEGER NOT NULL)""",
        "CREATE INDEX ledger_run ON ledger(run_id, step)",
        """CREATE TABLE evals (
             run_id TEXT NOT NULL REFERENCES runs(run_id), step INTEGER NOT NULL,
             flops REAL NOT NULL, target TEXT NOT NULL, score REAL NOT NULL,
             n INTEGER, per_problem_json TEXT)""",
        "CREATE INDEX evals_run ON evals(run_id, step)",
        """CREATE TABLE train_metrics (
             run_id TEXT NOT NULL REFERENCES runs(run_id), step INTEGER NOT NULL,
             flops REAL NOT NULL, metrics_json TEXT NOT NULL)""",
        "CREATE INDEX train_run ON train_metrics(run_id, step)",
    ],
    2: [  # nested pilots: a run that is the prefix of another (read at a smaller budget) says so
        "ALTER TABLE runs ADD COLUMN prefix_of TEXT",
        "ALTER TABLE runs ADD COLUMN prefix_step INTEGER",
    ],
    3: [  # runs.final_json dropped: written, never read (run_json holds the run's "final" scores)
        """CREATE TABLE runs_v3 (
             run_id TEXT PRIMARY KEY, study TEXT NOT NULL, position INTEGER NOT NULL,
             spec_json TEXT NOT NULL, allocation_json TEXT NOT NULL, label TEXT NOT NULL,
             engine TEXT, model TEXT, num_generations INTEGER, prompts_per_step INTEGER,
             num_iterations INTEGER, learning_rate REAL, reward TEXT, lora_r INTEGER,
             budget REAL NOT NULL, seed INTEGER NOT NULL,
             status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'complete', 'failed', 'diverged')),
             attempts INTEGER NOT NULL DEFAULT 0, error TEXT,
             started_at REAL, finished_at REAL, wall_s REAL,
             total_flops REAL, steps INTEGER, model_params INTEGER,
             run_json TEXT, prefix_of TEXT, prefix_step INTEGER)""",
        f"INSERT INTO runs_v3 ({_RUNS_V3}) SELECT {_RUNS_V3} FROM runs",
        "DROP TABLE runs",
        "ALTER TABLE runs_v3 RENAME TO runs",
        "CREATE INDEX runs_status ON runs(status)",
    ],
    4: [  # racing: a cell that continues a shorter run of its trajectory says which; each rung's decision
        "ALTER TABLE runs ADD COLUMN extends TEXT",
        """CREATE TABLE rung_decisions (
             rung INTEGER PRIMARY KEY, budget REAL NOT NULL, decision_json TEXT NOT NULL,
             created_at REAL NOT NULL)""",
    ],
    5: [  # the allocation's name, fixed when the grid expanded (race.spec.cells.name_cells); NULL in older rows
        "ALTER TABLE runs ADD COLUMN allocation TEXT",
    ],
    6: [  # racing: the schedule the race runs (race.spec.rungs.RungSchedule), stored once when it starts
        """CREATE TABLE race_schedule (
             id INTEGER PRIMARY KEY CHECK (id = 0), schedule_json TEXT NOT NULL, created_at REAL NOT NULL)""",
    ],
}
SCHEMA_VERSION = max(MIGRATIONS)
