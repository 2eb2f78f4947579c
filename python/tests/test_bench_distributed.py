"""python/bench/distributed.py's table over draws of tokens: each row's total is the mean over the draws
of the slowest rank's time (not the slowest rank's mean), set against the one-GPU layer's mean over
the same draws; the decode target's verdict follows from those means, with the experts the busiest
rank and the one-GPU layer touch. Synthetic records, no ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed: the distributed bench is not checked")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import distributed as bench  # noqa: E402


def record(layout, rank, draw, total, world=2, tokens=1, **extra):
    return {"model": "gpt-oss-20b", "layout": layout, "world": world, "rank": rank, "tokens": tokens,
            "draw": draw, "captured": True, "total_us": total, **extra}


# Rank 1 is the slowest in draw 0, rank 0 in draw 1: the slowest ranks' mean (57.5) is above
# either rank's mean (52.5).
RECORDS = [
    record("one-gpu", 0, 0, 30.0, world=1), record("one-gpu", 0, 1, 34.0, world=1),
    record("ep-ll", 0, 0, 50.0, comm_us=18.0, mxmoe_us=30.0, error=1e-3, experts=2, one_gpu_experts=4),
    record("ep-ll", 1, 0, 60.0, comm_us=18.0, mxmoe_us=40.0, error=2e-3, experts=6, one_gpu_experts=4),
    record("ep-ll", 0, 1, 55.0, comm_us=17.0, mxmoe_us=36.0, error=1e-3, experts=5, one_gpu_experts=3),
    record("ep-ll", 1, 1, 45.0, comm_us=17.0, mxmoe_us=26.0, error=1e-3, experts=3, one_gpu_experts=3),
]


def test_rows_are_means_over_draws_of_the_slowest_rank():
    one_gpu, rows, slowest = bench.group_rows(RECORDS)
    assert one_gpu == {("gpt-oss-20b", 1): pytest.approx(32.0)}
    assert sorted(slowest[("gpt-oss-20b", "ep-ll", 2, 1)]) == [55.0, 60.0]
    assert sorted(slowest[("gpt-oss-20b", "one-gpu", 1, 1)]) == [30.0, 34.0]
    ranks = rows[("gpt-oss-20b", "ep-ll", 2, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["total_us"] for r in ranks] == [pytest.approx(52.5), pytest.approx(52.5)]
    assert [r["comm_us"] for r in ranks] == [pytest.approx(17.5), pytest.approx(17.5)]
    assert ranks[1]["error"] == pytest.approx(2e-3)


def test_table_and_target_use_the_means(capsys):
    bench.print_table(RECORDS)
    bench.print_summary(RECORDS, 4096)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if " ep-ll " in line)
    assert " 57.5 55.0-60.0 " in row  # the mean of the slowest ranks, and their range
    # over = 57.5 - 32.0 = 25.5 us against the slowest rank's mean collectives, 17.5 us
    # the busiest rank's experts per draw: 6 and 5; the one-GPU layer's: 4 and 3
    assert ("decode target, ep-ll T = 1: over 25.5 us, bare collectives 17.5 us, ratio 1.46 (at most 1.1): missed; "
            "the busiest rank touches 5.50 experts a draw, the one-GPU layer 3.50") in out


def test_records_without_expert_counts_give_no_clause(capsys):
    bench.print_summary([{k: v for k, v in r.items() if "experts" not in k} for r in RECORDS], 4096)
    out = capsys.readouterr().out
    assert "ratio 1.46 (at most 1.1): missed\n" in out
