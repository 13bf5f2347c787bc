"""benchmarks/batch_cap.py's two sides: two caps of the model's batch, or two labelled sets of settings, where a name
that is not one of the service's settings is refused rather than left for the service to ignore."""

import json

import pytest

from tests.benchmark_scripts import load_benchmark


def test_two_caps_are_two_batch_limits_of_the_model():
    sides = load_benchmark("batch_cap").sides_to_compare("16,32", None, "rsa-etth1-h24")
    assert list(sides) == ["cap 16", "cap 32"]
    assert [json.loads(side["RTSERVE_MODEL_MAX_BATCH_SIZES"]) for side in sides.values()] == [
        {"rsa-etth1-h24": 16}, {"rsa-etth1-h24": 32}]


def test_two_sets_of_settings_are_taken_by_label_their_values_as_the_environment_holds_them():
    sides = load_benchmark("batch_cap").sides_to_compare("16,32", {"default": {}, "no company wait": {
        "RTSERVE_MAX_QUEUE_DELAY_MS": 0}}, "rsa-etth1-h24")
    assert sides == {"default": {}, "no company wait": {"RTSERVE_MAX_QUEUE_DELAY_MS": "0"}}


@pytest.mark.parametrize("settings, says", [
    ({"a": {}, "b": {"RTSERVE_MAX_QUEUE_DELAY": "0"}}, "not a setting of the service: RTSERVE_MAX_QUEUE_DELAY"),
    ({"a": {}}, "two labelled sets"),
    ({"a": {}, "b": "RTSERVE_MAX_QUEUE_DELAY_MS=0"}, "two labelled sets"),
])
def test_a_comparison_that_would_compare_nothing_is_refused(settings, says):
    with pytest.raises(SystemExit, match=says):
        load_benchmark("batch_cap").sides_to_compare("16,32", settings, "rsa-etth1-h24")


def test_caps_that_are_not_two_are_refused():
    with pytest.raises(SystemExit, match="two batch sizes"):
        load_benchmark("batch_cap").sides_to_compare("16", None, "rsa-etth1-h24")
