"""benchmarks/known_worlds.py in a reduced form: a few worlds per generator, one timed keep-all race."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def kw(load_script):
    return load_script("benchmarks/known_worlds.py")


@pytest.mark.parametrize("gen", ["tune", "test", "steps"])
def test_summary_row(kw, gen):
    from race.analysis.synthetic_worlds import make_world, world_stats

    seeds = range(900000, 900008)
    r = kw.summary_row(gen, 12, seeds, timed=1)
    stats = [world_stats(make_world(gen, s, 12)) for s in seeds]
    assert r["worlds"] == 8 and r["timed"] == 1 and r["race_s"] > 0 and r["draw_s"] > 0
    assert r["null"] == pytest.approx(np.mean([s["null"] for s in stats]))
    learning = [s for s in stats if not s["null"]]
    assert r["ill"] == pytest.approx(sum(s["ill"] for s in learning) / (12 * len(learning)))
    assert list(r["steps"]) == list(np.median([s["steps"] for s in stats], axis=0))
    assert all(a <= b for a, b in zip(r["steps"], r["steps"][1:]))
    if gen != "steps":  # nominal steps: the costliest allocation's target run takes 1,000
        assert list(r["steps"]) == [31, 125, 333, 1000]
