"""``depthattn.devices``: which accelerator a device setting names."""

from __future__ import annotations

import pytest
import torch

from depthattn.devices import accelerator_name


@pytest.mark.parametrize("available", [False, True])
def test_the_accelerator_of_a_device_setting(monkeypatch, available):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"GPU {d if isinstance(d, int) else d.index or 0}")
    want = {"cpu": None, "mps": None, "auto": "GPU 0", "cuda": "GPU 0", "cuda:1": "GPU 1"}
    assert {d: accelerator_name(d) for d in want} == {d: (n if available else None) for d, n in want.items()}
