"""The row-group rules the decoding caches of Unified VLP and TDEN share (`vlhub.modeling.modeling_utils`): a reorder
within the groups of `copies` consecutive rows (an image's beams) and a selection of whole groups keep the rows
grouped; anything else does not."""

import pytest
import torch

from vlhub.modeling.modeling_utils import reorders_within_groups, rows_of_groups, selects_whole_groups


@pytest.mark.parametrize(
    "indices, copies, expected",
    [
        ([1, 0, 2, 2], 2, True),
        ([0, 1, 2, 3], 2, True),
        ([2, 3, 0, 1], 2, False),  # across images
        ([0, 0, 0, 3], 2, False),
        ([0, 1, 2], 1, False),  # no groups to keep
    ],
)
def test_reorders_within_groups(indices, copies, expected):
    assert reorders_within_groups(torch.tensor(indices), copies) is expected


@pytest.mark.parametrize(
    "indices, copies, expected",
    [
        ([2, 3, 4, 5], 2, True),
        ([0, 1, 2, 6, 7, 8], 3, True),
        ([], 2, True),
        ([3, 2], 2, False),  # a whole group, reordered
        ([1, 2], 2, False),  # parts of two groups
        ([1, 2, 3], 3, False),  # a group shifted by one row
        ([0, 1, 2], 2, False),  # not a whole number of groups
        ([0, 1], 1, False),
    ],
)
def test_selects_whole_groups(indices, copies, expected):
    assert selects_whole_groups(torch.tensor(indices, dtype=torch.long), copies) is expected


def test_rows_of_groups_is_a_selection_of_whole_groups():
    rows = rows_of_groups(torch.tensor([False, True, True]), 2)
    assert rows.tolist() == [2, 3, 4, 5] and selects_whole_groups(rows, 2)
    assert rows_of_groups(torch.tensor([True, False]), 3).tolist() == [0, 1, 2]
