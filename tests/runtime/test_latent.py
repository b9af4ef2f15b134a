"""Multi-head latent attention's row regrouping (runtime.latent), by hand."""

from iron_spec.runtime.latent import keys_then_values, rope_first


def test_rope_first_moves_each_heads_last_columns_to_its_front():
    # 2 heads of [nope 3 | rope 2]: head 0 stores rows 0..4, head 1 rows 5..9.
    assert rope_first(2, 3, 2).tolist() == [3, 4, 0, 1, 2, 8, 9, 5, 6, 7]


def test_keys_then_values_groups_every_heads_keys_then_values():
    # 2 heads of [k_nope 2 | v 3]: head 0 stores rows 0..4, head 1 rows 5..9.
    assert keys_then_values(2, 2, 3).tolist() == [0, 1, 5, 6, 2, 3, 4, 7, 8, 9]
