"""What scripts written for Accelerate observe of the nested-data operations (issue 17's findings of the peer
suite; each test asserts what such a script observes)."""

from __future__ import annotations

import pytest
import torch


def test_concatenate_returns_a_single_batch_of_any_type_as_it_is():
    from drivetrain.utils import concatenate

    assert concatenate(["text"]) == "text"
    assert concatenate([[torch.ones(1), "label"]])[1] == "label"
    with pytest.raises(TypeError, match="can only concatenate tensors, got str"):
        concatenate(["a", "b"])


def test_recursively_apply_error_on_other_type_uses_accelerates_wording():
    from drivetrain.utils import recursively_apply

    with pytest.raises(TypeError) as error:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(error.value) == (
        "Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts of objects that are "
        "valid for `is_torch_tensor` should be passed."
    )
