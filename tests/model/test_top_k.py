import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kroberta.model.top_k import exact_top_k, uses_groups


@pytest.mark.parametrize("width,k", [(10000, 5), (10007, 5), (1000, 1), (997, 3), (4000, 20)])
def test_equals_lax_top_k_values_and_indices(width, k):
    assert uses_groups(width, k)  # these cases take the grouped path
    x = jax.random.normal(jax.random.PRNGKey(width + k), (37, width))
    expected = jax.lax.top_k(x, k)
    got = jax.jit(lambda x: exact_top_k(x, k))(x)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[1].dtype == jnp.int32


def test_ties_go_to_the_lower_index_as_lax_top_k():
    # Values on a coarse grid: many exact ties, within and across groups.
    x = jnp.round(jax.random.normal(jax.random.PRNGKey(0), (64, 3001)) * 2) / 2
    got = exact_top_k(x, 6)
    np.testing.assert_array_equal(got[1], jax.lax.top_k(x, 6)[1])
    constant = jnp.zeros((2, 500))
    np.testing.assert_array_equal(exact_top_k(constant, 4)[1], [[0, 1, 2, 3]] * 2)


def test_winners_in_the_ragged_last_group_and_minus_infinity_elsewhere():
    width = 1003  # groups of 14: the last group holds 9
    x = jnp.full((3, width), -jnp.inf).at[:, -2:].set(jnp.array([1.0, 2.0]))
    x = x.at[1, 0].set(5.0)
    values, indices = exact_top_k(x, 3)
    np.testing.assert_array_equal(indices[0, :2], [width - 1, width - 2])
    np.testing.assert_array_equal(indices[1], [0, width - 1, width - 2])
    np.testing.assert_array_equal(values[1], [5.0, 2.0, 1.0])


def test_any_leading_shape_and_the_plain_path_for_large_k():
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 5, 800))
    for k in (2, 100):  # 100 is past the grouping threshold
        values, indices = exact_top_k(x, k)
        expected = jax.lax.top_k(x, k)
        assert values.shape == indices.shape == (4, 5, k)
        np.testing.assert_array_equal(indices, expected[1])
    assert not uses_groups(800, 100)
