"""The host bf16 helper (runs everywhere): round-to-nearest-even float32 -> bf16 bits."""
import numpy as np
import pytest

from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits


def test_matches_torch_rounding():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(50000) * 10.0 ** rng.integers(-30, 30, 50000)).astype(np.float32)
    x[:8] = [np.inf, -np.inf, 3.4028235e38, -3.4028235e38, 0.0, -0.0, 1e-45, -1e-40]
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(float32_to_bf16_bits(x), want)


def test_ties_go_to_even_and_nan_stays_nan():
    # 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: even mantissa (1.0) wins;
    # 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: even (1.015625) wins
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, np.nan, -np.nan], np.float32)
    b = float32_to_bf16_bits(x)
    assert b[0] == 0x3F80 and b[1] == 0x3F82
    assert np.isnan(bf16_bits_to_float32(b[2:])).all()


def test_small_integers_are_exact():
    x = np.arange(-256, 257, dtype=np.float32)
    np.testing.assert_array_equal(bf16_bits_to_float32(float32_to_bf16_bits(x)), x)


def test_bad_dtype_names_argument():
    with pytest.raises(TypeError, match="argument 'x'"):
        float32_to_bf16_bits(np.zeros(3, np.float64))
