"""The lab tests' wait for a warming lab (tooling/lab/settle.py): calm means two loads in a row under 3 per core,
steady a load under 10 per core that stopped falling, and the wait ends at its limit either way."""
from __future__ import annotations

from tooling.lab import settle


def test_calm_needs_the_last_two_loads_under_three_per_core():
    assert settle.is_calm([40.0, 5.0, 5.9], cores=2)
    assert not settle.is_calm([5.0, 6.0], cores=2)          # 6 is not under 3 x 2
    assert not settle.is_calm([5.0], cores=2)               # one sample is not two
    assert not settle.is_calm([1.0, 38.0], cores=2)


def test_steady_needs_a_minute_under_ten_per_core_without_falling_by_a_tenth():
    assert settle.is_steady([11.0, 9.0, 10.5, 9.8, 9.9], cores=2)
    assert settle.is_steady([15.2, 14.1, 15.0, 14.6, 14.8], cores=2)    # the landing CI of stop 44: 14.8 at 600 s
    assert not settle.is_steady([11.5, 10.0, 9.0, 8.0, 7.0], cores=2)   # still falling: 7 < 0.9 x 11.5
    assert not settle.is_steady([21.0, 19.0, 19.0, 19.0, 20.0], cores=2)  # 21 is not under 10 x 2
    assert not settle.is_steady([9.0, 9.0, 9.0, 9.0], cores=2)          # four samples are not a minute
    assert not settle.is_steady([40.0, 40.0, 40.0, 40.0, 40.0], cores=2)  # a plateau of the warm-up peak


def _run(loads: list[float], limit_s: float = 600.0):
    clock = [0.0]
    said: list[str] = []
    readings = iter(loads)

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    result = settle.wait_until_calm(limit_s=limit_s, interval_s=15.0, load=lambda: next(readings), cores=2,
                                    sleep=sleep, clock=lambda: clock[0], say=said.append)
    return result, said


def test_a_warming_lab_is_waited_for_until_it_calms_down():
    result, said = _run([38.0, 35.0, 30.0, 12.0, 5.5, 4.8, 99.0])
    assert result.calm and result.waited_s == 75.0 and result.load == 4.8
    assert said and "load 38.0 on 2 cores" in said[0], said
    assert "calm" in result.describe() and "75 s" in result.describe()


def test_a_lab_that_stays_busy_is_waited_for_only_until_the_limit():
    result, _ = _run([40.0] * 100, limit_s=60.0)
    assert not result.calm and result.waited_s == 60.0
    assert "still busy at the limit" in result.describe()


def test_a_lab_that_stays_busy_after_warming_up_is_waited_for_until_its_load_stops_falling():
    result, _ = _run([60.0, 45.0, 30.0, 20.0, 11.0, 10.0, 9.5, 9.4, 9.6, 9.3, 9.1])
    assert result.calm and result.waited_s == 135.0 and result.load == 9.3   # 9.3 >= 0.9 x 10
    assert "steady" in result.describe() and "calm" not in result.describe()
