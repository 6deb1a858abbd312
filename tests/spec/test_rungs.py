"""race.spec.rungs: the racing schedule sized by the grid and the cap, its worst-case cost written
out as arithmetic, the step floor, and what it says when nothing fits."""

import pytest

from race.spec.rungs import RungSchedule, ScheduleError, choose_schedule, geometric_rungs, keep_counts

T = 2e12


def test_keep_counts_halve_to_a_last_rung_that_still_races():
    assert keep_counts(2) == (2,)
    assert keep_counts(4) == (4, 2)
    assert keep_counts(12) == (12, 5, 2)  # ceil(log 6 / log 3) = 2 cuts, 12 (1/6)^(1/2) = 4.9 -> 5
    assert keep_counts(24) == (24, 10, 5, 2)
    assert keep_counts(12, keep_last=3, eta=2) == (12, 6, 3)
    for k in range(2, 60):
        c = keep_counts(k)
        assert c[0] == k and c[-1] == 2 and all(a > b for a, b in zip(c, c[1:]))


def test_the_worst_case_cost_is_the_arithmetic_of_the_docstring():
    b = (T / 64, T / 8, T / 3)
    s = RungSchedule(T, b, (12, 5, 2), first_seeds=2, later_seeds=1, min_budgets={"big": T / 20}, cap=None)
    # rung 0: 2 seeds x (11 allocations at b0 + "big" at its floor's T/20, above b0); rung 1: the 5 largest
    # extensions (b1 - b0 for the others beats T/8 - T/20 for "big"), one seed; rung 2: 2 x (b2 - b1)
    pilots = 2 * (11 * b[0] + T / 20) + 5 * (b[1] - b[0]) + 2 * (b[2] - b[1])
    c = s.cost()
    assert c["pilots"] == pytest.approx(pilots, rel=1e-12)
    assert c["unreused"] == pytest.approx(pilots - b[2], rel=1e-12)
    assert s.ladder("big") == [T / 20, b[1], b[2]] and s.ladder("other") == list(b)
    assert s.unmeasured() == []
    assert RungSchedule(T, b, (12, 5, 2), min_budgets={"huge": T / 2}).budget_of("huge", 0) == b[2]


@pytest.mark.parametrize("k,seeds", [(4, 2), (12, 1), (12, 2), (24, 1), (24, 2)])
def test_the_chosen_first_rung_is_the_largest_that_fits_the_cap(k, seeds):
    s = choose_schedule(k, T, cap=0.9, first_seeds=seeds)
    assert s.keep == keep_counts(k) and s.budgets[-1] == pytest.approx(T / 3, rel=1e-12)
    assert s.cost()["unreused_T"] <= 0.9 * (1 + 1e-9)
    # a first rung 2% larger (the rungs between scaling with it) would break the cap
    bigger = RungSchedule(T, geometric_rungs(s.budgets[0] * 1.02, T / 3, len(s.keep)), s.keep, seeds, 1, {}, 0.9)
    assert not bigger.fits()
    assert all(a < b for a, b in zip(s.budgets, s.budgets[1:]))


def test_more_allocations_or_seeds_push_the_first_rung_down():
    first = {(k, s): choose_schedule(k, T, first_seeds=s).budgets[0] for k in (4, 12, 24) for s in (1, 2)}
    assert first[(4, 2)] > first[(12, 2)] > first[(24, 2)]
    assert all(first[(k, 1)] > first[(k, 2)] for k in (4, 12, 24))


def test_the_floor_raises_the_cost_and_can_make_it_infeasible():
    plain = choose_schedule(12, T, first_seeds=1)
    floored = choose_schedule(12, T, first_seeds=1, min_budgets={f"a{i}": T / 20 for i in range(4)})
    assert floored.budgets[0] < plain.budgets[0]  # four allocations run to T/20 first: less room below
    assert floored.fits() and floored.budget_of("a0", 0) == T / 20 > floored.budgets[0]
    with pytest.raises(ScheduleError, match="would not reach their step floor"):
        choose_schedule(4, T, min_budgets={"huge": T})


def test_a_grid_too_large_for_the_cap_says_what_would_fit():
    with pytest.raises(ScheduleError) as e:
        choose_schedule(24, T, cap=0.4, first_seeds=2, least_budget=T / 200)
    msg = str(e.value)
    assert "24 allocations do not fit" in msg and "Raise the cap" in msg and "cut the grid to <=" in msg
    assert "1 seed on the first rung" in msg
