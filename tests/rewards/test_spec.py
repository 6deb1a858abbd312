"""Reward spec grammar, aggregation, and clear errors."""

from __future__ import annotations

import math

import pytest

from race.rewards import make_reward
from race.rewards.terms import AGGREGATIONS, aggregate
from race.spec.reward import parse_learned


def test_defaults_and_terms():
    s = parse_learned("prm", "prm-s")
    assert (s.target, s.agg, s.weights) == ("prm-s", "min", {"rm": 1.0})
    s = parse_learned("prm", "prm-s:mean")
    assert (s.target, s.agg, s.weights) == ("prm-s", "mean", {"rm": 1.0})
    s = parse_learned("prm", "prm-s:min+outcome")
    assert s.agg == "min" and s.weights == {"rm": 0.5, "outcome": 0.5}
    s = parse_learned("prm", "prm-xs:prod+3*outcome")
    assert s.agg == "prod" and s.weights == {"rm": 0.25, "outcome": 0.75}
    s = parse_learned("orm", "orm-s:rm+partial+format")
    assert s.agg == "rm" and all(math.isclose(w, 1 / 3) for w in s.weights.values())
    s = parse_learned("prm", "/models/my:prm:last")  # a path with ':' keeps its colon
    assert s.target == "/models/my:prm" and s.agg == "last"
    s = parse_learned("prm", "/models/my:prm")
    assert s.target == "/models/my:prm" and s.agg == "min"


@pytest.mark.parametrize("bad, match", [
    ("prm-s:min+mean", "only one model term"),
    ("prm-s:min+bogus", "unknown term 'bogus'"),
    ("prm-s:x*outcome+min", "not a number"),
    ("prm-s:-1*min", "finite number >= 0"),
    ("prm-s:0*min", "sum to 0"),
])
def test_bad_terms(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_learned("prm", bad)


def test_aggregations():
    xs = [0.9, 0.5, 0.8]
    assert aggregate(xs, "min") == 0.5 and aggregate(xs, "last") == 0.8
    assert math.isclose(aggregate(xs, "mean"), 2.2 / 3) and math.isclose(aggregate(xs, "prod"), 0.36)
    assert all(aggregate([], a) == 0.0 for a in AGGREGATIONS)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(xs, "max")


def test_unknown_rm_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown reward model 'prm-huge'.*prm-xs, prm-s"):
        make_reward("prm:prm-huge", device="cpu")
    with pytest.raises(ValueError, match="is an ORM, not a PRM"):
        make_reward("prm:orm-s", device="cpu")
    with pytest.raises(ValueError, match="needs a model"):
        make_reward("orm:", device="cpu")


def test_missing_rm_says_run_race_rm_build(tmp_path):
    from race.rewards.rm_recipes import rm_path

    with pytest.raises(FileNotFoundError, match="race rm build --names prm-s"):
        rm_path("prm-s", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="race rm build"):  # the reward loads, never builds
        make_reward("prm:prm-s", device="cpu", cache_dir=tmp_path)