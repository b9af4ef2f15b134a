"""AddRows: rows of a position table from a call's first position, added (hand values);
sinusoidal_table against hand values and transformers' formulas."""

import numpy as np
import pytest

from iron_spec.operators import AddRows, sinusoidal_table

X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
TABLE = np.array([[0.0, 0.0], [10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], np.float32)


def test_add_rows_hand(run_kernel):
    # start 1: rows 1 and 2 of the table (OPT's offset folded into the start).
    expected = [[11.0, 22.0], [33.0, 44.0]]
    np.testing.assert_array_equal(AddRows().reference(X, TABLE, start=1), expected)
    np.testing.assert_array_equal(run_kernel(AddRows(), X, TABLE, start=1), expected)
    np.testing.assert_array_equal(run_kernel(AddRows(), X[:1], TABLE, start=3), [[51.0, 62.0]])


def test_sinusoidal_table_hand():
    # Width 4, h = 2 rates 10000 ** (-j / 2): 1 and 0.01; row p = [sin p, sin .01p, cos p, cos .01p].
    t = sinusoidal_table(3, 4)
    assert t.dtype == np.float32 and t.shape == (3, 4)
    np.testing.assert_allclose(t[0], [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(t[2], [np.sin(2.0), np.sin(0.02), np.cos(2.0), np.cos(0.02)],
                               rtol=1e-7)
    # denominator h - 1 = 1: rates 1 and 1e-4; a zeroed row.
    t = sinusoidal_table(3, 4, denominator=1, zero_row=1)
    np.testing.assert_array_equal(t[1], 0.0)
    np.testing.assert_allclose(t[2], [np.sin(2.0), np.sin(2e-4), np.cos(2.0), np.cos(2e-4)],
                               rtol=1e-7)


def _ctrl_positional_encoding(position, d):
    # transformers' modeling_ctrl.positional_encoding, transcribed in float64.
    pos, i = np.arange(position)[:, None], np.arange(d)[None, :]
    angle = pos * (1 / np.power(10000, (2 * (i // 2)) / d))
    return np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=-1)


def _xglm_get_embedding(n, d, padding_idx):
    # transformers' XGLMSinusoidalPositionalEmbedding.get_embedding, transcribed in float64.
    half = d // 2
    emb = np.exp(np.arange(half) * -(np.log(10000) / (half - 1)))
    emb = np.arange(n)[:, None] * emb[None, :]
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=1)
    emb[padding_idx] = 0
    return emb


def _xlm_create_sinusoidal_embeddings(n_pos, dim):
    # transformers' modeling_xlm.create_sinusoidal_embeddings, transcribed in float64.
    enc = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
                    for pos in range(n_pos)])
    out = np.empty_like(enc)
    out[:, 0::2], out[:, 1::2] = np.sin(enc[:, 0::2]), np.cos(enc[:, 1::2])
    return out


def test_sinusoidal_table_interleaved_hand():
    # Width 4, rates 1 and 0.01, sines in the even columns: [sin p, cos p, sin .01p, cos .01p].
    t = sinusoidal_table(3, 4, interleaved=True)
    np.testing.assert_allclose(t[0], [0.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(t[2], [np.sin(2.0), np.cos(2.0), np.sin(0.02), np.cos(0.02)],
                               rtol=1e-7)


def test_sinusoidal_table_is_xlms_interleaved_not_halves():
    want = _xlm_create_sinusoidal_embeddings(40, 32)
    np.testing.assert_allclose(sinusoidal_table(40, 32, interleaved=True), want, atol=2e-7)
    # The halves layout (CTRL's) holds the same values in other columns.
    assert np.abs(sinusoidal_table(40, 32) - want).max() > 0.5


def test_sinusoidal_table_is_ctrls_and_xglms():
    np.testing.assert_allclose(sinusoidal_table(256, 64), _ctrl_positional_encoding(256, 64),
                               atol=2e-7)
    np.testing.assert_allclose(sinusoidal_table(130, 64, denominator=31, zero_row=5),
                               _xglm_get_embedding(130, 64, 5), atol=2e-7)


@pytest.mark.parametrize("args,match", [((4, 3), "even width"), ((0, 4), "at least 1"),
                                        ((4, 4, 10000.0, 0.0), "denominator"),
                                        ((4, 4, 10000.0, None, 4), "outside")])
def test_sinusoidal_table_refuses(args, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_table(*args)
