"""Read-ahead on a thread pool yields exactly the batches of a serial read, in order."""

from __future__ import annotations

import numpy as np
import pytest

from mismatch_cli.io import ReadOptions, discover_inputs, iter_batches
from mismatch_cli.io.parallel import plan
from mismatch_cli.synth import SynthSpec, write_synthetic_dump


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parallel")
    for i, turns in enumerate((1, 3, 1)):
        write_synthetic_dump(folder / f"part{i}.parquet",
                             SynthSpec(tokens=20_000, turns=turns, seed=i, row_group_tokens=3_000, steps=2))
    write_synthetic_dump(folder / "part3.safetensors", SynthSpec(tokens=5_000, seed=9, format="safetensors"))
    return discover_inputs([str(folder)])


def test_plan_cuts_parquet_into_row_group_runs(dumps) -> None:
    assert len(plan(dumps)) == len(dumps)  # small files: one item each
    items = plan(dumps, item_bytes=10_000)
    assert [i.path for i in items] == sorted(i.path for i in items)
    assert any(i.row_groups is not None and len(i.row_groups) >= 1 for i in items)
    assert any(i.format == "safetensors" and i.row_groups is None for i in items)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_parallel_batches_equal_serial(dumps, workers: int) -> None:
    options = ReadOptions(chunk_rows=64)
    serial = list(iter_batches(dumps, options))
    parallel = list(iter_batches(dumps, options, workers=workers))
    assert len(serial) == len(parallel) > 10
    for a, b in zip(serial, parallel, strict=True):
        assert (a.source, a.first_row) == (b.source, b.first_row)
        for name in ("old_log_probs", "rollout_log_probs", "response_mask", "offsets"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert (a.steps is None) == (b.steps is None)
        if a.steps is not None:
            np.testing.assert_array_equal(a.steps, b.steps)


def test_a_reader_error_surfaces_in_order(dumps, tmp_path) -> None:
    from mismatch_cli.errors import InputError
    from mismatch_cli.io import InputFile

    bad = tmp_path / "zz_corrupt.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    files = [*dumps, InputFile(str(bad), "parquet", bad.stat().st_size)]
    seen = []
    with pytest.raises(InputError):
        for batch in iter_batches(files, ReadOptions(), workers=2):
            seen.append(batch.source)
    assert set(seen) == {f.path for f in dumps}


def test_the_last_tenth_of_a_large_input_is_cut_finer(dumps, monkeypatch: pytest.MonkeyPatch) -> None:
    # Processes sharing the items finish together: the last tenth of the bytes goes in items a quarter the size, the
    # same whatever the number of processes; every row group once, in input order.
    import mismatch_cli.io.parallel as parallel
    from mismatch_cli.io.parquet import row_group_bytes

    parquet = [f for f in dumps if f.format == "parquet"]
    sizes = {f.path: row_group_bytes(f.path) for f in parquet}
    total = sum(sum(groups) for groups in sizes.values())
    item = total // 6
    coarse = plan(parquet, item_bytes=item)
    monkeypatch.setattr(parallel, "TAIL_FROM_BYTES", total)
    fine = plan(parquet, item_bytes=item)
    assert len(fine) > len(coarse)
    assert [(i.path, g) for i in fine for g in i.row_groups] == [(i.path, g) for i in coarse for g in i.row_groups]
    seen, cut = 0, False
    for work in fine:
        held = sum(sizes[work.path][g] for g in work.row_groups)
        if seen >= 0.9 * total:  # an item wholly in the tail holds about a quarter item's bytes
            cut = True
            assert held - sizes[work.path][work.row_groups[-1]] < item // 4
        seen += held
    assert cut
    monkeypatch.setattr(parallel, "TAIL_FROM_BYTES", total + 1)  # below the threshold: as before
    assert plan(parquet, item_bytes=item) == coarse
