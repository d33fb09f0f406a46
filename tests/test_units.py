import pytest

from harness.units import parse_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("7GiB", 7 * 2**30),
        ("512MiB", 512 * 2**20),
        ("24GB", 24 * 10**9),
        ("1024", 1024),
        (4096, 4096),
        ("1.5 KiB", 1536),
        ("2e3", 2000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["7 giga", "GiB", "-1", -5, True, "1.2.3MiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="kv_budget"):
        parse_size(bad, "kv_budget")


@pytest.mark.parametrize("negative", [-1, "-1GiB", " -512MiB", "-0.5e9"])
def test_parse_size_says_negative_sizes_are_not_allowed(negative):
    with pytest.raises(ValueError, match=r"kv_budget=.* must be >= 0 bytes"):
        parse_size(negative, "kv_budget")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1e400GiB", "inf"])
def test_a_size_that_is_no_finite_number_names_its_field(value):
    """Issue 39: kv_budget=nan said 'cannot convert float NaN to integer' (no field), kv_budget=inf
    was a traceback. Mutation caught: the finiteness check dropped."""
    with pytest.raises(ValueError, match=r"^kv_budget=.* is not a size"):
        parse_size(value, "kv_budget")
