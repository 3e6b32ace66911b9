"""CPU model of the mma_sync core's lane mapping (kernels_cuda/hytopk_mma_sync.cuh):
ldmatrix row addresses, m16n8k16 fragment layouts (PTX ISA), the per-lane head
sums and the xor butterfly, transcribed index for index from warp_scores() and
owned_pair(). Checks that every key's score lands in the lanes the epilogues
read, with the value of the plain formula. Runs without a GPU."""
from __future__ import annotations

import numpy as np
import pytest


def ldmatrix_x4(smem, addr_of_lane):
    """addr_of_lane(l) -> (row, col) of the 8 contiguous bf16 lane l points at.
    Returns regs[lane][m] = (2 values): matrix m, row lane>>2, cols 2*(lane&3)+{0,1}."""
    mats = [[smem[r, c:c + 8] for r, c in (addr_of_lane(m * 8 + i) for i in range(8))] for m in range(4)]
    return [[mats[m][lane >> 2][2 * (lane & 3):2 * (lane & 3) + 2] for m in range(4)] for lane in range(32)]


def mma16816(c, a, b0, b1):
    """c[lane] (4 floats) += A @ B with A, B assembled from the lanes' fragments (PTX layout)."""
    A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane in range(32):
        g, tig = lane >> 2, lane & 3
        for i, (r, k) in enumerate([(g, 2 * tig), (g + 8, 2 * tig), (g, 2 * tig + 8), (g + 8, 2 * tig + 8)]):
            A[r, k:k + 2] = a[lane][i]
        B[2 * tig:2 * tig + 2, g] = b0[lane]
        B[2 * tig + 8:2 * tig + 10, g] = b1[lane]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "a fragment element was never loaded"
    Dm = A @ B
    for lane in range(32):
        g, tig = lane >> 2, lane & 3
        c[lane] += [Dm[g, 2 * tig], Dm[g, 2 * tig + 1], Dm[g + 8, 2 * tig], Dm[g + 8, 2 * tig + 1]]


def warp_scores_model(H, D, NT, qrows, krows, w):
    """The header's warp_scores(): qrows [H, D], krows [NT*8, D] in 'smem' with stride D + 8."""
    RS, MT = D + 8, H // 16
    sq = np.zeros((H, RS)); sq[:, :D] = qrows
    sk = np.zeros((NT * 8, RS)); sk[:, :D] = krows
    c = [[[np.zeros(4) for _ in range(32)] for _ in range(NT)] for _ in range(MT)]
    for ks in range(D // 16):
        a = [ldmatrix_x4(sq, lambda l, mt=mt: (mt * 16 + (l & 7) + ((l >> 3) & 1) * 8, ks * 16 + (l >> 4) * 8))
             for mt in range(MT)]
        for np_ in range(NT // 2):
            b = ldmatrix_x4(sk, lambda l: (np_ * 16 + (l >> 4) * 8 + (l & 7), ks * 16 + ((l >> 3) & 1) * 8))
            for mt in range(MT):
                mma16816(c[mt][2 * np_], a[mt], [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
                mma16816(c[mt][2 * np_ + 1], a[mt], [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])
    p = np.zeros((32, NT, 2))
    for nt in range(NT):
        for j in range(2):
            s = np.zeros(32)
            for lane in range(32):
                g = lane >> 2
                for mt in range(MT):
                    s[lane] += w[16 * mt + g] * max(c[mt][nt][lane][j], 0.0)
                    s[lane] += w[16 * mt + g + 8] * max(c[mt][nt][lane][2 + j], 0.0)
            for off in (4, 8, 16):
                s = s + s[np.arange(32) ^ off]
            p[:, nt, j] = s
    return p


@pytest.mark.parametrize("H,D,NT", [(16, 16, 16), (32, 32, 8), (64, 32, 4), (64, 16, 2)])
def test_lane_mapping_gives_every_key_its_score(H, D, NT):
    rng = np.random.default_rng(H * 1000 + D + NT)
    q = rng.integers(-3, 4, (H, D)).astype(np.float64)
    keys = rng.integers(-3, 4, (NT * 8, D)).astype(np.float64)
    w = rng.integers(-2, 3, H).astype(np.float64)
    want = (np.maximum(keys @ q.T, 0) * w).sum(axis=1)           # [keys]
    p = warp_scores_model(H, D, NT, q, keys, w)
    for lane in range(32):                                       # every lane of a tig holds the same scores
        tig = lane & 3
        for nt in range(NT):
            np.testing.assert_array_equal(p[lane, nt], want[nt * 8 + 2 * tig:nt * 8 + 2 * tig + 2])
    owned = []                                                   # owned_pair(): each key exactly once
    for r in range((NT + 7) // 8):
        for lane in range(32):
            nt = 8 * r + (lane >> 2)
            if nt < NT:
                owned += [nt * 8 + 2 * (lane & 3), nt * 8 + 2 * (lane & 3) + 1]
    assert sorted(owned) == list(range(NT * 8))
