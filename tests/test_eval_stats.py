"""rufus_eval/stats.py against values worked by hand."""

from __future__ import annotations

import math

import pytest

from rufus_eval.stats import beyond_noise, mean_and_se, paired_difference, pass_at_k, pass_at_ks


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(16, 0, 1) == 0.0 and pass_at_k(16, 16, 1) == 1.0
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)  # pass@1 = c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6)  # 1 - C(7,4)/C(10,4) = 1 - 35/210
    assert pass_at_k(4, 1, 4) == 1.0  # every sample drawn: the passing one among them
    assert pass_at_k(8, 6, 3) == 1.0  # n - c = 2 < k: no draw of 3 misses
    with pytest.raises(ValueError, match="1 <= k <= n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_mean_and_se_is_the_sample_sd_over_root_n():
    mean, se = mean_and_se([1.0, 0.0, 1.0, 0.0])
    assert mean == 0.5 and se == pytest.approx(math.sqrt(1 / 3) / 2)  # SD (ddof 1) = sqrt(1/3)
    mean, se = mean_and_se([0.7])
    assert mean == 0.7 and math.isnan(se)
    with pytest.raises(ValueError):
        mean_and_se([])


def test_paired_difference_is_the_mean_and_se_of_per_document_differences():
    # differences 0.3, 0, 0.3: mean 0.2, squared deviations 0.01 + 0.04 + 0.01 = 0.06, SD sqrt(0.03), SE 0.1
    mean, se = paired_difference([0.2, 0.4, 0.6], [0.5, 0.4, 0.9])
    assert mean == pytest.approx(0.2) and se == pytest.approx(0.1)
    assert beyond_noise(0.19, 0.1) is False and beyond_noise(-0.21, 0.1) is True  # two standard errors either way
    # the same gain on every document: no spread, a difference beyond any noise
    mean, se = paired_difference([0.0, 0.5, 0.25], [0.25, 0.75, 0.5])
    assert mean == pytest.approx(0.25) and se == pytest.approx(0.0, abs=1e-12) and beyond_noise(mean, se)
    # unpaired, these runs' standard errors (about 0.14 each) would hide the gain: paired, it shows
    a, b = [0.0, 0.5, 1.0, 0.5], [0.1, 0.6, 1.0, 0.7]
    delta, se = paired_difference(a, b)
    assert delta == pytest.approx(0.1) and se == pytest.approx(0.04082, abs=1e-5) and beyond_noise(delta, se)
    assert mean_and_se(a)[1] > 0.2
    with pytest.raises(ValueError, match="3 documents against 2"):
        paired_difference([1.0, 0.0, 1.0], [1.0, 0.0])
    assert beyond_noise(0.5, math.nan) is None


def test_pass_at_ks_doubles_up_to_the_samples_taken():
    assert pass_at_ks(1) == [1] and pass_at_ks(4) == [1, 2, 4] and pass_at_ks(6) == [1, 2, 4, 6]
    assert pass_at_ks(16) == [1, 2, 4, 8, 16]
