"""The hf engine's low-rank hooks (producers/hf.py `_LowRankRows`) on a two-layer stand-in model, against each
row's term written out by hand, W x + (x B_m) A_m^T for the row's member m: with every member's rows, with the
members' counts made unequal by finished rows, and after whole members have left (their factors are no longer
read). The real default model's members are checked against their weights written in full in
tests/producers/test_hf_lowrank.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf engine needs torch (make test installs torch==2.13.0)")

from producers.hf import _LowRankRows  # noqa: E402

MEMBERS, ROWS_EACH, RANK, WIDTH = 3, 2, 2, 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4, bias=False), torch.nn.Linear(4, 3, bias=False)).double()


def _factors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (A, B) stacked over the members: A (M, out, r), B (M, in, r)."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for name, p in model.named_parameters():
        rows, cols = p.shape
        a = torch.randn((MEMBERS, rows, RANK), generator=gen, dtype=torch.float64)
        b = torch.randn((MEMBERS, cols, RANK), generator=gen, dtype=torch.float64)
        out[name] = (a, b)
    return out


def _by_hand(model, factors, x: torch.Tensor, members: list[int]) -> torch.Tensor:
    """Each row through the layers with its member's weights written in full: W + A_m B_m^T."""
    rows = []
    for row, m in zip(x, members, strict=True):
        h = row
        for name, layer in zip(("0.weight", "1.weight"), model, strict=True):
            a, b = factors[name]
            h = h @ (layer.weight + a[m] @ b[m].T).T
        rows.append(h)
    return torch.stack(rows)


def test_each_row_gets_its_members_term_as_rows_and_whole_members_leave():
    model, x = _model(), torch.randn((MEMBERS * ROWS_EACH, 1, WIDTH), dtype=torch.float64)
    factors = _factors(model)
    member = [m for m in range(MEMBERS) for _ in range(ROWS_EACH)]  # member-major: 0 0 1 1 2 2
    with _LowRankRows(model, factors, len(member)) as hooks, torch.no_grad():
        assert torch.allclose(model(x)[:, 0], _by_hand(model, factors, x[:, 0], member), atol=1e-12)
        for keep in ([0, 1, 2, 4, 5], [0, 2, 3], [1, 2], [1]):  # rows end: 0 0 1 2 2, then 0 1 2, 1 2, then 2
            idx = torch.tensor(keep)
            hooks.select(idx)
            x, member = x[idx], [member[i] for i in keep]
            got = model(x)[:, 0]
            assert torch.allclose(got, _by_hand(model, factors, x[:, 0], member), atol=1e-12), (keep, member)
        assert member == [2] and hooks.present.tolist() == [2]  # members 0 and 1 have left
        assert hooks.leaves == 2 and hooks.slot is None  # left twice (0, then 1); one row: no grid
