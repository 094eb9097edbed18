"""gpudra.jsoncopy: deep copies of API objects."""

from __future__ import annotations

import datetime

from gpudra.jsoncopy import copy_json


def test_copies_are_deep_and_equal_and_other_values_are_deep_copied() -> None:
    when = datetime.datetime(2026, 1, 1)
    obj = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"list": [1, 2.5, True, None, {"k": ["v"]}]},
           "odd": {"when": when, "set": {1, 2}}}
    dup = copy_json(obj)
    assert dup == obj
    dup["metadata"]["labels"]["x"] = "2"
    dup["spec"]["list"][4]["k"].append("w")
    dup["odd"]["set"].add(3)
    assert obj["metadata"]["labels"] == {"x": "1"} and obj["spec"]["list"][4] == {"k": ["v"]}
    assert obj["odd"]["set"] == {1, 2} and dup["odd"]["when"] == when
